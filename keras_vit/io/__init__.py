"""Reading files that come from outside the program: image decoding in `keras_vit.io.images`."""

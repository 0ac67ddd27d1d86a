"""The out-of-domain studies: every score of `keras_vit.ood` on near and far shifts (`python -m
experiments.ood`), and how many images its statistics need (`python -m experiments.ood.sample_size`);
the images both score are in `shifts`."""

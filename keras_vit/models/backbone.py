"""A ViT as the backbone of a user's model: several blocks' feature grids from one layer
(`ViT.as_backbone`), for dense heads such as `keras_vit.layers.SimpleFeaturePyramid`.

Shapes: B batch, H x W image, C channels, (h, w) token grid, D width.
"""

import keras

from keras_vit.layers.transformer import select_blocks


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTFeatures(keras.layers.Layer):
    """A `ViT` as a layer: images (B, H, W, C) -> the grids (B, h, w, D) of the blocks `indices`,
    as `ViT.forward_intermediates(..., intermediates_only=True)`. The ViT is its sublayer, so its
    weights are the ViT's (shared, not copied) and go into the user's `.keras` file.

    Args:
        vit: a `ViT`.
        indices: as `forward_intermediates`: None, an int n (the last n blocks) or block indices.
        norm: apply the final LayerNorm to each grid.
    """

    def __init__(self, vit, indices=None, norm=False, **kwargs):
        super().__init__(**kwargs)
        if isinstance(vit, dict):
            vit = keras.saving.deserialize_keras_object(vit)
        if not hasattr(vit, "forward_intermediates"):  # not imported: vit.py's as_backbone builds on this module
            raise ValueError(f"ViTFeatures takes a keras_vit.ViT, got {type(vit).__name__}")
        select_blocks(indices, vit.num_layers)  # refuses bad indices here, not at the first call
        self.vit = vit
        self.indices = indices if indices is None or isinstance(indices, int) else list(indices)
        self.norm = bool(norm)

    def build(self, input_shape):
        self.vit._check_input_shape(input_shape)  # the ViT built itself when it was made

    def call(self, images, training=None):
        return self.vit.forward_intermediates(images, indices=self.indices, norm=self.norm,
                                              intermediates_only=True, training=training)

    def compute_output_shape(self, input_shape):
        h, w = self.vit.grid_size
        if self.vit.dynamic_image_size:
            h, w = (None if n is None else n // self.vit.token_pixels for n in input_shape[1:3])
        count = len(select_blocks(self.indices, self.vit.num_layers))
        return [(input_shape[0], h, w, self.vit.hidden_dim) for _ in range(count)]

    def get_config(self):
        return {**super().get_config(), "vit": keras.saving.serialize_keras_object(self.vit),
                "indices": self.indices, "norm": self.norm}


def as_backbone(vit, indices=None, norm=False):
    """A functional `keras.Model` from images to the list of grids of `ViTFeatures(vit, indices,
    norm)`; for one block, its grid alone, as Keras gives a single output (a list of one would be
    a list in a functional graph and a tensor when called eagerly). Its input is (None, None, C) for
    a model with `dynamic_image_size`, else the ViT's `image_size`."""
    size = (None, None) if vit.dynamic_image_size else vit.image_size
    images = keras.Input((*size, vit.num_channels), name="images")
    features = ViTFeatures(vit, indices=indices, norm=norm, name=f"{vit.name}_features")(images)
    return keras.Model(images, features[0] if len(features) == 1 else features, name=f"{vit.name}_backbone")

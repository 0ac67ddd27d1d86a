"""The simple feature pyramid of ViTDet (Li et al., 2022, "Exploring Plain Vision Transformer
Backbones for Object Detection", §3): multi-scale maps for a detector or segmenter, built from the
last block's grid alone.

Shapes: B batch, (h, w) token grid, D width, F the pyramid's channels.
"""

import keras

from keras_vit.layers.normalization import LayerNormalization

SCALES = (4.0, 2.0, 1.0, 0.5)


@keras.saving.register_keras_serializable(package="keras_vit")
class SimpleFeaturePyramid(keras.layers.Layer):
    """One grid (B, h, w, D) -> maps at `scales` times its resolution, each (B, s h, s w, F).

    As in ViTDet: scale 4 is two 2x2 stride-2 transposed convolutions (D / 2 then D / 4 channels,
    LayerNorm and GELU between), scale 2 one of them (D / 2), scale 1 the grid itself and scale 0.5
    a 2x2 max pooling; each level then gets a 1x1 convolution to F channels and a 3x3 one, each
    followed by a LayerNorm. With patch size 16, scales (4, 2, 1, 0.5) are strides 4, 8, 16 and 32.

    Args:
        channels: F.
        scales: a subset of (4.0, 2.0, 1.0, 0.5), in any order; the outputs follow it.
        layer_norm_epsilon: of every LayerNorm.
    """

    def __init__(self, channels=256, scales=SCALES, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise ValueError(f"channels={channels!r} is not allowed; use a positive integer")
        self.scales = tuple(float(s) for s in scales)
        if not self.scales or any(s not in SCALES for s in self.scales):
            raise ValueError(f"scales={scales!r} is not allowed; use a non-empty subset of {SCALES}")
        self.channels = channels
        self.layer_norm_epsilon = layer_norm_epsilon

    def build(self, input_shape):
        width = input_shape[-1]
        self.levels = []
        for index, scale in enumerate(self.scales):
            self.levels.append(self._resample(scale, width, f"level_{index}") + self._output(f"level_{index}"))
        for level in self.levels:
            shape = tuple(input_shape)
            for layer in level:
                layer.build(shape)
                shape = layer.compute_output_shape(shape)

    def _resample(self, scale, width, name):
        """The layers that take the grid to `scale` times its resolution."""
        def up(units, i):
            return keras.layers.Conv2DTranspose(units, 2, strides=2, dtype=self.dtype_policy, name=f"{name}_up_{i}")

        if scale == 4.0:
            return [up(width // 2, 0), self._norm(f"{name}_up_norm"),
                    keras.layers.Activation("gelu", dtype=self.dtype_policy), up(width // 4, 1)]
        if scale == 2.0:
            return [up(width // 2, 0)]
        if scale == 0.5:
            return [keras.layers.MaxPooling2D(2, dtype=self.dtype_policy, name=f"{name}_pool")]
        return []

    def _output(self, name):
        def conv(size, i):
            return keras.layers.Conv2D(self.channels, size, padding="same", use_bias=False,
                                       dtype=self.dtype_policy, name=f"{name}_conv_{i}")

        return [conv(1, 0), self._norm(f"{name}_norm_0"), conv(3, 1), self._norm(f"{name}_norm_1")]

    def _norm(self, name):
        return LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)

    def call(self, grid):
        outputs = []
        for level in self.levels:
            x = grid
            for layer in level:
                x = layer(x)  # (B, h, w, D) -> (B, s h, s w, F)
            outputs.append(x)
        return outputs

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape

        def size(n, s):
            return None if n is None else int(n * s)

        return [(b, size(h, s), size(w, s), self.channels) for s in self.scales]

    def get_config(self):
        return {**super().get_config(), "channels": self.channels, "scales": self.scales,
                "layer_norm_epsilon": self.layer_norm_epsilon}

"""The BiT ResNet stem of the paper's hybrid models (Dosovitskiy et al., 2021, §3.1 "Hybrid
Architecture"; Kolesnikov et al., 2020): ResNet-50 with weight-standardized convolutions and
GroupNorm, whose feature map becomes the token grid.

Shapes: B batch, H x W image, C channels, s the stem's stride (4 after the root block, x2 per
later stage), F the feature width (256, 512, 1024 or 2048 after stage 1-4).
"""

import keras
from keras import ops

STAGE_WIDTHS = (256, 512, 1024, 2048)  # ResNet-50's output width per stage; the bottleneck is 1/4
ROOT_WIDTH = 64
GROUPS = 32


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Conv2D):
    """A `Conv2D` whose kernel is standardized per output filter on every call (Qiao et al., 2019):
    W' = (W - mean) / sqrt(var + epsilon), mean and var over (kh, kw, C_in).

    Keras has no such layer; `convolution_op` is the hook `Conv2D.call` routes the kernel through.
    `epsilon` is 1e-8 as in timm's hybrid ViTs (Google's vit_jax divides by std + 1e-5, which
    differs by under 1e-3 relative on trained kernels).
    """

    def __init__(self, *args, epsilon=1e-8, **kwargs):
        super().__init__(*args, **kwargs)
        self.epsilon = float(epsilon)

    def convolution_op(self, inputs, kernel):
        w = ops.cast(kernel, "float32")  # standardize in float32 even under mixed precision
        mean = ops.mean(w, axis=(0, 1, 2), keepdims=True)  # (kh, kw, C_in, C_out) -> (1, 1, 1, C_out)
        var = ops.var(w, axis=(0, 1, 2), keepdims=True)
        w = (w - mean) / ops.sqrt(var + self.epsilon)
        return super().convolution_op(inputs, ops.cast(w, kernel.dtype))

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon)
        return config


def _conv(filters, kernel_size, strides, name, policy):
    return StdConv2D(filters, kernel_size, strides=strides, padding="same", use_bias=False, dtype=policy, name=name)


def _group_norm(name, policy):
    # epsilon 1e-5 as torch's GroupNorm in timm and as Google's pre-Linen ResNet.
    return keras.layers.GroupNormalization(GROUPS, epsilon=1e-5, dtype=policy, name=name)


@keras.saving.register_keras_serializable(package="keras_vit")
class BottleneckUnit(keras.layers.Layer):
    """A non-pre-activation bottleneck unit: 1x1, 3x3 (strided), 1x1 convolutions, each followed
    by GroupNorm (ReLU after the first two), plus a projected shortcut when the shape changes:

        y = ReLU(GN(conv3(ReLU(GN(conv2(ReLU(GN(conv1(x)))))))) + shortcut(x))

    Sublayers are named as in Google's checkpoints (conv1..3, gn1..3, conv_proj, gn_proj).

    Input: (B, H, W, C). Output: (B, H / strides, W / strides, filters).
    """

    def __init__(self, filters, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.filters = int(filters)
        self.strides = int(strides)

    def build(self, input_shape):
        mid, policy = self.filters // 4, self.dtype_policy
        self.conv1, self.gn1 = _conv(mid, 1, 1, "conv1", policy), _group_norm("gn1", policy)
        self.conv2, self.gn2 = _conv(mid, 3, self.strides, "conv2", policy), _group_norm("gn2", policy)
        self.conv3, self.gn3 = _conv(self.filters, 1, 1, "conv3", policy), _group_norm("gn3", policy)
        self.conv_proj = self.gn_proj = None
        if self.strides != 1 or input_shape[-1] != self.filters:
            self.conv_proj = _conv(self.filters, 1, self.strides, "conv_proj", policy)
            self.gn_proj = _group_norm("gn_proj", policy)
            self.conv_proj.build(input_shape)
            self.gn_proj.build(self.conv_proj.compute_output_shape(input_shape))
        shape = input_shape
        for conv, norm in ((self.conv1, self.gn1), (self.conv2, self.gn2), (self.conv3, self.gn3)):
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)

    def call(self, x):
        shortcut = x if self.conv_proj is None else self.gn_proj(self.conv_proj(x))
        y = ops.relu(self.gn1(self.conv1(x)))  # (B, H, W, F / 4)
        y = ops.relu(self.gn2(self.conv2(y)))  # (B, H / s, W / s, F / 4)
        y = self.gn3(self.conv3(y))  # (B, H / s, W / s, F)
        return ops.relu(y + shortcut)

    def compute_output_shape(self, input_shape):
        h, w = (None if d is None else -(-d // self.strides) for d in input_shape[1:3])
        return (input_shape[0], h, w, self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(filters=self.filters, strides=self.strides)
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetStem(keras.layers.Layer):
    """BiT ResNet-50 up to stage `len(layers)`, with `layers[i]` units in stage i + 1.

    Root: 7x7 stride-2 StdConv (64), GroupNorm, ReLU, 3x3 stride-2 max pool, all "SAME" padded
    (timm's `stem_type='same'`). Stage 1 keeps the resolution, each later stage halves it in its
    first unit. The paper's R50+ViT-B/16 uses (3, 4, 9): stage 4 removed and its units moved to
    stage 3, stride 16, width 1024; R50+ViT-L/32 uses the full (3, 4, 6, 3), stride 32, width 2048.

    Args:
        layers: units per stage, 1 to 4 stages.

    Input: (B, H, W, C). Output: (B, H / s, W / s, F) with s = `stride`, F = `output_width`.
    """

    def __init__(self, layers=(3, 4, 9), **kwargs):
        super().__init__(**kwargs)
        self.layers = tuple(int(n) for n in layers)
        if not 1 <= len(self.layers) <= len(STAGE_WIDTHS) or min(self.layers) < 1:
            raise ValueError(f"layers={layers!r} is not allowed; use 1 to 4 positive unit counts, e.g. (3, 4, 9)")
        policy = self.dtype_policy
        self.conv_root = _conv(ROOT_WIDTH, 7, 2, "conv_root", policy)
        self.gn_root = _group_norm("gn_root", policy)
        self.pool = keras.layers.MaxPooling2D(3, strides=2, padding="same", dtype=policy, name="pool")
        self.stages = [
            [BottleneckUnit(STAGE_WIDTHS[i], 2 if i and not j else 1, dtype=policy, name=f"block{i + 1}_unit{j + 1}")
             for j in range(n)]
            for i, n in enumerate(self.layers)
        ]

    @property
    def stride(self):
        return 4 * 2 ** (len(self.layers) - 1)

    @property
    def output_width(self):
        return STAGE_WIDTHS[len(self.layers) - 1]

    def build(self, input_shape):
        self.conv_root.build(input_shape)
        shape = self.conv_root.compute_output_shape(input_shape)
        self.gn_root.build(shape)
        shape = self.pool.compute_output_shape(shape)
        for stage in self.stages:
            for unit in stage:
                unit.build(shape)
                shape = unit.compute_output_shape(shape)

    def call(self, images):
        x = self.pool(ops.relu(self.gn_root(self.conv_root(images))))  # (B, H, W, C) -> (B, H / 4, W / 4, 64)
        for stage in self.stages:
            for unit in stage:
                x = unit(x)
        return x  # (B, H / s, W / s, F)

    def compute_output_shape(self, input_shape):
        h, w = (None if d is None else -(-d // self.stride) for d in input_shape[1:3])
        return (input_shape[0], h, w, self.output_width)

    def get_config(self):
        config = super().get_config()
        config.update(layers=self.layers)
        return config

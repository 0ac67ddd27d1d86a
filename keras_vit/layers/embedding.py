"""Patch embedding and class token (Dosovitskiy et al., 2021, §3.1, Eq. 1).

Shapes: B batch, H and W image height and width, C channels, P patch size, h = H / P and
w = W / P the token grid, N = h * w patch tokens, D model width.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbedding(keras.layers.Layer):
    """Cuts an image into P x P patches and projects each one to width D.

    Non-overlapping patches times a matrix E is a stride-P convolution with D filters of size
    P x P x C, which is how the official code implements it. Its kernel (P, P, C, D) is laid out
    as in Google's checkpoints.

    Args:
        hidden_dim: D, the token width.
        patch_size: P, or (P_h, P_w).
        use_bias: whether the projection has a bias.

    Input: (B, H, W, C) with H and W multiples of the patch size.
    Output: (B, N, D), patches in raster order (row by row).
    """

    def __init__(self, hidden_dim, patch_size, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = int(hidden_dim)
        self.patch_size = patch_size
        self.use_bias = use_bias
        self.conv = keras.layers.Conv2D(
            self.hidden_dim,
            kernel_size=patch_size,
            strides=patch_size,
            padding="valid",
            use_bias=use_bias,
            kernel_initializer="lecun_normal",
            dtype=self.dtype_policy,
            name="conv",
        )

    def build(self, input_shape):
        self.conv.build(input_shape)

    def grid_size(self, input_shape):
        """(h, w): the token grid for images of shape (B, H, W, C)."""
        ph, pw = _pair(self.patch_size)
        h, w = input_shape[1], input_shape[2]
        return (None if h is None else h // ph, None if w is None else w // pw)

    def call(self, images):
        x = self.conv(images)  # (B, H, W, C) -> (B, h, w, D)
        b, h, w, d = ops.shape(x)
        return ops.reshape(x, (b, h * w, d))  # (B, h, w, D) -> (B, N, D), raster order

    def project_patches(self, patches):
        """Patches already cut and flattened (P, P, C) row by row (`keras_vit.naflex`), (B, L, P * P * C)
        -> (B, L, D): the same product with E as `call`, the kernel (P, P, C, D) read as a
        (P * P * C, D) matrix (timm NaFlexVit's linear `embeds.proj`)."""
        kernel = ops.reshape(ops.cast(self.conv.kernel, self.compute_dtype), (-1, self.hidden_dim))  # -> (P P C, D)
        x = ops.matmul(ops.cast(patches, self.compute_dtype), kernel)  # (B, L, P P C) x (P P C, D) -> (B, L, D)
        return x + ops.cast(self.conv.bias, self.compute_dtype) if self.use_bias else x

    def compute_output_shape(self, input_shape):
        h, w = self.grid_size(input_shape)
        n = None if h is None or w is None else h * w
        return (input_shape[0], n, self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_dim=self.hidden_dim,
            patch_size=self.patch_size,
            use_bias=self.use_bias,
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepends the learned class token x_class to a token sequence (§3.1, as in BERT).

    Input: (B, N, D). Output: (B, 1 + N, D). Initialized to zeros, as in the official code.
    """

    def build(self, input_shape):
        self.token = self.add_weight(
            shape=(1, 1, input_shape[-1]), initializer="zeros", name="token"
        )

    def call(self, x):
        token = ops.cast(self.token, x.dtype)
        token = ops.broadcast_to(token, (ops.shape(x)[0], 1, ops.shape(x)[-1]))  # (B, 1, D)
        return ops.concatenate([token, x], axis=1)  # (B, 1 + N, D)

    def compute_output_shape(self, input_shape):
        n = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], n, input_shape[2])


@keras.saving.register_keras_serializable(package="keras_vit")
class RegisterTokens(keras.layers.Layer):
    """Prepends `num_tokens` learned register tokens (Darcet et al., 2024, "Vision Transformers
    Need Registers"): extra tokens that carry global computation instead of hijacking patch
    tokens. They are discarded at the output: pooling and attention maps skip them as prefix
    tokens.

    Input: (B, N, D). Output: (B, R + N, D). Initialized N(0, 0.02) like the position table.
    """

    def __init__(self, num_tokens, **kwargs):
        super().__init__(**kwargs)
        self.num_tokens = int(num_tokens)

    def build(self, input_shape):
        self.tokens = self.add_weight(
            shape=(1, self.num_tokens, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
            name="tokens",
        )

    def call(self, x):
        tokens = ops.cast(self.tokens, x.dtype)
        tokens = ops.broadcast_to(tokens, (ops.shape(x)[0], self.num_tokens, ops.shape(x)[-1]))  # (B, R, D)
        return ops.concatenate([tokens, x], axis=1)  # (B, R + N, D)

    def compute_output_shape(self, input_shape):
        n = None if input_shape[1] is None else input_shape[1] + self.num_tokens
        return (input_shape[0], n, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(num_tokens=self.num_tokens)
        return config


def _pair(value):
    """An int or a pair of ints as a (h, w) tuple."""
    if isinstance(value, int):
        return (value, value)
    return tuple(int(v) for v in value)

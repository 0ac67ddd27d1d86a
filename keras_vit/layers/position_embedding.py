"""Position embeddings: learned or fixed 2-D sin-cos (resampling to a new grid: `resample.py`).

Shapes: T = num_prefix_tokens + h * w tokens, D model width, (h, w) the token grid.
The paper adds E_pos in R^{(N+1) x D} to the tokens (§3.1, Eq. 1).
"""


import keras
import numpy as np
from keras import ops

POSITION_EMBEDDING_KINDS = ("learned", "sincos")


@keras.saving.register_keras_serializable(package="keras_vit")
class PositionEmbedding(keras.layers.Layer):
    """Adds a position embedding to a sequence of prefix tokens followed by an h x w patch grid.

    Args:
        grid_size: (h, w), the token grid in raster order.
        num_prefix_tokens: tokens before the grid (1 for a class token, 0 without).
        kind: "learned" (normal, std 0.02, as in the official code) or "sincos" (fixed 2-D
            sin-cos, big_vision's `posemb_sincos_2d`; prefix rows are zero, as big_vision adds
            the table before it prepends the class token).

    Input and output: (B, T, D).
    """

    def __init__(self, grid_size, num_prefix_tokens=1, kind="learned", **kwargs):
        super().__init__(**kwargs)
        if kind not in POSITION_EMBEDDING_KINDS:
            raise ValueError(
                f"kind={kind!r} is not a position embedding; use one of {POSITION_EMBEDDING_KINDS}"
            )
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.kind = kind

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def build(self, input_shape):
        width = input_shape[-1]
        if input_shape[1] is not None and input_shape[1] != self.num_tokens:
            raise ValueError(
                f"PositionEmbedding expects {self.num_tokens} tokens ({self.num_prefix_tokens} "
                f"prefix + grid {self.grid_size}), got input shape {tuple(input_shape)}"
            )
        if self.kind == "sincos":
            table = sincos_2d(self.grid_size, width, self.num_prefix_tokens)[None]
            initializer = keras.initializers.Constant(table)
        else:
            initializer = keras.initializers.RandomNormal(stddev=0.02)
        self.embedding = self.add_weight(
            shape=(1, self.num_tokens, width),
            initializer=initializer,
            trainable=self.kind == "learned",
            name="embedding",
        )

    def call(self, x):
        return x + ops.cast(self.embedding, x.dtype)  # (B, T, D) + (1, T, D)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            grid_size=self.grid_size,
            num_prefix_tokens=self.num_prefix_tokens,
            kind=self.kind,
        )
        return config


def sincos_2d(grid_size, width, num_prefix_tokens=0, temperature=10000.0):
    """Fixed 2-D sin-cos embedding, (num_prefix_tokens + h * w, width), prefix rows zero.

    big_vision's `posemb_sincos_2d` (after MoCo v3): for the patch at row y, column x (raster
    order) and k < width / 4, with omega_k = temperature ** (-k / (width / 4 - 1)), the channels
    are [sin(x omega), cos(x omega), sin(y omega), cos(y omega)]. Computed in float64 and rounded
    once to float32.
    """
    if width % 4:
        raise ValueError(f"sin-cos position embeddings need a width divisible by 4, got {width}")
    h, w = grid_size
    y, x = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
    omega = 1.0 / temperature ** (np.arange(width // 4) / max(width // 4 - 1, 1))
    y = y.reshape(-1, 1) * omega[None]  # (h * w, D / 4)
    x = x.reshape(-1, 1) * omega[None]
    table = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    prefix = np.zeros((num_prefix_tokens, width))
    return np.concatenate([prefix, table], axis=0).astype("float32")

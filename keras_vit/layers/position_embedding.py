"""Position embeddings: learned or fixed 2-D sin-cos (resampling to a new grid: `resample.py`).

Shapes: T = num_prefix_tokens + h * w tokens, D model width, (h, w) the token grid.
The paper adds E_pos in R^{(N+1) x D} to the tokens (§3.1, Eq. 1).
"""


import keras
import numpy as np
from keras import ops

from keras_vit.layers.resample import resample_grid

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

    Input and output: (B, T, D). Called with another `grid` (h', w') (a model with
    `dynamic_image_size`), the input has num_prefix_tokens + h' * w' tokens: a learned table's grid
    rows are resampled to it with `method` (see `resample_position_embedding`), a sin-cos table is
    computed for it, and the prefix rows are kept.
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

    def call(self, x, grid=None, method="bilinear"):
        table = self.embedding if grid is None or _same_grid(grid, self.grid_size) else self.table(grid, method)
        return x + ops.cast(table, x.dtype)  # (B, T, D) + (1, T, D)

    def table(self, grid, method):
        """The table (1, num_prefix_tokens + h' * w', D) for the token grid `grid` (h', w'), whose
        sizes may be symbolic."""
        p, (h, w), width = self.num_prefix_tokens, self.grid_size, self.embedding.shape[-1]
        prefix = ops.cast(self.embedding[:, :p], "float32")
        if self.kind == "sincos":
            patches = sincos_2d(grid, width, xp=ops)
        else:
            patches = ops.reshape(self.embedding[0, p:], (h, w, width))  # (h * w, D) -> (h, w, D)
            patches = ops.reshape(resample_grid(patches, grid, method), (-1, width))  # (h', w', D) -> (h' * w', D)
        return ops.concatenate([prefix, patches[None]], axis=1)

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


def _same_grid(grid, table_grid):
    """Whether `grid` is statically the table's own grid (symbolic sizes never are)."""
    return all(isinstance(g, int) for g in grid) and tuple(grid) == tuple(table_grid)


def sincos_2d(grid_size, width, num_prefix_tokens=0, temperature=10000.0, xp=np):
    """Fixed 2-D sin-cos embedding, (num_prefix_tokens + h * w, width), prefix rows zero.

    big_vision's `posemb_sincos_2d` (after MoCo v3): for the patch at row y, column x (raster
    order) and k < width / 4, with omega_k = temperature ** (-k / (width / 4 - 1)), the channels
    are [sin(x omega), cos(x omega), sin(y omega), cos(y omega)]. With `xp=np`, computed in float64
    and rounded once to float32; with `xp=keras.ops`, in float32, for a grid whose sizes may be
    symbolic (a model with `dynamic_image_size`).
    """
    if width % 4:
        raise ValueError(f"sin-cos position embeddings need a width divisible by 4, got {width}")
    h, w = grid_size
    real = (lambda v: np.asarray(v, np.float64)) if xp is np else (lambda v: ops.cast(v, "float32"))
    # Raster order; the dtype given, as Keras infers none from a symbolic torch size.
    index = xp.arange(0, h * w, dtype="int32")
    omega = 1.0 / temperature ** (np.arange(width // 4) / max(width // 4 - 1, 1))
    omega = omega[None] if xp is np else ops.convert_to_tensor(omega[None], "float32")
    y = real(xp.floor_divide(index, w))[:, None] * omega  # (h * w, 1) x (1, D / 4) -> (h * w, D / 4)
    x = real(xp.mod(index, w))[:, None] * omega
    table = xp.concatenate([xp.sin(x), xp.cos(x), xp.sin(y), xp.cos(y)], axis=1)  # (h * w, D)
    table = xp.concatenate([xp.zeros((num_prefix_tokens, width), table.dtype), table], axis=0)
    return table.astype("float32") if xp is np else table

"""Position embeddings: learned, fixed 2-D sin-cos or factorized (resampling to a new grid: `resample.py`).

Shapes: T = num_prefix_tokens + h * w tokens, D model width, (h, w) the token grid; for patch
sequences (`keras_vit.naflex`) B batch, L sequence length, R = num_prefix_tokens.
The paper adds E_pos in R^{(N+1) x D} to the tokens (§3.1, Eq. 1).
"""


import keras
import numpy as np
from keras import ops

from keras_vit.layers.resample import LINEAR, resample_matrix, resample_weights

POSITION_EMBEDDING_KINDS = ("learned", "sincos", "factorized")


@keras.saving.register_keras_serializable(package="keras_vit")
class PositionEmbedding(keras.layers.Layer):
    """Adds a position embedding to a sequence of prefix tokens followed by an h x w patch grid.

    Args:
        grid_size: (h, w), the token grid in raster order.
        num_prefix_tokens: tokens before the grid (1 for a class token, 0 without).
        kind: "learned" (normal, std 0.02, as in the official code); "sincos" (fixed 2-D
            sin-cos, big_vision's `posemb_sincos_2d`; prefix rows are zero, as big_vision adds
            the table before it prepends the class token); or "factorized": a learned row table
            (h, D) and column table (w, D), patch (y, x) getting the sum of row y and column x
            (NaViT's factorized embedding, §3.1; timm NaFlexVit's `pos_embed="factorized"`);
            prefix tokens get none.

    Input and output: (B, T, D). Called with another `grid` (h', w') (a model with
    `dynamic_image_size`), the input has num_prefix_tokens + h' * w' tokens: a learned table's grid
    rows are resampled to it with `method` (see `resample_position_embedding`), factorized tables
    linearly (timm's), a sin-cos table is computed for it, and the prefix rows are kept. With
    `keep_aspect`, a table is resampled to the square of the longer side and cropped, so that
    both axes are scaled alike (timm's `pos_embed_ar_preserving`).

    Called with `patch_coord` (B, L, 2) and `grids` (B, 2), the input (B, R + L, D) is a batch
    of patch sequences (`keras_vit.naflex`): each patch gets the embedding of its (row, column)
    on its own image's grid (h_b, w_b), resampled as above, or its sin-cos.
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
        normal = keras.initializers.RandomNormal(stddev=0.02)
        if self.kind == "factorized":
            self.rows = self.add_weight(shape=(1, self.grid_size[0], width), initializer=normal, name="rows")
            self.columns = self.add_weight(shape=(1, self.grid_size[1], width), initializer=normal, name="columns")
            return
        if self.kind == "sincos":
            initializer = keras.initializers.Constant(sincos_2d(self.grid_size, width, self.num_prefix_tokens)[None])
        else:
            initializer = normal
        self.embedding = self.add_weight(
            shape=(1, self.num_tokens, width),
            initializer=initializer,
            trainable=self.kind == "learned",
            name="embedding",
        )

    def call(self, x, grid=None, method="bilinear", keep_aspect=False, patch_coord=None, grids=None):
        if patch_coord is not None:
            table = self.sequence_table(patch_coord, grids, method, keep_aspect)
        elif grid is None or _same_grid(grid, self.grid_size):
            table = self.own_table()
        else:
            table = self.table(grid, method, keep_aspect)
        return x + ops.cast(table, x.dtype)  # (B, T, D) + (1 or B, T, D)

    def own_table(self):
        """The table (1, T, D) at the layer's own grid."""
        if self.kind != "factorized":
            return self.embedding
        patches = self.rows[0][:, None] + self.columns[0][None]  # (h, 1, D) + (1, w, D) -> (h, w, D)
        return ops.concatenate([self.prefix_rows(), ops.reshape(patches, (1, -1, self.width))], axis=1)

    @property
    def width(self):
        return (self.rows if self.kind == "factorized" else self.embedding).shape[-1]

    def prefix_rows(self):
        """(1, R, D) float32: the rows of the prefix tokens, zero for factorized tables."""
        if self.kind == "factorized":
            return ops.zeros((1, self.num_prefix_tokens, self.width), "float32")
        return ops.cast(self.embedding[:, : self.num_prefix_tokens], "float32")

    def table(self, grid, method, keep_aspect=False):
        """The table (1, num_prefix_tokens + h' * w', D) for the token grid `grid` (h', w'), whose
        sizes may be symbolic."""
        if self.kind == "sincos":
            patches = sincos_2d(grid, self.width, xp=ops)
        else:
            method = self._method(method)
            if keep_aspect:
                longer = ops.cast(ops.maximum(grid[0], grid[1]), "float32")
                steps = [ops.arange(0, g, dtype="float32") for g in grid]
                rows, cols = (resample_weights(i, longer * ops.ones_like(i), n, method, xp=ops)
                              for i, n in zip(steps, self.grid_size))
            else:
                rows, cols = (resample_matrix(n, g, method, xp=ops) for n, g in zip(self.grid_size, grid))
            patches = ops.reshape(self._grid_table(rows, cols), (-1, self.width))  # (h', w', D) -> (h' * w', D)
        return ops.concatenate([self.prefix_rows(), patches[None]], axis=1)

    def _grid_table(self, rows, cols):
        """The table (h', w', D) on the grid whose weights over the table's rows are `rows` (h', h)
        and over its columns `cols` (w', w)."""
        if self.kind == "factorized":  # (h', h) x (h, D) + (w', w) x (w, D), broadcast to (h', w', D)
            return (ops.matmul(rows, ops.cast(self.rows[0], "float32"))[:, None]
                    + ops.matmul(cols, ops.cast(self.columns[0], "float32"))[None])
        h, w = self.grid_size
        table = ops.reshape(ops.cast(self.embedding[0, self.num_prefix_tokens :], "float32"), (h, w, -1))
        return ops.einsum("ih,hwd,jw->ijd", rows, table, cols)  # (h, w, D) -> (h', w', D)

    def sequence_table(self, patch_coord, grids, method, keep_aspect=False):
        """The table (B, R + L, D) of a batch of patch sequences: each patch's embedding at its
        coordinate `patch_coord` (B, L, 2) on its image's grid `grids` (B, 2)."""
        y, x = (ops.cast(patch_coord[..., i], "float32") for i in (0, 1))  # (B, L) each
        grids = ops.cast(grids, "float32")
        if self.kind == "sincos":
            patches = sincos_rows(y, x, self.width)
        else:
            size = _sizes(grids[:, None, 0] * ops.ones_like(y), grids[:, None, 1] * ops.ones_like(x), keep_aspect)
            rows, cols = (resample_weights(i, s, n, self._method(method), xp=ops)
                          for i, s, n in zip((y, x), size, self.grid_size))  # (B, L, h), (B, L, w)
            patches = self._point_rows(rows, cols)  # (B, L, D)
        prefix = ops.repeat(self.prefix_rows(), ops.shape(patches)[0], axis=0)  # (B, R, D)
        return ops.concatenate([prefix, patches], axis=1)

    def _method(self, method):
        return LINEAR if self.kind == "factorized" else method  # timm resamples factorized tables linearly

    def _point_rows(self, rows, cols):
        """The embeddings (B, L, D) of the points whose weights over the table's rows are `rows`
        (B, L, h) and over its columns `cols` (B, L, w)."""
        if self.kind == "factorized":  # (..., h) x (h, D) + (..., w) x (w, D) -> (..., D)
            return ops.matmul(rows, ops.cast(self.rows[0], "float32")) + ops.matmul(
                cols, ops.cast(self.columns[0], "float32"))
        h, w = self.grid_size
        table = ops.reshape(ops.cast(self.embedding[0, self.num_prefix_tokens :], "float32"), (h, w, -1))
        by_row = ops.einsum("blh,hwd->blwd", rows, table)  # rows first: (B, L, h) x (h, w, D) -> (B, L, w, D)
        return ops.einsum("blw,blwd->bld", cols, by_row)  # then columns: -> (B, L, D)

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


def _sizes(h, w, keep_aspect):
    """The lengths that each axis is resampled to: (h, w), or the longer side twice with `keep_aspect`
    (the crop to (h, w) is implicit: only the first h and w positions are asked for)."""
    if not keep_aspect:
        return h, w
    longer = ops.maximum(h, w)
    return longer, longer


def _same_grid(grid, table_grid):
    """Whether `grid` is statically the table's own grid (symbolic sizes never are)."""
    return all(isinstance(g, int) for g in grid) and tuple(grid) == tuple(table_grid)


def _omega(width, temperature, xp):
    """The D / 4 frequencies of the sin-cos embedding, (1, D / 4)."""
    if width % 4:
        raise ValueError(f"sin-cos position embeddings need a width divisible by 4, got {width}")
    omega = 1.0 / temperature ** (np.arange(width // 4) / max(width // 4 - 1, 1))
    return omega[None] if xp is np else ops.convert_to_tensor(omega[None], "float32")


def sincos_rows(y, x, width, temperature=10000.0):
    """`keras.ops` sin-cos embeddings (..., width) of the patches at rows `y` and columns `x` (...,),
    real arrays of one shape: the rows of `sincos_2d` at those coordinates."""
    omega = _omega(width, temperature, ops)[0]  # (D / 4,)
    y, x = y[..., None] * omega, x[..., None] * omega  # (..., 1) x (D / 4,) -> (..., D / 4)
    return ops.concatenate([ops.sin(x), ops.cos(x), ops.sin(y), ops.cos(y)], axis=-1)


def sincos_2d(grid_size, width, num_prefix_tokens=0, temperature=10000.0, xp=np):
    """Fixed 2-D sin-cos embedding, (num_prefix_tokens + h * w, width), prefix rows zero.

    big_vision's `posemb_sincos_2d` (after MoCo v3): for the patch at row y, column x (raster
    order) and k < width / 4, with omega_k = temperature ** (-k / (width / 4 - 1)), the channels
    are [sin(x omega), cos(x omega), sin(y omega), cos(y omega)]. With `xp=np`, computed in float64
    and rounded once to float32; with `xp=keras.ops`, in float32, for a grid whose sizes may be
    symbolic (a model with `dynamic_image_size`).
    """
    omega = _omega(width, temperature, xp)
    h, w = grid_size
    real = (lambda v: np.asarray(v, np.float64)) if xp is np else (lambda v: ops.cast(v, "float32"))
    # Raster order; the dtype given, as Keras infers none from a symbolic torch size.
    index = xp.arange(0, h * w, dtype="int32")
    y = real(xp.floor_divide(index, w))[:, None] * omega  # (h * w, 1) x (1, D / 4) -> (h * w, D / 4)
    x = real(xp.mod(index, w))[:, None] * omega
    table = xp.concatenate([xp.sin(x), xp.cos(x), xp.sin(y), xp.cos(y)], axis=1)  # (h * w, D)
    table = xp.concatenate([xp.zeros((num_prefix_tokens, width), table.dtype), table], axis=0)
    return table.astype("float32") if xp is np else table

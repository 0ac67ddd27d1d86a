"""Position embeddings: learned or fixed 2-D sin-cos, and their resampling to a new grid.

Shapes: T = num_prefix_tokens + h * w tokens, D model width, (h, w) the token grid.
The paper adds E_pos in R^{(N+1) x D} to the tokens (§3.1, Eq. 1). Fine-tuning at another
resolution resamples the patch rows by 2-D interpolation (§3.2); the class-token row is kept.
"""

import math

import keras
import numpy as np
import scipy.ndimage
from keras import ops

RESAMPLE_METHODS = ("bilinear", "bicubic", "bicubic_no_antialias")
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


def resample_position_embedding(embedding, old_grid, new_grid, num_prefix_tokens=1, method="bilinear"):
    """Resamples the grid rows of a position embedding table; prefix rows pass through unchanged.

    Args:
        embedding: (T, D) or (1, T, D) array with T = num_prefix_tokens + h * w.
        old_grid: (h, w) before; it may be non-square.
        new_grid: (h, w) after; it may be non-square.
        method: "bilinear", as the official fine-tuning code does it
            (`scipy.ndimage.zoom(order=1)`, corners aligned); "bicubic" with antialias, as timm
            does it (`F.interpolate(mode="bicubic", antialias=True)`); or "bicubic_no_antialias",
            torch's plain `F.interpolate(mode="bicubic", align_corners=False)`, which transformers'
            `interpolate_pos_encoding` uses for DINOv2 and SigLIP.

    Returns:
        An array of the input's rank and dtype with num_prefix_tokens + h' * w' rows.
    """
    if method not in RESAMPLE_METHODS:
        raise ValueError(f"method={method!r} is not a resampling method; use one of {RESAMPLE_METHODS}")
    embedding = np.asarray(embedding)
    batched = embedding.ndim == 3
    table = embedding[0] if batched else embedding
    (h, w), (h2, w2) = tuple(old_grid), tuple(new_grid)
    if table.shape[0] != num_prefix_tokens + h * w:
        raise ValueError(
            f"position embedding has {table.shape[0]} rows; grid {old_grid} with "
            f"{num_prefix_tokens} prefix tokens needs {num_prefix_tokens + h * w}"
        )
    if (h, w) == (h2, w2):
        return embedding
    prefix, grid = table[:num_prefix_tokens], table[num_prefix_tokens:]
    grid = grid.reshape(h, w, -1).astype(np.float64)  # (h * w, D) -> (h, w, D)
    if method == "bilinear":
        grid = scipy.ndimage.zoom(grid, (h2 / h, w2 / w, 1), order=1)
    else:
        weights = _aa_cubic_weights if method == "bicubic" else _cubic_weights
        grid = np.einsum("ih,hwd,jw->ijd", weights(h, h2), grid, weights(w, w2))  # (h, w, D) -> (h', w', D)
    grid = grid.reshape(h2 * w2, -1).astype(table.dtype)  # (h', w', D) -> (h' * w', D)
    table = np.concatenate([prefix, grid], axis=0)
    return table[None] if batched else table


def _cubic(x, a=-0.5):
    """Keys' cubic convolution kernel; a = -0.5 is the value PIL and torch's antialias path use."""
    x = np.abs(x)
    return np.where(
        x < 1,
        ((a + 2) * x - (a + 3)) * x * x + 1,
        np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0),
    )


def _aa_cubic_weights(n_in, n_out):
    """(n_out, n_in) matrix of antialiased bicubic interpolation with half-pixel centers.

    Written by hand because no numpy or scipy routine reproduces the resampling that timm uses:
    Pillow's separable filter, whose support widens by the scale factor when shrinking.
    """
    scale = n_in / n_out
    support = 2.0 * max(scale, 1.0)
    inv = 1.0 / max(scale, 1.0)
    weights = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        taps = _cubic((np.arange(lo, hi) - center + 0.5) * inv)
        weights[i, lo:hi] = taps / taps.sum()
    return weights


def _cubic_weights(n_in, n_out, a=-0.75):
    """(n_out, n_in) matrix of plain bicubic interpolation: half-pixel centers, four taps whose
    indices are clamped at the borders, Keys' a = -0.75, no widening when shrinking.

    Written by hand because this is torch's `F.interpolate(mode="bicubic", align_corners=False)`,
    and no numpy or scipy routine computes it (scipy's cubic is a spline; TF and JAX use a = -0.5).
    """
    weights = np.zeros((n_out, n_in))
    for i in range(n_out):
        src = (i + 0.5) * n_in / n_out - 0.5
        base = math.floor(src)
        for k in range(-1, 3):
            weights[i, min(max(base + k, 0), n_in - 1)] += _cubic(src - base - k, a)
    return weights

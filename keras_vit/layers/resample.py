"""Resampling a position embedding table to a new token grid, for another input resolution.

Fine-tuning at another resolution resamples the patch rows by 2-D interpolation (§3.2); the prefix
rows (class token, registers) are kept. Each method is a linear map along each axis, an
(n_out, n_in) matrix: one set of formulas serves numpy (`resize`, checkpoints; float64) and
`keras.ops` (a model with `dynamic_image_size`, inside `call`, where the new grid may be known only
when the graph runs). Shapes: T = num_prefix_tokens + h * w rows, D width.
"""

import numpy as np
from keras import ops

RESAMPLE_METHODS = ("bilinear", "bicubic", "bicubic_no_antialias")
# timm's resampling of factorized position tables (see `resample_weights`); not offered as a choice.
LINEAR = "linear"


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
    check_method(method)
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
    grid = np.einsum("ih,hwd,jw->ijd", resample_matrix(h, h2, method), grid, resample_matrix(w, w2, method))
    grid = grid.reshape(h2 * w2, -1).astype(table.dtype)  # (h', w', D) -> (h' * w', D)
    table = np.concatenate([prefix, grid], axis=0)
    return table[None] if batched else table


def check_method(method):
    if method not in RESAMPLE_METHODS:
        raise ValueError(f"method={method!r} is not a resampling method; use one of {RESAMPLE_METHODS}")


def resample_matrix(n_in, n_out, method, xp=np):
    """The (n_out, n_in) matrix of `method` along one axis, in float64 with `xp=np`, or in float32
    with `xp=keras.ops` (then `n_out` may be a symbolic size)."""
    dtype = "float64" if xp is np else "float32"  # given: Keras infers none from a symbolic torch size
    i = xp.arange(0, n_out, dtype=dtype)  # a start given, for jax2onnx
    return resample_weights(i, i[-1] + 1, n_in, method, xp)  # n_out as a real number, from its indices, likewise


def resample_weights(index, size, n_in, method, xp=np):
    """The weights (..., n_in) that output position `index` (...) of a resampling of `n_in` entries
    to `size` (...) entries gives each input entry, along one axis: the rows of `resample_matrix`,
    for a position and a size that may differ from token to token (a batch of patch sequences of
    different grids). `index` and `size` are real arrays of one shape (float64 with `xp=np`, float32
    with `xp=keras.ops`).

    Written by hand because no library computes these resamplings as matrices in every backend:
    "bilinear" is `scipy.ndimage.zoom(order=1)` (corners aligned); "bicubic" is Pillow's
    antialiased filter, whose support widens by the scale factor when shrinking (torch's
    `antialias=True`); "bicubic_no_antialias" is torch's plain bicubic (four clamped taps, a = -0.75;
    scipy's cubic is a spline, and TF and JAX use a = -0.5); `LINEAR` (not a choice of
    `RESAMPLE_METHODS`) is torch's `F.interpolate(mode="linear", align_corners=False)`, which timm
    resamples factorized position tables with.
    """
    if method != LINEAR:
        check_method(method)
    real = (lambda v: np.asarray(v, np.float64)) if xp is np else (lambda v: ops.cast(v, "float32"))
    dtype = "float64" if xp is np else "float32"
    # expand_dims rather than [..., None]: tf2onnx converts no StridedSlice whose ellipsis and new
    # axis leave begin equal to end (a dynamic-size model's ONNX export failed on it).
    i, size = xp.expand_dims(index, -1), xp.expand_dims(size, -1)  # (..., 1)
    j = xp.arange(0, n_in, dtype=dtype)  # (n_in,)
    if method == "bicubic":
        scale = n_in / size
        stretch = xp.maximum(scale, 1.0)  # the support widens when shrinking
        taps = _cubic((j - scale * (i + 0.5) + 0.5) / stretch, -0.5, xp)  # (..., n_in)
        return taps / xp.sum(taps, axis=-1, keepdims=True)
    if method == "bilinear":
        src = i * ((n_in - 1) / xp.maximum(size - 1, 1.0))  # scipy maps corners onto corners
    else:  # half-pixel centers, as torch
        src = (i + 0.5) * (n_in / size) - 0.5
    if method == LINEAR:
        src = xp.maximum(src, 0.0)  # torch clamps linear's source index at the first entry
    base = xp.floor(src)
    if method != "bicubic_no_antialias":
        return _taps(base, n_in, xp, real) * (1 - src + base) + _taps(base + 1, n_in, xp, real) * (src - base)
    return sum(_taps(base + k, n_in, xp, real) * _cubic(src - base - k, -0.75, xp) for k in (-1, 0, 1, 2))


def _taps(index, n_in, xp, real):
    """(..., 1) source indices -> (..., n_in) one-hot rows, the indices clamped to the borders."""
    index = xp.clip(index, 0, n_in - 1)
    return real(xp.equal(index, xp.arange(0, n_in, dtype=index.dtype)))


def _cubic(x, a, xp):
    """Keys' cubic convolution kernel: a = -0.5 as in Pillow and torch's antialias path, -0.75 as
    torch's plain bicubic."""
    x = xp.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return xp.where(x < 1, near, xp.where(x < 2, far, 0.0 * x))

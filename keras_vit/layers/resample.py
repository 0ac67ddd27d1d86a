"""Resampling a position embedding table to a new token grid, for another input resolution.

Fine-tuning at another resolution resamples the patch rows by 2-D interpolation (§3.2); the prefix
rows (class token, registers) are kept. Shapes: T = num_prefix_tokens + h * w rows, D width.
"""

import math

import numpy as np
import scipy.ndimage

RESAMPLE_METHODS = ("bilinear", "bicubic", "bicubic_no_antialias")


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

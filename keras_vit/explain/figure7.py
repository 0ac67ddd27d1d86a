"""The paper's Figure 7 measures: mean attention distance (right) and the similarity of the
position embeddings (center).

Shapes: B batch, L layers, K heads, N = h * w patches, (h, w) token grid, D width.
"""

import numpy as np
from keras import ops

from keras_vit.explain.maps import attention_maps


def mean_attention_distance(model, images, maps=None):
    """Mean attention distance in pixels per layer and head, (L, K): the paper's Figure 7, right.

    For each patch query, the image-space distance to every patch key is weighted by the
    attention, then averaged over queries and images. Attention to prefix tokens (the class
    token) has no position, so each query's row is renormalized over the patch keys.
    """
    maps = attention_maps(model, images) if maps is None else maps
    p = model.num_prefix_tokens
    a = ops.convert_to_numpy(ops.cast(maps, "float32"))[..., p:, p:]  # (B, L, K, N, N)
    a = a / a.sum(axis=-1, keepdims=True)
    h, w = model.token_grid(images)
    yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    centers = np.stack([yy.ravel(), xx.ravel()], axis=1) * model.token_pixels  # (N, 2) pixels
    dist = np.linalg.norm(centers[:, None] - centers[None], axis=-1)  # (N, N)
    return (a * dist).sum(axis=-1).mean(axis=(0, -1))  # (B, L, K, N) -> (L, K)


def position_embedding_similarity(model):
    """Cosine similarity of each patch's position embedding with every other's, (h, w, h, w):
    the paper's Figure 7, center. Entry [i, j] is the (h, w) map of patch (i, j)."""
    p = model.num_prefix_tokens
    table = np.asarray(ops.convert_to_numpy(model.position_embedding.own_table()), "float64")[0, p:]
    table = table / np.linalg.norm(table, axis=-1, keepdims=True)
    h, w = model.grid_size
    return (table @ table.T).reshape(h, w, h, w)  # (N, D) x (D, N) -> (N, N) -> (h, w, h, w)

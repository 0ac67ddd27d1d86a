"""Cost and interpretability measures from the paper: multiply-adds, mean attention distance
(Figure 7, right) and position-embedding similarity (Figure 7, center).

Shapes: L layers, K heads, (h, w) token grid, N = h * w patches, T tokens, D width, M MLP width.
"""

import numpy as np
from keras import ops

from keras_vit.attention import attention_maps


def block_macs(num_tokens, hidden_dim, mlp_dim=None):
    """Multiply-adds of one encoder block on `num_tokens` tokens.

    "linear" counts the Q, K, V and output projections (4 n D^2) and the MLP (2 n D M, which is
    8 n D^2 for M = 4 D); "attention" counts the scores Q K^T and the weighted sum of the values
    (2 n^2 D). LayerNorms, softmax and GELU are not multiply-adds and are left out.
    """
    n, d = int(num_tokens), int(hidden_dim)
    m = 4 * d if mlp_dim is None else int(mlp_dim)
    return {"attention": 2 * n * n * d, "linear": 4 * n * d * d + 2 * n * d * m}


def model_macs(config):
    """Multiply-adds of a whole ViT for one image, by part.

    Args:
        config: a `ViT`, or a dict with its constructor arguments (`image_size`, `patch_size`,
            `num_channels`, `hidden_dim`, `num_layers`, `mlp_dim`, `num_classes`, and optionally
            `class_token` / `pooling` and `representation_size`).

    Returns:
        A dict with the number of tokens, "patch_embedding", "block" (one block's dict from
        `block_macs`), "blocks" (all of them), "head" and "total".
    """
    c = config.get_config() if hasattr(config, "get_config") else dict(config)
    size = c.get("image_size", 224)
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    p, d = c["patch_size"], c["hidden_dim"]
    n = (h // p) * (w // p)
    class_token = c.get("class_token")
    if class_token is None:
        class_token = c.get("pooling", "token") == "token"
    tokens = n + int(class_token)
    block = block_macs(tokens, d, c.get("mlp_dim"))
    blocks = c["num_layers"] * (block["attention"] + block["linear"])
    rep = c.get("representation_size") or 0
    head = d * rep + (rep or d) * c.get("num_classes", 1000)
    embed = n * p * p * c.get("num_channels", 3) * d
    return {
        "tokens": tokens,
        "patch_embedding": embed,
        "block": block,
        "blocks": blocks,
        "head": head,
        "total": embed + blocks + head,
    }


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
    h, w = model.grid_size
    yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    centers = np.stack([yy.ravel(), xx.ravel()], axis=1) * model.patch_size  # (N, 2) pixels
    dist = np.linalg.norm(centers[:, None] - centers[None], axis=-1)  # (N, N)
    return (a * dist).sum(axis=-1).mean(axis=(0, -1))  # (B, L, K, N) -> (L, K)


def position_embedding_similarity(model):
    """Cosine similarity of each patch's position embedding with every other's, (h, w, h, w):
    the paper's Figure 7, center. Entry [i, j] is the (h, w) map of patch (i, j)."""
    p = model.num_prefix_tokens
    table = np.asarray(ops.convert_to_numpy(model.position_embedding.embedding), "float64")[0, p:]
    table = table / np.linalg.norm(table, axis=-1, keepdims=True)
    h, w = model.grid_size
    return (table @ table.T).reshape(h, w, h, w)  # (N, D) x (D, N) -> (N, N) -> (h, w, h, w)

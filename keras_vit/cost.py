"""What a ViT costs, from its config: multiply-adds and parameter counts. (What it attends to is in
`keras_vit.explain`.)

Shapes: T tokens, D width, M MLP width, K heads.
"""

import math


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
            `class_token` / `pooling`, `representation_size` and `num_register_tokens`). Hybrids
            (`stem`) are refused: their ResNet is not counted here.

    Returns:
        A dict with the number of tokens, "patch_embedding", "block" (one block's dict from
        `block_macs`), "blocks" (all of them), "head" and "total".
    """
    c = config.get_config() if hasattr(config, "get_config") else dict(config)
    if c.get("stem") is not None:
        raise ValueError(f"model_macs counts pure ViTs; stem={c['stem']!r} (a ResNet) is not counted")
    size = c.get("image_size", 224)
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    p, d = c["patch_size"], c["hidden_dim"]
    n = (h // p) * (w // p)
    class_token = c.get("class_token")
    if class_token is None:
        class_token = c.get("pooling", "token") == "token"
    tokens = n + int(class_token) + c.get("num_register_tokens", 0)
    block = block_macs(tokens, d, c.get("mlp_dim"))
    blocks = c["num_layers"] * (block["attention"] + block["linear"])
    rep = c.get("representation_size") or 0
    head = d * rep + (rep or d) * c.get("num_classes", 1000)
    if c.get("pooling") == "map":  # one probe query: its Q and output projections, K and V of n tokens, scores, MLP
        head += 2 * d * d + 2 * n * d * d + 2 * n * d + 2 * d * c.get("mlp_dim", 4 * d)
    embed = n * p * p * c.get("num_channels", 3) * d
    return {
        "tokens": tokens,
        "patch_embedding": embed,
        "block": block,
        "blocks": blocks,
        "head": head,
        "total": embed + blocks + head,
    }


def count_params(config):
    """The number of weights of the `ViT` that `config` describes, counted without allocating it
    (ViT-22B's 21.7B weights would not fit in memory): the sum of the shapes of its variables,
    as the model itself builds them under `keras.StatelessScope`; equal to
    `ViT(**config).count_params()`.

    Args:
        config: a `ViT` or a dict of its constructor arguments; missing ones take the defaults.
    """
    from keras_vit.models.resize import variable_shapes  # here: keras_vit.models imports this package

    c = config.get_config() if hasattr(config, "get_config") else dict(config)
    _, shapes = variable_shapes(c)
    return sum(math.prod(shape) for shape in shapes.values())

"""What a ViT costs, from its config: multiply-adds and parameter counts. (What it attends to is in
`keras_vit.explain`.)

Shapes: T tokens, D width, M MLP width, K heads.
"""

import inspect

from keras_vit.layers.resnet import ROOT_WIDTH, STAGE_WIDTHS


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
    """The number of weights of the `ViT` that `config` describes, counted without building it
    (ViT-22B's 21.7B weights would not fit in memory); equal to `ViT(**config).count_params()`.

    Args:
        config: a `ViT` or a dict of its constructor arguments; missing ones take the defaults.
    """
    c = _full_config(config)
    d, m, k = c["hidden_dim"], c["mlp_dim"], c["num_heads"]
    bias, parallel = c["use_bias"], c["parallel_block"]
    ln = 2 * d if bias else d  # LayerNorm: scale, and bias unless use_bias=False
    stem, stride, width = _stem_params(c)
    size = (c["image_size"],) * 2 if isinstance(c["image_size"], int) else tuple(c["image_size"])
    cell = stride * c["patch_size"]
    class_token = c["pooling"] == "token" if c["class_token"] is None else bool(c["class_token"])
    prefix = int(class_token) + c["num_register_tokens"]
    embed = c["patch_size"] ** 2 * width * d + d + prefix * d + (prefix + (size[0] // cell) * (size[1] // cell)) * d
    qk_norm = 2 * (d // k) * (2 if bias else 1) if c["qk_norm"] else 0
    attn = 3 * d * d + (3 * d if bias else 0) + d * d + d + qk_norm  # Q, K, V, output, QK norms
    mlp = 2 * d * m + m + d
    scales = 0 if c["layer_scale_init"] is None else d * (1 if parallel else 2)
    block = ln * (1 if parallel else 2) + attn + mlp + scales
    head = (d + 4 * d * d + 4 * d + ln + mlp) if c["pooling"] == "map" else 0  # probe, attention, LN, MLP
    rep = c["representation_size"] or 0
    head += d * rep + rep if rep else 0
    head += ((rep or d) + 1) * c["num_classes"]
    return stem + embed + c["num_layers"] * block + ln + head


def _full_config(config):
    from keras_vit.models.vit import ViT  # here: keras_vit.models imports this module's package

    c = config.get_config() if hasattr(config, "get_config") else dict(config)
    defaults = {n: p.default for n, p in inspect.signature(ViT.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {**defaults, **c}


def _stem_params(c):
    """(weights, stride, output width) of the ResNet stem, or (0, 1, num_channels) without one."""
    if c["stem"] is None:
        return 0, 1, c["num_channels"]
    units = tuple(c["stem_layers"] or (3, 4, 9))
    total, width = 49 * c["num_channels"] * ROOT_WIDTH + 2 * ROOT_WIDTH, ROOT_WIDTH  # 7x7 conv, GroupNorm
    for stage, n in enumerate(units):
        out = STAGE_WIDTHS[stage]
        mid = out // 4

        def unit(cin):  # 1x1, 3x3, 1x1 convolutions and their 3 GroupNorms (scale and bias)
            return cin * mid + 9 * mid * mid + mid * out + 4 * mid + 2 * out

        total += unit(width) + width * out + 2 * out + (n - 1) * unit(out)  # the first unit has the projection
        width = out
    return total, 4 * 2 ** (len(units) - 1), width

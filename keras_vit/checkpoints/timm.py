"""timm `VisionTransformer` and `NaFlexVit` state dicts as `.safetensors`, read and written with one table.

PyTorch layouts; one `qkv` Linear with rows [q; k; v]; `reg_token`, `ls{1,2}.gamma`,
`attn.{q,k}_norm`; a MAP head `attn_pool` (q, a fused kv with rows [k; v], proj, norm, mlp); a
hybrid's ResNet `patch_embed.backbone` (counted from 0). NaFlexVit keeps the blocks and heads and
differs in its embedding, `embeds.`: a Linear `proj` over patches flattened (P, P, C), and a
position table (1, h, w, D) (`pos_embed`) or two, (1, h, D) and (1, w, D) (`pos_embed_y`,
`pos_embed_x`), for the patches alone. A state dict does not store the head count, input size or
normalization: they come from `num_heads=`, timm's config.json, the metadata that
`save_checkpoint` writes (every `ViT` argument), or the defaults. Shapes: D width, P patch,
C channels, R prefix tokens, (h, w) the position table's grid.
"""

import inspect
import json
import math
import re

import numpy as np

from keras_vit.checkpoints import rules as r
from keras_vit.checkpoints.rules import CONV, TORCH_NORM, Layout, Rule, linear, linear_layout, positions
from keras_vit.io import safetensors
from keras_vit.models import ViT
from keras_vit.models.resize import POSITIONS, weights
from keras_vit.preprocessing import RESIZE

READER = safetensors
# timm's vision_transformer default config: exact GELU, bicubic resampling (mean and std 0.5, the
# ViT default, i.e. inputs in [-1, 1]).
DEFAULTS = dict(gelu_approximate=False, resample_method="bicubic")
# The head count is not in a timm state dict. These are the widths of timm's ViT-Ti/S/B/L/H
# (patch 14-32) with their head counts; anything else needs num_heads=.
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}
# timm's ViT names give the size ("vit_base_patch16_224"); these are its head counts per size.
HEADS_BY_NAME = {"tiny": 3, "small": 6, "medium": 8, "betwixt": 10, "base": 12, "large": 16, "huge": 16,
                 "giant": 16, "gigantic": 16}
_POOLING = {"token": "token", "avg": "gap", "map": "map"}  # timm's global_pool -> keras_vit's pooling
_ARGUMENTS = set(inspect.signature(ViT).parameters) | {"name", "trainable", "dtype"}
# What a timm VisionTransformer cannot hold, with the value it can.
_CANNOT_HOLD = {"representation_size": (None, "timm's VisionTransformer has no pre-logits layer"),
                "parallel_block": (False, "timm's parallel block fuses the MLP input into the qkv projection")}
# What timm's NaFlexVit cannot hold, beyond that.
_NAFLEX_CANNOT_HOLD = {"position_embedding": (frozenset({"learned", "factorized"}),
                                              "timm's NaFlexVit has learned or factorized position embeddings"),
                       "stem": (None, "timm's NaFlexVit embeds patches of pixels")}
_UNIT = "patch_embed.backbone.stages.{s-1}.blocks.{u-1}."


def naflex_positions(prefix, grid):
    """The position table (1, R + h * w, D) <-> NaFlexVit's (1, h, w, D), which holds no prefix
    rows: they are zero when read (`write` first adds them to the tokens, `fold_prefix_rows`)."""
    h, w = grid
    return Layout(lambda x: x[:, prefix:].reshape(1, h, w, -1),
                  lambda y, s: np.concatenate([np.zeros((1, prefix, s[2]), y.dtype), y.reshape(1, h * w, -1)], axis=1))


def embedding_rules(prefix, stored, naflex_grid=None):
    """The rules of the patch and position embeddings and the prefix tokens: VisionTransformer's
    (`patch_embed.`, a position table keeping the first `stored` of the `prefix` rows), or with
    `naflex_grid` (h, w), NaFlexVit's (`embeds.`)."""
    if naflex_grid is None:
        return [Rule("patch_embedding/conv/kernel", "patch_embed.proj.weight", CONV),
                Rule("patch_embedding/conv/bias", "patch_embed.proj.bias"),
                Rule("class_token/token", "cls_token"), Rule("registers/tokens", "reg_token"),
                Rule(POSITIONS, "pos_embed", positions(stored, prefix))]
    e = "embeds."
    return [Rule("patch_embedding/conv/kernel", e + "proj.weight", linear_layout(3)),  # (P, P, C, D) <-> (D, P P C)
            Rule("patch_embedding/conv/bias", e + "proj.bias"),
            Rule("class_token/token", e + "cls_token"), Rule("registers/tokens", e + "reg_token"),
            Rule(POSITIONS, e + "pos_embed", naflex_positions(prefix, naflex_grid)),
            Rule("position_embedding/rows", e + "pos_embed_y"), Rule("position_embedding/columns", e + "pos_embed_x")]


def rules(prefix, stored, naflex_grid=None):
    """The table of a model with `prefix` class and register tokens whose position table keeps the
    first `stored` prefix rows (timm's `no_embed_class` keeps none); NaFlexVit's embedding with
    `naflex_grid`, its position table's (h, w)."""
    b, t, n = "encoder/block_{i}/", "blocks.{i}.", TORCH_NORM
    return [
        *embedding_rules(prefix, stored, naflex_grid),
        *linear(b + "attn/{p:query|key|value}", t + "attn.qkv"),
        *linear(b + "attn/attention_output", t + "attn.proj", inputs=2),
        Rule(b + "attn/{q:q_norm|k_norm}/" + n, t + "attn.{q}.{w}"),
        Rule(b + "{m:norm1|norm2}/" + n, t + "{m}.{w}"),
        Rule(b + "{m:ls1|ls2}/gamma", t + "{m}.gamma"),
        *linear(b + "{m:fc1|fc2}", t + "mlp.{m}"),
        Rule("encoder/norm/" + n, "norm.{w}"), Rule("head/fc_norm/" + n, "fc_norm.{w}"),
        Rule("head/map_head/probe", "attn_pool.latent"),
        *linear("head/map_head/attn/query", "attn_pool.q"),
        *linear("head/map_head/attn/{p:key|value}", "attn_pool.kv"),
        *linear("head/map_head/attn/attention_output", "attn_pool.proj", inputs=2),
        Rule("head/map_head/norm/" + n, "attn_pool.norm.{w}"),
        *linear("head/map_head/{m:fc1|fc2}", "attn_pool.mlp.{m}"),
        *linear("head/pre_logits", "pre_logits.fc"),  # older timm releases' tanh representation layer
        *linear("head/classifier", "head"),
        Rule("stem/conv_root/kernel", "patch_embed.backbone.stem.conv.weight", CONV),
        Rule("stem/gn_root/" + n, "patch_embed.backbone.stem.norm.{w}"),
        Rule("stem/block{s}_unit{u}/{c:conv1|conv2|conv3|conv_proj=downsample.conv}/kernel", _UNIT + "{c}.weight",
             CONV),
        Rule("stem/block{s}_unit{u}/{g:gn1=norm1|gn2=norm2|gn3=norm3|gn_proj=downsample.norm}/" + n, _UNIT + "{g}.{w}"),
    ]


def claims(path, config):
    """A folder with timm's config.json (one with "architecture"), or a `.safetensors` file but
    a model.safetensors beside a transformers config.json."""
    timm_config = config is not None and "architecture" in config
    transformers = config is not None and not timm_config and path.name == "model.safetensors"
    if path.is_dir() and timm_config or not path.is_dir() and path.suffix == ".safetensors" and not transformers:
        return path / "model.safetensors" if path.is_dir() else path


def source(path, shapes, metadata, side, options):
    """The model of a timm state dict; see the module doc for where each argument comes from."""
    saved = r.saved_config(metadata.get(r.SAVED))
    config = side["config.json"] or {}
    hints = config_hints(config) if "architecture" in config else {}
    naflex = "embeds.proj.weight" in shapes
    e = "embeds." if naflex else ""
    class_token, registers = e + "cls_token" in shapes, shapes[e + "reg_token"][1] if e + "reg_token" in shapes else 0
    if naflex:
        embedding, grid, stored = _naflex_embedding(path, shapes, saved, hints)
    elif "patch_embed.proj.weight" in shapes:
        embedding, grid, stored = _embedding(shapes, int(class_token) + registers, options, saved, hints)
    else:
        raise ValueError(f"{path} has neither 'patch_embed.proj.weight' nor 'embeds.proj.weight'; it is not a timm "
                         f"ViT or NaFlexVit state dict (found {sorted(shapes)[:8]} ...)")
    d = embedding["hidden_dim"]
    num_heads = options.get("num_heads") or saved.get("num_heads") or hints.get("num_heads") or HEADS_BY_WIDTH.get(d)
    if num_heads is None:
        raise ValueError(f"a timm state dict does not store the head count and width {d} is not a standard one "
                         f"{sorted(HEADS_BY_WIDTH)}; pass num_heads=...")
    fc_norm, map_head = "fc_norm.weight" in shapes, "attn_pool.latent" in shapes
    model = dict(
        DEFAULTS, **embedding, num_heads=num_heads, class_token=class_token, fc_norm=fc_norm,
        num_layers=r.count(shapes, r"blocks\.(\d+)\."),
        mlp_dim=shapes["blocks.0.mlp.fc1.weight"][0] if "blocks.0.mlp.fc1.weight" in shapes else 4 * d,
        num_classes=shapes["head.weight"][0] if "head.weight" in shapes else 0,
        representation_size=shapes["pre_logits.fc.weight"][0] if "pre_logits.fc.weight" in shapes else None,
        num_register_tokens=registers, layer_scale_init=1.0 if "blocks.0.ls1.gamma" in shapes else None,
        # QK-norm is both norms; timm's `fc_norm` exists only with average pooling.
        qk_norm=all(f"blocks.0.attn.{q}.weight" in shapes for q in ("q_norm", "k_norm")),
        use_bias="blocks.0.norm1.bias" in shapes,
        pooling="map" if map_head else "gap" if fc_norm or not class_token else "token",
    )
    model.update({k: v for k, v in {**hints, **saved}.items() if k in _ARGUMENTS and k != "num_heads"})
    return r.Source(model, rules(int(class_token) + registers, stored, grid if naflex else None))


def _embedding(shapes, prefix, options, saved, hints):
    """(the embedding's `ViT` arguments, the position grid, the prefix rows stored) of a
    VisionTransformer state dict."""
    d, c, p, _ = shapes["patch_embed.proj.weight"]
    layers = r.stem_layers(shapes, r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.", first=0)
    size = r.cell(p, layers)
    grid, stored = _grid(shapes["pos_embed"][1], prefix, options, saved, hints, size)
    embedding = dict(patch_size=p, hidden_dim=d, image_size=(grid[0] * size, grid[1] * size),
                     num_channels=c if layers is None else shapes["patch_embed.backbone.stem.conv.weight"][1],
                     **({} if layers is None else dict(stem="resnet50", stem_layers=layers)))
    return embedding, grid, stored


def _naflex_embedding(path, shapes, saved, hints):
    """As `_embedding`, for a NaFlexVit state dict: the patch size and channels from the Linear's
    input width P * P * C (C from the metadata or config.json, else 3, else 1), the grid from the
    position table's shape, no prefix rows; served as patch sequences of the table's size."""
    d, flat = shapes["embeds.proj.weight"]
    channels = [saved.get("num_channels") or hints.get("num_channels")] if (
        saved.get("num_channels") or hints.get("num_channels")) else [3, 1]
    c = next((c for c in channels if flat % c == 0 and math.isqrt(flat // c) ** 2 == flat // c), None)
    if c is None:
        raise ValueError(f"{path}: embeds.proj.weight takes {flat} values per patch, which is not P * P * C for "
                         f"C in {channels}")
    if "embeds.pos_embed" in shapes:
        grid, kind = tuple(shapes["embeds.pos_embed"][1:3]), "learned"
    elif "embeds.pos_embed_y" in shapes and "embeds.pos_embed_x" in shapes:
        grid, kind = (shapes["embeds.pos_embed_y"][1], shapes["embeds.pos_embed_x"][1]), "factorized"
    else:
        raise ValueError(f"{path} is a NaFlexVit state dict without a learned or factorized position table "
                         "(embeds.pos_embed, or embeds.pos_embed_y and _x); keras_vit reads those")
    p = math.isqrt(flat // c)
    embedding = dict(patch_size=p, hidden_dim=d, num_channels=c, image_size=(grid[0] * p, grid[1] * p),
                     position_embedding=kind, max_seq_len=grid[0] * grid[1])
    return embedding, grid, 0


def _grid(rows, prefix, options, saved, hints, cell):
    """(grid, prefix rows stored) of a `pos_embed` of `rows` rows. The grid comes from
    `source_image_size=`, the file's metadata, timm's config.json (when the table fits it) or
    the square of the rows; the class and register tokens' rows are there when the rest fits."""
    hint = r.size_grid(hints.get("input_size"), cell)
    if hint is not None and rows not in (hint[0] * hint[1], hint[0] * hint[1] + prefix):
        hint = None  # timm's config.json states the default input size, not the weights'
    grid = r.size_grid(options.get("source_image_size"), cell) or saved.get("grid") or hint

    def fits(n):
        return n > 0 and (math.isqrt(n) ** 2 == n if grid is None else n == grid[0] * grid[1])

    stored = prefix if prefix and fits(rows - prefix) else 0
    return r.table_grid(rows - stored, grid), stored


def config_hints(config):
    """What a timm `config.json` (as in timm's Hub repos) says beyond the tensors: num_heads, the
    input size, pooling, the preprocessing (normalization; its `interpolation`, through PIL and so
    antialiased, of the center crop), class names, channels and NaFlexVit's aspect-preserving
    resampling."""
    pretrained, args = config.get("pretrained_cfg") or {}, config.get("model_args") or {}
    size = re.match(r"(?:naflex)?vit_(\w+?)_", config.get("architecture", ""))
    names = config.get("label_names") or pretrained.get("label_names")
    if isinstance(names, dict):  # timm allows {index: name}
        names = [names.get(str(i), names.get(i)) for i in range(len(names))]
    named = names and len(names) == config.get("num_classes") and all(isinstance(n, str) for n in names)
    hints = dict(num_heads=args.get("num_heads") or HEADS_BY_NAME.get(size and size[1]),
                 input_size=args.get("img_size") or (pretrained.get("input_size") or [None])[1:],
                 pooling=_POOLING.get(config.get("global_pool")), image_mean=pretrained.get("mean"),
                 image_std=pretrained.get("std"), class_names=names if named else None,
                 num_channels=args.get("in_chans"), resample_keep_aspect=args.get("pos_embed_ar_preserving"))
    if pretrained.get("interpolation") in RESIZE:
        hints.update(image_resize=pretrained["interpolation"], image_antialias=True, image_crop="center")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in hints.items() if v}


def write(model, path):
    """Writes `model` as a timm state dict whose metadata holds every `ViT` argument: in
    NaFlexVit's layout for a model of patch sequences (`max_seq_len`) or with factorized position
    embeddings, else in VisionTransformer's; see `keras_vit.save_checkpoint`."""
    config = model.get_config()
    naflex = model.max_seq_len is not None or model.position_embedding_kind == "factorized"
    r.refuse(config, {**_CANNOT_HOLD, **(_NAFLEX_CANNOT_HOLD if naflex else {})},
             "timm NaFlexVit" if naflex else "timm")
    p = model.num_prefix_tokens
    table = rules(p, p, model.grid_size if naflex else None)
    values = fold_prefix_rows(weights(model), model) if naflex else None
    tensors = r.tensors(table, model, "the timm format", values)
    safetensors.write(path, tensors, {"format": "pt", r.SAVED: json.dumps({**config, "grid": model.grid_size})})


def fold_prefix_rows(values, model):
    """`values` ({path: array}, `weights(model)`) with the position table's prefix rows added to the
    class and register tokens and set to zero: the same sums, in NaFlexVit's layout, which gives
    prefix tokens no position row (as timm's `checkpoint_filter_fn` converts a ViT's)."""
    if model.position_embedding_kind != "learned" or not model.num_prefix_tokens:
        return values
    values, table = dict(values), values[POSITIONS].copy()
    first = 0
    for key, count in (("class_token/token", int(model.class_token)), ("registers/tokens", model.num_register_tokens)):
        if count:
            values[key] = values[key] + table[:, first:first + count]  # (1, count, D)
            first += count
    table[:, :first] = 0.0
    values[POSITIONS] = table
    return values

"""timm `VisionTransformer` state dicts as `.safetensors`, read and written.

timm keeps PyTorch layouts: Conv2d (D, C, P, P), Linear (out, in), and one fused qkv Linear
(3D, D) whose rows are [q; k; v], each split into K heads of Dh. Register tokens are `reg_token`
(1, R, D), LayerScale vectors `blocks.{i}.ls{1,2}.gamma`, and a MAP head is `attn_pool`
(`AttentionPoolLatent`: latent, q, fused kv with rows [k; v], proj, norm, mlp.fc1/fc2).
Shapes: P patch, C channels, D width, K heads, Dh = D / K, M MLP width, N classes, T position
rows, R registers.
"""

import json
import math
import re

import keras
import numpy as np

from keras_vit.checkpoints import safetensors_io
from keras_vit.checkpoints.canonical import (
    BLOCK, LAYER_SCALE, LN1, LN2, MAP, MAP_MHA, MHA, MLP, POS, REG, canonical_shapes, model_variables,
)
from keras_vit.checkpoints.common import build_model, check_tensors, grid_from_rows, source_grid_override

# timm's vision_transformer default config: exact GELU, bicubic resampling, inception mean/std 0.5,
# i.e. inputs in [-1, 1].
DEFAULTS = dict(gelu_approximate=False, resample_method="bicubic", image_mean=(0.5,) * 3, image_std=(0.5,) * 3)

# The head count is not in a timm state dict. These are the widths of timm's ViT-Ti/S/B/L/H
# (patch 14-32) with their head counts; anything else needs num_heads=.
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}
# timm's ViT names give the size ("vit_base_patch16_224"); these are its head counts per size.
HEADS_BY_NAME = {"tiny": 3, "small": 6, "medium": 8, "betwixt": 10, "base": 12, "large": 16, "huge": 16,
                 "giant": 16, "gigantic": 16}
# timm's global_pool -> keras_vit's pooling
_POOLING = {"token": "token", "avg": "gap", "map": "map"}
_META = "keras_vit"  # metadata key of the files that save_checkpoint writes
_LS = re.compile(r"Transformer/encoderblock_(\d+)/LayerScale_(\d)/scale")
_TIMM_LS = re.compile(r"blocks\.(\d+)\.ls([12])\.gamma")
# The ViT options that timm's VisionTransformer state dict cannot express, at their plain values.
_WRITABLE = dict(qk_norm=False, parallel_block=False, use_bias=True, stem=None)


def from_canonical(t, spec):
    """Canonical tensors -> timm state dict (numpy)."""
    d = spec["hidden_dim"]
    sd = {"patch_embed.proj.weight": t["embedding/kernel"].transpose(3, 2, 0, 1),  # (P, P, C, D) -> (D, C, P, P)
          "patch_embed.proj.bias": t["embedding/bias"], "pos_embed": t[POS]}
    if "cls" in t:
        sd["cls_token"] = t["cls"]
    sd.update(_variants_from_canonical(t, d))  # reg_token, attn_pool
    for i in range(spec["num_layers"]):
        b, a = BLOCK.format(i), f"blocks.{i}."
        qkv = [t[f"{b}{MHA}{n}/kernel"].reshape(d, d).T for n in ("query", "key", "value")]  # (D, K, Dh) -> (K*Dh, D)
        sd[a + "attn.qkv.weight"] = np.concatenate(qkv, axis=0)  # (3D, D)
        sd[a + "attn.qkv.bias"] = np.concatenate([t[f"{b}{MHA}{n}/bias"].reshape(d) for n in ("query", "key", "value")])
        sd[a + "attn.proj.weight"] = t[f"{b}{MHA}out/kernel"].reshape(d, d).T  # (K, Dh, D) -> (D, K*Dh)
        sd[a + "attn.proj.bias"] = t[f"{b}{MHA}out/bias"]
        for ln, norm in ((LN1, "norm1"), (LN2, "norm2")):
            sd[f"{a}{norm}.weight"], sd[f"{a}{norm}.bias"] = t[b + ln + "scale"], t[b + ln + "bias"]
        for j in range(2):
            sd[f"{a}mlp.fc{j + 1}.weight"] = t[f"{b}{MLP}Dense_{j}/kernel"].T  # (in, out) -> (out, in)
            sd[f"{a}mlp.fc{j + 1}.bias"] = t[f"{b}{MLP}Dense_{j}/bias"]
    norm, key = ("fc_norm/", "fc_norm.") if "fc_norm/scale" in t else ("Transformer/encoder_norm/", "norm.")
    sd[key + "weight"], sd[key + "bias"] = t[norm + "scale"], t[norm + "bias"]
    # Older timm releases called the tanh representation layer pre_logits.fc.
    for name, key in (("pre_logits", "pre_logits.fc"), ("head", "head")):
        if name + "/kernel" in t:
            sd[key + ".weight"], sd[key + ".bias"] = t[name + "/kernel"].T, t[name + "/bias"]
    return sd


def to_canonical(sd, spec):
    """timm state dict -> canonical tensors; the inverse of `from_canonical`."""
    d, k = spec["hidden_dim"], spec["num_heads"]
    t = {"embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # (D, C, P, P) -> (P, P, C, D)
         "embedding/bias": sd["patch_embed.proj.bias"], POS: sd["pos_embed"]}
    if "cls_token" in sd:
        t["cls"] = sd["cls_token"]
    t.update(_variants_to_canonical(sd, d, k))  # reg_token, attn_pool
    for i in range(spec["num_layers"]):
        b, a = BLOCK.format(i), f"blocks.{i}."
        q, kk, v = np.split(sd[a + "attn.qkv.weight"], 3, axis=0)  # (3D, D) -> 3 x (D, D)
        qb, kb, vb = np.split(sd[a + "attn.qkv.bias"], 3)
        for n, w, bias in (("query", q, qb), ("key", kk, kb), ("value", v, vb)):
            t[f"{b}{MHA}{n}/kernel"] = w.T.reshape(d, k, d // k)  # (K*Dh, D) -> (D, K, Dh)
            t[f"{b}{MHA}{n}/bias"] = bias.reshape(k, d // k)
        t[f"{b}{MHA}out/kernel"] = sd[a + "attn.proj.weight"].T.reshape(k, d // k, d)  # (D, K*Dh) -> (K, Dh, D)
        t[f"{b}{MHA}out/bias"] = sd[a + "attn.proj.bias"]
        for ln, norm in ((LN1, "norm1"), (LN2, "norm2")):
            t[b + ln + "scale"], t[b + ln + "bias"] = sd[f"{a}{norm}.weight"], sd[f"{a}{norm}.bias"]
        for j in range(2):
            t[f"{b}{MLP}Dense_{j}/kernel"] = sd[f"{a}mlp.fc{j + 1}.weight"].T
            t[f"{b}{MLP}Dense_{j}/bias"] = sd[f"{a}mlp.fc{j + 1}.bias"]
    norm, key = ("fc_norm/", "fc_norm.") if spec.get("fc_norm") else ("Transformer/encoder_norm/", "norm.")
    t[norm + "scale"], t[norm + "bias"] = sd[key + "weight"], sd[key + "bias"]
    for name, key in (("pre_logits", "pre_logits.fc"), ("head", "head")):
        if key + ".weight" in sd:
            t[name + "/kernel"], t[name + "/bias"] = sd[key + ".weight"].T, sd[key + ".bias"]
    return t


def load(path, overrides, hints=None):
    """Builds a `ViT` from a timm `.safetensors` state dict.

    `hints` (from `config_hints`) fill in what the tensors cannot say; the file's own keras_vit
    metadata and the user's overrides take precedence over them.
    """
    sd, metadata = safetensors_io.read(path)
    if "patch_embed.proj.weight" not in sd:
        raise ValueError(f"{path} has no 'patch_embed.proj.weight'; it is not a timm ViT state dict (found {sorted(sd)[:8]} ...)")
    saved = {**_grid_hint(hints or {}, sd), **json.loads(metadata.get(_META, "{}"))}
    spec = _spec(sd, saved, overrides)
    pos = sd["pos_embed"]
    prefix = int(spec["class_token"]) + spec["num_register_tokens"]
    if prefix and pos.shape[1] == spec["grid"][0] * spec["grid"][1]:
        # timm's no_embed_class: class and register tokens get no position; zero rows are the same thing.
        zeros = np.zeros((1, prefix, pos.shape[-1]), pos.dtype)
        sd = {**sd, "pos_embed": np.concatenate([zeros, pos], axis=1)}  # (1, N, D) -> (1, prefix + N, D)
    expected = _shapes(spec)
    check_tensors({k: v.shape for k, v in sd.items()}, expected, str(path))
    return build_model(spec, to_canonical(sd, spec), DEFAULTS, overrides)


def config_hints(config):
    """What a timm `config.json` (as in timm's Hub repos) says beyond the tensors, in the vocabulary
    of the keras_vit metadata: num_heads, input size, pooling, normalization, class names."""
    pretrained = config.get("pretrained_cfg") or {}
    args = config.get("model_args") or {}
    hints = {}
    size = re.match(r"vit_(\w+?)_", config.get("architecture", ""))
    heads = args.get("num_heads") or HEADS_BY_NAME.get(size.group(1) if size else None)
    if heads:
        hints["num_heads"] = int(heads)
    image_size = args.get("img_size") or (pretrained.get("input_size") or [None])[1:]
    if image_size:
        hints["input_size"] = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    pool = _POOLING.get(config.get("global_pool"))
    if pool:
        hints["pooling"] = pool
    for ours, theirs in (("image_mean", "mean"), ("image_std", "std")):
        if pretrained.get(theirs):
            hints[ours] = tuple(float(v) for v in pretrained[theirs])
    names = config.get("label_names") or pretrained.get("label_names")
    if isinstance(names, dict):  # timm allows {index: name}
        names = [names.get(str(i), names.get(i)) for i in range(len(names))]
    if names and len(names) == config.get("num_classes") and all(isinstance(n, str) for n in names):
        hints["class_names"] = tuple(names)
    return hints


def _grid_hint(hints, sd):
    """`hints` with its input size turned into the patch grid, kept only when the position table
    has that many rows (with or without the class and register tokens' rows)."""
    hints = dict(hints)
    size = hints.pop("input_size", None)
    if size is None:
        return hints
    p = sd["patch_embed.proj.weight"].shape[-1]
    grid = (size[0] // p, size[1] // p)
    prefix = int("cls_token" in sd) + _variants_spec(sd)["num_register_tokens"]
    if sd["pos_embed"].shape[1] in (grid[0] * grid[1], grid[0] * grid[1] + prefix):
        hints["grid"] = grid
    return hints


def _shapes(spec):
    """timm name -> shape, from the canonical shapes (zero-stride views, so nothing is allocated)."""
    zeros = {k: np.broadcast_to(np.float32(0), s) for k, s in canonical_shapes(spec).items()}
    return {k: v.shape for k, v in from_canonical(zeros, spec).items()}


def _spec(sd, saved, overrides):
    """The architecture from tensor shapes; heads, grid and preprocessing from our metadata when
    the file came from `save_checkpoint`, else from `num_heads=` or the standard width table."""
    d, c, p, _ = sd["patch_embed.proj.weight"].shape
    num_heads = overrides.pop("num_heads", None) or saved.get("num_heads") or HEADS_BY_WIDTH.get(int(d))
    if num_heads is None:
        raise ValueError(
            f"a timm state dict does not store the head count and width {d} is not a standard one "
            f"{sorted(HEADS_BY_WIDTH)}; pass num_heads=..."
        )
    class_token = "cls_token" in sd
    source_grid = source_grid_override(overrides, int(p)) or saved.get("grid")
    rows = sd["pos_embed"].shape[1]
    prefix = int(class_token) + _variants_spec(sd)["num_register_tokens"]
    if source_grid is None and prefix and math.isqrt(rows - prefix) ** 2 == rows - prefix:
        rows -= prefix  # the class and register tokens' rows
    elif source_grid is not None and prefix and rows == source_grid[0] * source_grid[1] + prefix:
        rows -= prefix
    config = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k not in ("num_heads", "grid", "class_names")}
    head = "head.weight" in sd
    spec = dict(
        patch_size=int(p), num_channels=int(c), hidden_dim=int(d), num_heads=int(num_heads),
        num_layers=len({k.split(".")[1] for k in sd if k.startswith("blocks.")}),
        mlp_dim=int(sd["blocks.0.mlp.fc1.weight"].shape[0]) if "blocks.0.mlp.fc1.weight" in sd else 4 * int(d),
        num_classes=int(sd["head.weight"].shape[0]) if head else 0,
        representation_size=int(sd["pre_logits.fc.weight"].shape[0]) if "pre_logits.fc.weight" in sd else None,
        class_token=class_token, grid=grid_from_rows(rows, source_grid), config=config,
        # fc_norm exists only with average pooling in timm; the pooling of the others is ambiguous
        # with a class token ("token" is assumed, override with pooling=).
        fc_norm="fc_norm.weight" in sd,
        pooling=saved.get("pooling") or ("gap" if "fc_norm.weight" in sd or not class_token else "token"),
        class_names=saved.get("class_names"),
    )
    return {**spec, **_variants_spec(sd)}  # registers, MAP pooling


def save(model, path):
    """Writes `model` as a timm state dict; see `keras_vit.save_checkpoint`."""
    if unsupported_options(model):
        raise ValueError(f"the timm writer does not support {', '.join(unsupported_options(model))}")
    if model.representation_size:
        raise ValueError("timm's VisionTransformer has no pre-logits layer; this model has representation_size="
                         f"{model.representation_size}, so it cannot be saved in the timm format")
    spec = dict(hidden_dim=model.hidden_dim, num_layers=model.num_layers)
    tensors = {k: np.asarray(keras.ops.convert_to_numpy(v), "float32") for k, v in model_variables(model).items()}
    sd = {k: np.ascontiguousarray(v) for k, v in from_canonical(tensors, spec).items()}
    config = model.get_config()
    saved = {k: config[k] for k in ("num_heads", "pooling", "layer_norm_epsilon", "gelu_approximate",
                                    "image_mean", "image_std", "resample_method", "class_names")}
    saved["grid"] = model.grid_size
    safetensors_io.write(path, sd, {"format": "pt", _META: json.dumps(saved)})


def unsupported_options(model):
    """The options of `model` that the timm state-dict writer cannot express, as "name=value"."""
    config = model.get_config()
    return [f"{k}={config[k]!r}" for k, default in _WRITABLE.items() if config[k] != default]


def _variants_spec(sd):
    """The registers, pooling and LayerScale a timm state dict implies."""
    spec = {"num_register_tokens": int(sd["reg_token"].shape[1]) if "reg_token" in sd else 0,
            "layer_scale": "blocks.0.ls1.gamma" in sd}
    if "attn_pool.latent" in sd:
        spec["pooling"] = "map"
    return spec


def _variants_to_canonical(sd, d, k):
    """timm's reg_token, ls{1,2}.gamma and attn_pool tensors -> canonical ones."""
    t = {REG: sd["reg_token"]} if "reg_token" in sd else {}
    for name in sd:
        match = _TIMM_LS.fullmatch(name)
        if match:
            t[LAYER_SCALE.format(match.group(1), int(match.group(2)) - 1)] = sd[name]
    if "attn_pool.latent" not in sd:
        return t
    p = "attn_pool."
    t[MAP + "probe"] = sd[p + "latent"]
    ks, vs = np.split(sd[p + "kv.weight"], 2, axis=0)  # (2D, D) rows [k; v] -> 2 x (D, D)
    kb, vb = np.split(sd[p + "kv.bias"], 2)
    for n, w, b in (("query", sd[p + "q.weight"], sd[p + "q.bias"]), ("key", ks, kb), ("value", vs, vb)):
        t[f"{MAP_MHA}{n}/kernel"] = w.T.reshape(d, k, d // k)  # (K*Dh, D) -> (D, K, Dh)
        t[f"{MAP_MHA}{n}/bias"] = b.reshape(k, d // k)
    t[MAP_MHA + "out/kernel"] = sd[p + "proj.weight"].T.reshape(k, d // k, d)  # (D, K*Dh) -> (K, Dh, D)
    t[MAP_MHA + "out/bias"] = sd[p + "proj.bias"]
    t[MAP + "LayerNorm_0/scale"], t[MAP + "LayerNorm_0/bias"] = sd[p + "norm.weight"], sd[p + "norm.bias"]
    for j in range(2):
        t[f"{MAP}MlpBlock_0/Dense_{j}/kernel"] = sd[f"{p}mlp.fc{j + 1}.weight"].T  # (out, in) -> (in, out)
        t[f"{MAP}MlpBlock_0/Dense_{j}/bias"] = sd[f"{p}mlp.fc{j + 1}.bias"]
    return t


def _variants_from_canonical(t, d):
    """Canonical registers, LayerScale and MAP head -> timm's tensors; the inverse of `_variants_to_canonical`."""
    sd = {"reg_token": t[REG]} if REG in t else {}
    for name in t:
        match = _LS.fullmatch(name)
        if match:
            sd[f"blocks.{match.group(1)}.ls{int(match.group(2)) + 1}.gamma"] = t[name]
    if MAP + "probe" not in t:
        return sd
    p = "attn_pool."
    sd[p + "latent"] = t[MAP + "probe"]
    w = {n: t[f"{MAP_MHA}{n}/kernel"].reshape(d, d).T for n in ("query", "key", "value")}  # (D, K, Dh) -> (K*Dh, D)
    b = {n: t[f"{MAP_MHA}{n}/bias"].reshape(d) for n in ("query", "key", "value")}
    sd[p + "q.weight"], sd[p + "q.bias"] = w["query"], b["query"]
    sd[p + "kv.weight"] = np.concatenate([w["key"], w["value"]], axis=0)  # (2D, D)
    sd[p + "kv.bias"] = np.concatenate([b["key"], b["value"]])
    sd[p + "proj.weight"], sd[p + "proj.bias"] = t[MAP_MHA + "out/kernel"].reshape(d, d).T, t[MAP_MHA + "out/bias"]
    sd[p + "norm.weight"], sd[p + "norm.bias"] = t[MAP + "LayerNorm_0/scale"], t[MAP + "LayerNorm_0/bias"]
    for j in range(2):
        sd[f"{p}mlp.fc{j + 1}.weight"] = t[f"{MAP}MlpBlock_0/Dense_{j}/kernel"].T
        sd[f"{p}mlp.fc{j + 1}.bias"] = t[f"{MAP}MlpBlock_0/Dense_{j}/bias"]
    return sd

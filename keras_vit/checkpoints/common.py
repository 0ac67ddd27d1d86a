"""What every checkpoint format shares: the canonical tensor names, the strict check, and building
a `ViT` from a set of canonical tensors.

The canonical names are those of Google's original vit_jax checkpoints ("embedding/kernel",
"Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel", ...), and the canonical
layouts are Keras': Conv2D (P, P, C, D), Dense (in, out), MultiHeadAttention (D, K, Dh) and
(K, Dh, D). The two coincide, so Google's files load with renaming only; timm and Hugging Face
files are transposed into them. Shapes: P patch, C channels, D width, K heads, Dh = D / K,
M MLP width, T position rows, R pre-logits width, N classes.
"""

import math
import pathlib

import numpy as np

from keras_vit.checkpoints import hybrid, variants
from keras_vit.layers import resample_position_embedding
from keras_vit.models import ViT, new_head_config

POS = "Transformer/posembed_input/pos_embedding"
BLOCK = "Transformer/encoderblock_{}/"
MHA, LN1, LN2, MLP = "MultiHeadDotProductAttention_1/", "LayerNorm_0/", "LayerNorm_2/", "MlpBlock_3/"

# Constructor arguments a user may override at load time: none of them changes a stored tensor's
# shape, except image_size (the position table is resampled) and num_classes (a new head).
OVERRIDES = (
    "image_size", "num_classes", "gelu_approximate", "resample_method", "image_mean", "image_std",
    "layer_norm_epsilon", "pooling", "dropout_rate", "attention_dropout_rate", "drop_path_rate",
    "class_names", "dtype", "name",
)

FAMILY_DEFAULTS = {
    # Flax's GELU is the tanh form; the official fine-tuning code resamples bilinearly and feeds
    # pixels in [-1, 1].
    "google": dict(gelu_approximate=True, resample_method="bilinear", image_mean=(0.5,) * 3, image_std=(0.5,) * 3),
    # timm's vision_transformer default config: inception mean/std 0.5, i.e. [-1, 1].
    "timm": dict(gelu_approximate=False, resample_method="bicubic", image_mean=(0.5,) * 3, image_std=(0.5,) * 3),
    # ViTImageProcessor's defaults, used when the folder has no preprocessor_config.json.
    "hf": dict(gelu_approximate=False, resample_method="bicubic", image_mean=(0.5,) * 3, image_std=(0.5,) * 3),
}


def canonical_shapes(spec):
    """Name -> shape of every tensor of the ViT that `spec` describes.

    `spec` holds patch_size, num_channels, hidden_dim, num_layers, num_heads, mlp_dim, num_classes,
    representation_size, class_token, grid (h, w) and optionally fc_norm, pooling,
    num_register_tokens, layer_scale (bool) and position_embedding ("learned" or "sincos").
    """
    p, c, d, m = spec["patch_size"], spec["num_channels"], spec["hidden_dim"], spec["mlp_dim"]
    k = spec["num_heads"]
    shapes = {"embedding/kernel": (p, p, c, d), "embedding/bias": (d,), **hybrid.stem_shapes(spec)}
    if spec["class_token"]:
        shapes["cls"] = (1, 1, d)
    if spec.get("position_embedding", "learned") == "learned":  # a sin-cos table is computed, not stored
        prefix = int(spec["class_token"]) + spec.get("num_register_tokens", 0)
        shapes[POS] = (1, prefix + spec["grid"][0] * spec["grid"][1], d)
    shapes.update(variants.extra_shapes(spec))  # register tokens, MAP head, LayerScale
    for i in range(spec["num_layers"]):
        b = BLOCK.format(i)
        for norm in (LN1, LN2):
            shapes.update({b + norm + "scale": (d,), b + norm + "bias": (d,)})
        for n in ("query", "key", "value"):
            shapes.update({f"{b}{MHA}{n}/kernel": (d, k, d // k), f"{b}{MHA}{n}/bias": (k, d // k)})
        shapes.update({f"{b}{MHA}out/kernel": (k, d // k, d), f"{b}{MHA}out/bias": (d,)})
        shapes.update({f"{b}{MLP}Dense_0/kernel": (d, m), f"{b}{MLP}Dense_0/bias": (m,)})
        shapes.update({f"{b}{MLP}Dense_1/kernel": (m, d), f"{b}{MLP}Dense_1/bias": (d,)})
    # timm's fc_norm models normalize the pooled features instead of the encoder output.
    norm = "fc_norm/" if spec.get("fc_norm") else "Transformer/encoder_norm/"
    shapes.update({norm + "scale": (d,), norm + "bias": (d,)})
    width = d
    if spec["representation_size"]:
        width = spec["representation_size"]
        shapes.update({"pre_logits/kernel": (d, width), "pre_logits/bias": (width,)})
    if spec["num_classes"]:
        shapes.update({"head/kernel": (width, spec["num_classes"]), "head/bias": (spec["num_classes"],)})
    return shapes


def model_variables(model):
    """Canonical name -> the Keras variable of `model` that holds it."""
    v = {"embedding/kernel": model.patch_embedding.conv.kernel, "embedding/bias": model.patch_embedding.conv.bias}
    v.update(hybrid.stem_variables(model))
    v.update(variants.extra_variables(model))
    if model.cls_token is not None:
        v["cls"] = model.cls_token.token
    v[POS] = model.position_embedding.embedding
    for i, block in enumerate(model.encoder.blocks):
        b = BLOCK.format(i)
        attn = block.attn
        denses = {"query": attn.query_dense, "key": attn.key_dense, "value": attn.value_dense, "out": attn.output_dense}
        for n, dense in denses.items():
            v.update({f"{b}{MHA}{n}/kernel": dense.kernel, f"{b}{MHA}{n}/bias": dense.bias})
        for prefix, layer in ((LN1, block.norm1), (LN2, block.norm2)):
            v.update({b + prefix + "scale": layer.gamma, b + prefix + "bias": layer.beta})
        for j, dense in enumerate((block.fc1, block.fc2)):
            v.update({f"{b}{MLP}Dense_{j}/kernel": dense.kernel, f"{b}{MLP}Dense_{j}/bias": dense.bias})
    for name, norm in (("Transformer/encoder_norm", model.encoder.norm), ("fc_norm", model.head.pool_norm)):
        if norm is not None:
            v.update({name + "/scale": norm.gamma, name + "/bias": norm.beta})
    for name, dense in (("pre_logits", model.head.pre_logits), ("head", model.head.classifier)):
        if dense is not None:
            v.update({f"{name}/kernel": dense.kernel, f"{name}/bias": dense.bias})
    v = {k: var for k, var in v.items() if var is not None}
    mapped = {id(var) for var in v.values()}
    unmapped = [var.path for var in model.weights if id(var) not in mapped]
    if unmapped:
        raise ValueError(f"checkpoints hold plain ViTs; this model has weights they cannot hold: {unmapped}")
    return v


def check_tensors(found, expected, source):
    """Raises one ValueError naming every missing, unexpected and mis-shaped tensor.

    Args:
        found, expected: name -> shape.
        source: how to name the file in the message.
    """
    problems = [f"missing {k} {tuple(s)}" for k, s in expected.items() if k not in found]
    problems += [f"unexpected {k} {tuple(s)}" for k, s in found.items() if k not in expected]
    problems += [
        f"wrong shape {k}: {tuple(found[k])}, expected {tuple(s)}"
        for k, s in expected.items()
        if k in found and tuple(found[k]) != tuple(s)
    ]
    if problems:
        raise ValueError(f"{source} does not match a ViT layout; nothing was loaded:\n  " + "\n  ".join(problems))


def check_finite(tensors):
    """Raises one ValueError naming every tensor that holds NaN or Inf (a broken or tampered
    file: the model would only ever output NaN)."""
    # min and max propagate NaN and reach +-Inf, and unlike np.isfinite allocate nothing.
    bad = [f"{k} ({int(np.isnan(v).sum())} NaN, {int(np.isinf(v).sum())} Inf)" for k, v in tensors.items()
           if v.dtype.kind == "f" and v.size and not (np.isfinite(v.min()) and np.isfinite(v.max()))]
    if bad:
        raise ValueError("the checkpoint has non-finite weights; nothing was loaded:\n  " + "\n  ".join(bad)
                         + "\npass allow_nonfinite=True to load it anyway")


def grid_from_rows(rows, source_grid=None):
    """The (h, w) grid of a position table with `rows` patch rows: `source_grid` when known,
    else the square one. Non-square grids are not recoverable from the tensor alone."""
    if source_grid is not None:
        if source_grid[0] * source_grid[1] != rows:
            raise ValueError(f"the checkpoint's position table has {rows} patch rows, not grid {tuple(source_grid)}")
        return tuple(source_grid)
    side = math.isqrt(rows)
    if side * side != rows:
        raise ValueError(
            f"the checkpoint's position table has {rows} patch rows, which is not a square grid; "
            "pass source_image_size=(H, W), the resolution it was trained at"
        )
    return (side, side)


def source_grid_override(overrides, patch_size):
    """(h, w) from a `source_image_size` override, or None."""
    size = overrides.pop("source_image_size", None)
    if size is None:
        return None
    size = (size, size) if isinstance(size, int) else tuple(size)
    return (size[0] // patch_size, size[1] // patch_size)


def read_labels(path, num_classes):
    """Class names from a text file, one per line."""
    names = [line.strip() for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
    if len(names) != num_classes:
        raise ValueError(f"labels file {path} has {len(names)} names but the model has num_classes={num_classes}")
    return tuple(names)


def imagenet_classes():
    """The 1000 ImageNet-1k class names in label order (WordNet lemmas, from timm's data files)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "data" / "imagenet_classes.txt"
    return tuple(path.read_text().splitlines())


def build_model(spec, tensors, family, overrides):
    """A `ViT` holding the canonical `tensors`, with the user's `overrides` applied.

    Args:
        spec: as in `canonical_shapes`, plus optional "config" (constructor defaults the source
            states, e.g. its epsilon or normalization) and "class_names".
        tensors: canonical name -> array; must match `canonical_shapes(spec)` exactly.
        family: "google", "timm" or "hf", for the defaults of `FAMILY_DEFAULTS`.
        overrides: user arguments, a subset of `OVERRIDES` plus "labels" (a file of class names).
    """
    labels = overrides.pop("labels", None)
    allow_nonfinite = overrides.pop("allow_nonfinite", False)
    unknown = sorted(set(overrides) - set(OVERRIDES))
    if unknown:
        raise ValueError(f"load_checkpoint got {unknown}; it reads the architecture from the file and takes only "
                         f"{OVERRIDES}, labels, source_image_size, allow_nonfinite")
    check_tensors({k: v.shape for k, v in tensors.items()}, canonical_shapes(spec), "converted checkpoint")
    if overrides.get("pooling") == "map" and spec.get("pooling") != "map":
        raise ValueError("pooling='map' needs the checkpoint's MAP head, and this checkpoint has none; "
                         f"it pools with {spec.get('pooling', 'token')!r}")
    p, grid = spec["patch_size"], spec["grid"]
    config = dict(FAMILY_DEFAULTS[family])
    config.update(spec.get("config", {}))
    config.update(
        image_size=(grid[0] * p, grid[1] * p), patch_size=p, num_channels=spec["num_channels"],
        hidden_dim=spec["hidden_dim"], num_layers=spec["num_layers"], num_heads=spec["num_heads"],
        mlp_dim=spec["mlp_dim"], num_classes=spec["num_classes"], representation_size=spec["representation_size"],
        class_token=spec["class_token"], pooling=spec.get("pooling", "token" if spec["class_token"] else "gap"),
        num_register_tokens=spec.get("num_register_tokens", 0),
        class_names=spec.get("class_names"), fc_norm=bool(spec.get("fc_norm")),
        position_embedding=spec.get("position_embedding", "learned"),
    )
    if spec.get("layer_scale"):
        config.setdefault("layer_scale_init", 1.0)  # the stored scales replace it
    config.update(hybrid.stem_config(spec))
    for key in ("image_mean", "image_std"):
        value = tuple(config[key])
        if len(value) != config["num_channels"] and len(set(value)) == 1:
            # A default or stated constant (0.5 for every channel) fits a model of any channel count.
            config[key] = value[:1] * config["num_channels"]
    config.update(overrides)
    tensors = dict(tensors)
    if config["num_classes"] != spec["num_classes"]:
        tensors.pop("head/kernel", None), tensors.pop("head/bias", None)  # a new task: the old classifier goes
        config = new_head_config(config, config["num_classes"], overrides.get("class_names"))
    if labels is not None:
        config["class_names"] = read_labels(labels, config["num_classes"])
    elif config["class_names"] is None and config["num_classes"] == 1000:
        config["class_names"] = imagenet_classes()
    if not allow_nonfinite:
        check_finite(tensors)
    model = ViT(**config)
    if POS in tensors:
        tensors[POS] = resample_position_embedding(
            np.asarray(tensors[POS], "float32"), grid, model.grid_size, num_prefix_tokens=model.num_prefix_tokens,
            method=model.resample_method,
        )
    for name, variable in model_variables(model).items():
        if name in tensors:
            variable.assign(np.asarray(tensors[name], "float32"))
    return model

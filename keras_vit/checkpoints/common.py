"""What every checkpoint format shares, whatever its layout: the strict checks of names, shapes
and values, the position grid, label names, and building a `ViT` from canonical tensors (see
`canonical`). Shapes: T position rows, D width.
"""

import math
import pathlib

import numpy as np

from keras_vit.checkpoints.canonical import POS, canonical_shapes, model_variables, stem_config
from keras_vit.layers import resample_position_embedding
from keras_vit.models import ViT, new_head_config

# Constructor arguments a user may override at load time: none of them changes a stored tensor's
# shape, except image_size (the position table is resampled) and num_classes (a new head).
OVERRIDES = (
    "image_size", "num_classes", "gelu_approximate", "resample_method", "image_mean", "image_std",
    "layer_norm_epsilon", "pooling", "dropout_rate", "attention_dropout_rate", "drop_path_rate",
    "class_names", "dtype", "name",
)

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
    names = [line.strip() for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(names) != num_classes:
        raise ValueError(f"labels file {path} has {len(names)} labels but the model has num_classes={num_classes}")
    return tuple(names)


def imagenet_classes():
    """The 1000 ImageNet-1k class names in label order (WordNet lemmas, from timm's data files)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "data" / "imagenet_classes.txt"
    return tuple(path.read_text().splitlines())


def build_model(spec, tensors, defaults, overrides):
    """A `ViT` holding the canonical `tensors`, with the user's `overrides` applied.

    Args:
        spec: as in `canonical_shapes`, plus optional "config" (constructor defaults the source
            states, e.g. its epsilon or normalization) and "class_names".
        tensors: canonical name -> array; must match `canonical_shapes(spec)` exactly.
        defaults: the format's constructor defaults (its GELU form, resampling and normalization),
            which the spec's "config" and the overrides take precedence over.
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
    config = dict(defaults)
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
    config.update(stem_config(spec))
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

"""The file of out-of-domain statistics, `ood.npz` beside a checkpoint (`stats_path`): `save` writes
a `Stats`, `load` reads one back with every name, shape and size checked (allow_pickle=False), and
`load_for` finds the file of a checkpoint.

Shapes: S feature sets, C classes, D width, N training features kept by "knn", R residual dimensions.
"""

import os

import numpy as np

from keras_vit.ood.features import feature_width
from keras_vit.ood.scores import METHODS, Stats

FILENAME = "ood.npz"
FORMAT = 2  # version 1 (keras_vit before the six scores) held Mahalanobis statistics of every block
MAX_OFF_CHARS = 500  # the longest `Stats.off` that `load` reads
MAX_FILE_BYTES = 512 * 2**20  # a KNN bank of 10,000 x 768 float32 is 31 MB; Mahalanobis of 13 ViT-B sets 67 MB
# The arrays that each method keeps (S feature sets first), for `load`'s checks.
ARRAYS = {"msp": (), "energy": (), "mahalanobis": ("means", "precision"),
          "rmds": ("means", "precision", "global_mean", "global_precision"),
          "vim": ("origin", "null_space", "alpha"), "knn": ("bank", "neighbours")}


def stats_path(checkpoint):
    """Where the statistics of `checkpoint` live: `ood.npz` in its folder (or in it, for a folder)."""
    folder = checkpoint if os.path.isdir(checkpoint) else os.path.dirname(os.path.abspath(checkpoint))
    return os.path.join(folder, FILENAME)


def save(stats, path):
    """Writes `stats` to `path` (.npz, no pickled objects), through a temporary file and a rename."""
    partial = f"{path}.partial.npz"
    # float64: a precision matrix can be ill-conditioned enough that float32 moves the scores; the
    # KNN bank of unit vectors is float32, half the size.
    arrays = {f"array_{k}": np.asarray(v, "float32" if k == "bank" else "float64") for k, v in stats.arrays.items()}
    arrays.update(format=np.int64(FORMAT), method=np.str_(stats.method), blocks=np.asarray(stats.blocks, "int64"),
                  pooled=np.bool_(stats.pooled),
                  num_classes=np.int64(stats.num_classes), width=np.int64(stats.width))
    if stats.threshold is not None:
        arrays.update(threshold=np.float64(stats.threshold), false_alarm=np.float64(stats.false_alarm),
                      reference=stats.reference.astype("float64"))
    if stats.off is not None:
        arrays.update(off=np.str_(stats.off))
    np.savez(partial, **arrays)
    os.replace(partial, path)


def load(path, model=None):
    """The `Stats` in `path`, read with allow_pickle=False; with `model`, checked against its classes,
    blocks and feature width. Raises ValueError for a file that is too large or holds other shapes."""
    size = os.path.getsize(path)
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{path} is {size} bytes; out-of-domain statistics are at most {MAX_FILE_BYTES}")
    with np.load(path, allow_pickle=False) as f:
        if "format" not in f.files and {"means", "precision"} <= set(f.files):
            raise ValueError(f"{path} holds out-of-domain statistics of an older keras_vit (format 1); write them "
                             "again with python -m training.ood_stats CHECKPOINT --dataset DATASET")
        missing = {"format", "method", "blocks", "pooled", "num_classes", "width"} - set(f.files)
        if missing:
            raise ValueError(f"{path} holds no out-of-domain statistics: {sorted(missing)} missing")
        if int(f["format"]) != FORMAT:
            raise ValueError(f"{path} has format {int(f['format'])}; this keras_vit reads format {FORMAT}")
        method = str(f["method"])
        if method not in METHODS:
            raise ValueError(f"{path}: unknown method {method!r}; expected one of {list(METHODS)}")
        names = {n[len("array_"):] for n in f.files if n.startswith("array_")}
        if names != set(ARRAYS[method]):
            raise ValueError(f"{path}: method {method!r} keeps arrays {sorted(ARRAYS[method])}, "
                             f"the file has {sorted(names)}")
        blocks, pooled = tuple(int(b) for b in f["blocks"]), bool(f["pooled"])
        num_classes, width = int(f["num_classes"]), int(f["width"])
        arrays = {n: f[f"array_{n}"].astype("float64") for n in ARRAYS[method]}
        threshold = reference = false_alarm = off = None
        if "threshold" in f.files:
            threshold, false_alarm, reference = float(f["threshold"]), float(f["false_alarm"]), f["reference"]
        if "off" in f.files:
            field = f["off"]
            if field.dtype.kind != "U" or field.shape != () or len(str(field)) > MAX_OFF_CHARS:
                raise ValueError(f"{path}: 'off' must be one text of at most {MAX_OFF_CHARS} characters; got "
                                 f"{field.dtype} of shape {field.shape}")
            off = str(field)
    if (not (blocks or pooled) or method == "vim" and blocks or len(set(blocks)) != len(blocks)
            or min(blocks, default=0) < 0):
        raise ValueError(f"{path}: {method} on blocks {list(blocks)} (pooled: {pooled}) "
                         "is not a choice of feature sets")
    _check_shapes(path, method, arrays, len(blocks) + pooled, num_classes, width)
    if reference is not None and (reference.ndim != 1 or len(reference) < 2 or np.any(np.diff(reference) < 0)):
        raise ValueError(f"{path}: the held-out scores must be a sorted list of at least 2; "
                         f"got shape {reference.shape}")
    if model is not None:
        expected = feature_width(model, blocks)
        if num_classes != model.num_classes or width != expected or any(b >= model.num_layers for b in blocks):
            raise ValueError(f"{path} holds statistics of {num_classes} classes and width {width} on blocks "
                             f"{list(blocks)} (pooled: {pooled}), but the model has {model.num_classes} classes, "
                             f"{model.num_layers} blocks and width {expected} there")
    if off is not None and threshold is not None:
        raise ValueError(f"{path} holds a threshold and says the check is off ({off!r}); it can be only one")
    return Stats(method, arrays, blocks, pooled, num_classes, width, threshold, false_alarm, reference, off)


def _check_shapes(path, method, a, sets, num_classes, width):
    """Raises ValueError unless the arrays `a` of `method` have the shapes of S = `sets` feature sets."""
    expected = {"means": (sets, num_classes, width), "precision": (sets, width, width),
                "global_mean": (sets, width), "global_precision": (sets, width, width),
                "origin": (1, width), "alpha": (1,), "neighbours": ()}
    for name, array in a.items():
        if name == "null_space":
            ok = array.ndim == 3 and array.shape[:2] == (1, width) and array.shape[2] < width
        elif name == "bank":
            ok = array.ndim == 3 and array.shape[0] == sets and array.shape[2] == width and array.shape[1] > 0
        else:
            ok = array.shape == expected[name]
        # Only a class without training images has NaN means (see `_class_gaussians`).
        if not ok or not np.isfinite(np.nan_to_num(array, nan=0.0) if name == "means" else array).all():
            raise ValueError(f"{path}: {method} array {name!r} has shape {array.shape}, which does not fit "
                             f"{sets} feature sets, {num_classes} classes and width {width}")
    if method == "knn" and not 0 < int(a["neighbours"]) <= a["bank"].shape[1]:
        raise ValueError(f"{path}: knn neighbours {int(a['neighbours'])} is not in 1..{a['bank'].shape[1]}")


def load_for(checkpoint, model=None):
    """The `Stats` stored beside `checkpoint` (see `stats_path`), or None when there are none."""
    path = stats_path(checkpoint)
    return load(path, model) if os.path.exists(path) else None


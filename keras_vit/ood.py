"""Out-of-domain scores: how unlike a classifier's training data an image is.

A classifier gives every image one of its classes, often with high confidence, a cat photo
included. These scores flag such images; each is larger for an image further from the training
data:

- "msp": 1 - the maximum softmax probability (Hendrycks & Gimpel, ICLR 2017).
- "energy": the negative log-sum-exp of the logits (Liu et al., NeurIPS 2020).
- "mahalanobis": the squared Mahalanobis distance to the nearest class mean, under one covariance
  shared by the classes (Lee et al., NeurIPS 2018).
- "rmds": relative Mahalanobis: that distance less the distance to the mean of all training
  features under their own covariance (Ren et al., 2021).
- "vim": virtual logit matching: the norm of the features' part outside the principal subspace of
  the training features, scaled to the logits, against the log-sum-exp of the logits (Wang et al.,
  CVPR 2022). Pooled features only: it reads the classifier's weights.
- "knn": the distance of the L2-normalized features to their k-th nearest training feature (Sun et
  al., ICML 2022).

The feature-space scores read the mean output token of chosen encoder blocks and/or the pooled
features that the classifier takes, and sum the score over these feature sets (`block_choice`). `fit` computes what they
need from training images in one call; `with_threshold` sets the threshold on held-out in-domain
images and keeps their scores, so that an image's score is also a percentile of them. `python -m
benchmarks.studies.ood` measures every score on near and far shifts (docs/app.md, "Out-of-domain warning"),
and DEFAULT_METHOD comes from its table.

The statistics are stored beside a checkpoint as `ood.npz` (`stats_path`): the training CLI writes
it, and `load_for` finds it for a checkpoint, so an application can warn:

    stats = keras_vit.ood.load_for("run/model.keras", model)   # None when there is none
    if stats is not None:
        verdict = keras_vit.ood.check(model, pixels, stats)    # .score, .percentile, .unusual
        print(verdict.message(0))   # "This image is less like the training images than 99.8% of ..."

Shapes: B images, S feature sets (one per chosen block, then the pooled one), C classes, D width, N
training features kept by "knn".
"""

import dataclasses
import os

import numpy as np

# Keras and the rest of keras_vit load inside the functions that run a model: `check_choice` and
# the constants serve the training CLI's checks before any deep-learning library loads
# (training.preflight loads this file on its own).

METHODS = ("msp", "energy", "mahalanobis", "rmds", "vim", "knn")
LOGIT_METHODS = ("msp", "energy")  # they read the logits only
# Chosen by `python -m benchmarks.studies.ood` (benchmarks/results/ood.json, docs/app.md): the highest mean of
# near- and far-shift AUROC on the shipped checkpoint.
DEFAULT_METHOD = "mahalanobis"
DEFAULT_BLOCKS = "all+pooled"
POOLED = "pooled"
BLOCK_WORDS = (POOLED, "all", "all+pooled")
FILENAME = "ood.npz"
FORMAT = 2  # version 1 (keras_vit before the six scores) held Mahalanobis statistics of every block
MAX_OFF_CHARS = 500  # the longest `Stats.off` that `load` reads
MAX_FILE_BYTES = 512 * 2**20  # a KNN bank of 10,000 x 768 float32 is 31 MB; Mahalanobis of 13 ViT-B sets 67 MB
KNN_NEIGHBOURS = 50  # Sun et al.'s k for CIFAR-10 and OpenOOD's for ImageNet
KNN_BANK = 10_000  # training features kept by "knn", evenly spaced over the fit images
# The arrays that each method keeps (S feature sets first), for `load`'s checks.
ARRAYS = {"msp": (), "energy": (), "mahalanobis": ("means", "precision"),
          "rmds": ("means", "precision", "global_mean", "global_precision"),
          "vim": ("origin", "null_space", "alpha"), "knn": ("bank", "neighbours")}


@dataclasses.dataclass(frozen=True)
class Stats:
    """What a score needs of a model's training features, its threshold, and the held-out scores.

    Attributes:
        method: one of METHODS.
        arrays: {name: array} of the method (ARRAYS[method]): class means (S, C, D) and a shared
            precision (S, D, D) for "mahalanobis"; also the mean (S, D) and precision (S, D, D) of all
            features for "rmds"; the origin (1, D), a basis of the residual space (1, D, R) and the
            scale (1,) for "vim"; normalized features (S, N, D) and k for "knn".
        blocks: the encoder blocks whose mean token is scored.
        pooled: whether the pooled features (what the classifier takes) are scored too, after them.
        num_classes: C, the model's classes.
        width: D.
        threshold: scores above it are unusual (None until `with_threshold` sets it).
        false_alarm: the share of held-out in-domain images above `threshold` when it was chosen.
        reference: the sorted scores of those held-out images, for `percentile`.
        off: why the statistics have no threshold, in plain words for the page (training sets none
            when a run has too few images to set one: `training.ood_stats.too_few`), or None.
    """

    method: str
    arrays: dict
    blocks: tuple
    pooled: bool
    num_classes: int
    width: int
    threshold: float | None = None
    false_alarm: float | None = None
    reference: np.ndarray | None = None
    off: str | None = None

    def percentile(self, scores):
        """(B,) shares in percent of the held-out in-domain images that score lower than `scores`:
        50 for a typical image, 100 for one less like the training images than all of them."""
        if self.reference is None:
            raise ValueError("these statistics have no held-out scores; "
                             "set a threshold with keras_vit.ood.with_threshold")
        return 100.0 * np.searchsorted(self.reference, np.asarray(scores, "float64"), "left") / len(self.reference)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """`check`'s answer for B images: the (B,) scores, their (B,) percentiles among held-out
    in-domain images (see `Stats.percentile`), and (B,) flags: True above the threshold."""

    score: np.ndarray
    percentile: np.ndarray
    unusual: np.ndarray
    held_out: int

    def message(self, index=0):
        """The plain-words line for image `index`: "" when it is like the training images."""
        return describe(float(self.percentile[index]), bool(self.unusual[index]), self.held_out)


def describe(percentile, unusual, held_out):
    """One line for a user: "" for a usual image, else how many of `held_out` held-out training
    images are more like the training data, as a percentile (never the raw score)."""
    if not unusual:
        return ""
    if percentile >= 100.0:
        share = f"all {held_out:,} held-out ones"
    else:  # rounded down, so that 99.96 reads 99.9%, not "100%"
        share = f"{np.floor(percentile * 10) / 10:.1f}% of them"
    return f"This image is less like the training images than {share}, so these classes are guesses."


def block_choice(blocks, num_layers):
    """(block indices, pooled) of the feature sets that `blocks` names: "pooled" (the features the
    classifier takes), "all" or None (every block's mean token), "all+pooled" (both), an int n (the
    last n blocks), or a list of block indices (negative ones from the end) that may end in "pooled"."""
    from keras_vit.layers.transformer import select_blocks

    if isinstance(blocks, str):
        if blocks not in BLOCK_WORDS:
            raise ValueError(f"blocks={blocks!r} is not allowed; use one of {list(BLOCK_WORDS)}, None (every block), "
                             "an int n (the last n) or a list of block indices, optionally ending in 'pooled'")
        return (() if blocks == POOLED else select_blocks(None, num_layers)), blocks != "all"
    if isinstance(blocks, (list, tuple)) and blocks and blocks[-1] == POOLED:
        return (select_blocks(list(blocks[:-1]), num_layers) if len(blocks) > 1 else ()), True
    return select_blocks(blocks, num_layers), False


def features(model, pixels, blocks=DEFAULT_BLOCKS, batch_size=256):
    """(features (B, S, D), logits (B, C)) as float64 arrays for `pixels` (B, H, W, C) in [0, 255] at
    the model's image size: the mean output token of each block that `blocks` chooses, then the
    pooled features that the classifier takes when it chooses them (see `block_choice`).

    The model runs batch by batch through `keras_vit.autodiff.model_function` (see there: on JAX
    one compiled program per batch shape, never op by op), its outputs replicated over a
    distribution (`keras_vit.distribution.replicated`), so that every process reads the whole
    result; `predict` would split the batch across processes."""
    if model.num_classes == 0 or model.head.classifier is None:
        raise ValueError("out-of-domain scores need a classifier; this model has num_classes=0 (a feature extractor)")
    if model.head.pooling == "none":
        raise ValueError("out-of-domain scores need one prediction per image; this model has pooling='none' "
                         "(one per patch)")
    import keras

    from keras_vit.autodiff import model_function

    chosen, pooled = block_choice(blocks, model.num_layers)
    if chosen and pooled and _width(model, ()) != model.hidden_dim:
        raise ValueError(f"the pooled features have width {model.representation_size} (pre-logits) and the blocks "
                         f"{model.hidden_dim}, so they cannot be scored together; choose blocks={POOLED!r} or blocks")
    run = model_function(lambda vit, x: _features(vit, x, chosen, pooled), model)
    pixels = np.asarray(pixels, "float32")
    feats, logits = [], []
    for start in range(0, len(pixels), batch_size):
        f, lg = run(pixels[start:start + batch_size])
        feats.append(keras.ops.convert_to_numpy(f))
        logits.append(keras.ops.convert_to_numpy(lg))
    return np.concatenate(feats).astype("float64"), np.concatenate(logits).astype("float64")


def _features(vit, pixels, blocks, pooled):
    """A ViT's forward pass that also returns the features: pixels (B, H, W, C) -> (features
    (B, S, D), logits (B, C))."""
    from keras import ops

    from keras_vit.distribution import replicated

    x = vit.embed_tokens(vit.normalize(pixels), training=False)  # (B, T, D)
    sets = []
    for index, x, _ in vit.encoder.iterate(x, training=False):
        if index in blocks:
            sets.append(ops.cast(ops.mean(x, axis=1), "float32"))  # (B, T, D) -> (B, D)
    head_input = vit.head.features(vit.encoder.norm_output(x))  # (B, T, D) -> (B, D)
    if pooled:
        sets.append(ops.cast(head_input, "float32"))
    logits = ops.cast(vit.head.classifier(head_input), "float32")
    return replicated(ops.stack(sets, axis=1)), replicated(logits)


def fit(model, pixels, labels=None, method=DEFAULT_METHOD, blocks=DEFAULT_BLOCKS, batch_size=256, **options):
    """`Stats` (no threshold yet) of `method` on `model`'s features of in-domain `pixels` (B, H, W, C),
    grouped by `labels` (B,) or, without labels, by the model's predictions. `options` go to
    `fit_features` (e.g. neighbours=)."""
    check_method(method, blocks)
    feats, logits = features(model, pixels, blocks, batch_size)
    classifier = classifier_weights(model) if method == "vim" else None
    return fit_features(method, feats, logits, logits.argmax(-1) if labels is None else np.asarray(labels),
                        *block_choice(blocks, model.num_layers), classifier, **options)


def parse_blocks(text):
    """A command line's blocks for `block_choice`: one of BLOCK_WORDS, or indices such as "4,5" or
    "4,5,pooled" -> [4, 5, "pooled"]."""
    if text in BLOCK_WORDS:
        return text
    parts = text.split(",")
    try:
        return [int(p) for p in parts[:-1]] + [POOLED if parts[-1] == POOLED else int(parts[-1])]
    except ValueError:
        raise ValueError(f"blocks {text!r} is not allowed; use one of {list(BLOCK_WORDS)} or block indices such as "
                         "'4,5' or '4,5,pooled' (negative ones count from the end)") from None


def check_method(method, blocks=DEFAULT_BLOCKS):
    """Raises ValueError for a method not in METHODS, or "vim" on blocks."""
    if method not in METHODS:
        raise ValueError(f"Unknown out-of-domain method {method!r}; available: {list(METHODS)}")
    pooled_only = blocks == POOLED or isinstance(blocks, (list, tuple)) and list(blocks) == [POOLED]
    if method == "vim" and not pooled_only:
        raise ValueError(f"method 'vim' reads the classifier's weights, so it scores the pooled features only; "
                         f"got blocks={blocks!r}, use blocks={POOLED!r}")


def classifier_weights(model):
    """(kernel (D, C), bias (C,)) of the model's classifier, as float64 arrays."""
    from keras import ops

    dense = model.head.classifier
    if getattr(dense, "quantization_mode", None) is not None:
        raise ValueError(f"method 'vim' reads the classifier's float weights, but it is quantized "
                         f"({dense.quantization_mode}); fit the statistics before model.quantize(...)")
    bias = np.zeros(dense.units) if dense.bias is None else ops.convert_to_numpy(dense.bias)
    return ops.convert_to_numpy(dense.kernel).astype("float64"), bias.astype("float64")


def fit_features(method, feats, logits, labels, blocks=(), pooled=True, classifier=None, neighbours=None,
                 bank_size=KNN_BANK):
    """`Stats` of `method` from training features (B, S, D) (or (B, D): one set), their logits (B, C)
    and labels (B,); `blocks` and `pooled` record where the features come from (see `features`).
    "vim" needs `classifier`: (kernel (D, C), bias (C,)) of the layer that gave the logits. "knn"
    takes the `neighbours`-th nearest training feature: by default KNN_NEIGHBOURS, or every image
    of a smaller set."""
    check_method(method, POOLED if pooled and not blocks else [*blocks, *[POOLED] * pooled])
    feats = feats[:, None] if feats.ndim == 2 else feats
    if feats.shape[1] != len(blocks) + pooled:
        raise ValueError(f"features of {feats.shape[1]} sets, but blocks {list(blocks)} and pooled={pooled} make "
                         f"{len(blocks) + pooled}")
    num_classes, width = logits.shape[-1], feats.shape[-1]
    if method in ("mahalanobis", "rmds"):
        means, precision = _class_gaussians(feats, labels, num_classes)
        arrays = {"means": means, "precision": precision}
        if method == "rmds":
            arrays["global_mean"] = feats.mean(0)  # (B, S, D) -> (S, D)
            arrays["global_precision"] = _precision(feats - arrays["global_mean"])
    elif method == "vim":
        if classifier is None:
            raise ValueError("method 'vim' needs classifier=(kernel (D, C), bias (C,)) of the logits' layer")
        arrays = _fit_vim(feats[:, 0], logits, *classifier)
    elif method == "knn":
        neighbours = min(KNN_NEIGHBOURS, len(feats)) if neighbours is None else neighbours
        if not 0 < neighbours <= len(feats):
            raise ValueError(f"neighbours={neighbours} is not allowed with {len(feats)} training images; "
                             f"use 1 to {len(feats)}")
        keep = np.linspace(0, len(feats) - 1, min(bank_size, len(feats))).round().astype(int)
        arrays = {"bank": _normalized(feats[keep]).transpose(1, 0, 2), "neighbours": np.array(neighbours)}
    else:
        arrays = {}
    return Stats(method, arrays, tuple(int(b) for b in blocks), bool(pooled), int(num_classes), int(width))


def _class_gaussians(feats, labels, num_classes):
    """Class means (S, C, D) and the precision (S, D, D) of the covariance shared by the classes."""
    # A class without images gets NaN means, which `scores` never takes for the nearest class.
    means = np.full((feats.shape[1], num_classes, feats.shape[2]), np.nan)
    centered = np.zeros_like(feats)
    for c in range(num_classes):
        rows = labels == c
        if rows.any():
            means[:, c] = feats[rows].mean(0)
            centered[rows] = feats[rows] - means[:, c]
    return means, _precision(centered)


def _precision(centered):
    """The inverse (S, D, D) of the covariance of centered features (B, S, D)."""
    covariance = np.einsum("bsd,bse->sde", centered, centered) / len(centered)  # (B, S, D) x (B, S, D) -> (S, D, D)
    # A little ridge keeps the inverse finite for features that never vary (a saturated unit).
    dim = covariance.shape[-1]
    ridge = 1e-6 * np.trace(covariance, axis1=1, axis2=2)[:, None, None] / dim + 1e-12
    return np.linalg.inv(covariance + ridge * np.eye(dim))


def _fit_vim(feats, logits, kernel, bias):
    """ViM's origin, residual basis and scale from pooled training features (B, D) and logits."""
    width = feats.shape[-1]
    # The principal dimension of Wang et al.: 1000 for D >= 2048, 512 for D >= 768, else D / 2.
    principal = 1000 if width >= 2048 else 512 if width >= 768 else width // 2
    origin = -np.linalg.pinv(kernel.T) @ bias  # the point whose logits are all zero, (D,)
    centered = feats - origin
    _, vectors = np.linalg.eigh(centered.T @ centered / len(centered))  # ascending eigenvalues
    null_space = vectors[:, : width - principal]  # (D, R): the directions the training data hardly uses
    residual = np.linalg.norm(centered @ null_space, axis=-1)
    alpha = logits.max(-1).mean() / max(residual.mean(), 1e-12)
    return {"origin": origin[None], "null_space": null_space[None], "alpha": np.array([alpha])}


def _normalized(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _log_sum_exp(logits):
    top = logits.max(-1)
    return top + np.log(np.exp(logits - top[:, None]).sum(-1))


def _distances(x, means, precision):
    """Squared Mahalanobis distances (B, C) of x (B, D) to each of means (C, D)."""
    # (x - m)' P (x - m) = x'Px - 2 x'Pm + m'Pm, without the (B, C, D) differences.
    xp = x @ precision  # (B, D) x (D, D) -> (B, D)
    mp = means @ precision  # (C, D) x (D, D) -> (C, D)
    return (xp * x).sum(-1)[:, None] - 2 * xp @ means.T + (mp * means).sum(-1)[None]


def scores(stats, feats, logits, chunk=1024):
    """(B,) scores of `stats.method` from features (B, S, D) (or (B, D)) of the kind `stats` was fit
    on, and logits (B, C); larger: less like the training data."""
    if stats.method == "msp":
        return 1.0 - np.exp(logits.max(-1) - _log_sum_exp(logits))
    if stats.method == "energy":
        return -_log_sum_exp(logits)
    feats = feats[:, None] if feats.ndim == 2 else feats
    a = stats.arrays
    if stats.method == "vim":
        residual = np.linalg.norm((feats[:, 0] - a["origin"][0]) @ a["null_space"][0], axis=-1)
        return a["alpha"][0] * residual - _log_sum_exp(logits)
    total = np.zeros(len(feats))
    for s in range(feats.shape[1]):
        x = feats[:, s]
        if stats.method == "knn":
            k = int(a["neighbours"])
            for start in range(0, len(x), chunk):  # (chunk, N) similarities at a time
                similarity = _normalized(x[start:start + chunk]) @ a["bank"][s].T
                kth = -np.partition(-similarity, k - 1, axis=-1)[:, k - 1]  # the k-th largest
                total[start:start + chunk] += np.sqrt(np.maximum(2 - 2 * kth, 0))  # its distance, unit vectors
            continue
        nearest = np.nanmin(_distances(x, a["means"][s], a["precision"][s]), -1)  # the nearest class, (B,)
        if stats.method == "rmds":
            nearest = nearest - _distances(x, a["global_mean"][s][None], a["global_precision"][s])[:, 0]
        total += nearest
    return total


def score(model, pixels, stats, batch_size=256):
    """(B,) out-of-domain scores of `pixels` (B, H, W, C) in [0, 255] by `stats.method`; compare them
    with `stats.threshold`."""
    return scores(stats, *features(model, pixels, [*stats.blocks, *[POOLED] * stats.pooled], batch_size))


def check(model, pixels, stats, batch_size=256):
    """The `Verdict` on `pixels` (B, H, W, C) in [0, 255]: score, percentile and flag of each image.
    `stats` needs a threshold (`with_threshold`)."""
    if stats.threshold is None:
        raise ValueError("these statistics have no threshold; set one with keras_vit.ood.with_threshold")
    values = score(model, pixels, stats, batch_size)
    return Verdict(values, stats.percentile(values), values > stats.threshold, len(stats.reference))


def with_threshold(stats, held_out_scores, false_alarm=0.05):
    """`stats` with the threshold that flags a `false_alarm` share of `held_out_scores`, the scores of
    in-domain images that `fit` did not see, and those scores as the reference of percentiles."""
    if not 0 < false_alarm < 1:
        raise ValueError(f"false_alarm={false_alarm} is not a share; use a value between 0 and 1, e.g. 0.05")
    held = np.sort(np.asarray(held_out_scores, "float64"))
    if held.ndim != 1 or len(held) < 2 or not np.isfinite(held).all():
        raise ValueError(f"held_out_scores must be at least 2 finite scores, one per image; got shape {held.shape}")
    threshold = float(np.quantile(held, 1 - false_alarm))
    return dataclasses.replace(stats, threshold=threshold, false_alarm=float(np.mean(held > threshold)), reference=held)


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
        expected = _width(model, blocks)
        if num_classes != model.num_classes or width != expected or any(b >= model.num_layers for b in blocks):
            raise ValueError(f"{path} holds statistics of {num_classes} classes and width {width} on blocks "
                             f"{list(blocks)} (pooled: {pooled}), but the model has {model.num_classes} classes, "
                             f"{model.num_layers} blocks and width {expected} there")
    if off is not None and threshold is not None:
        raise ValueError(f"{path} holds a threshold and says the check is off ({off!r}); it can be only one")
    return Stats(method, arrays, blocks, pooled, num_classes, width, threshold, false_alarm, reference, off)


def _width(model, blocks):
    """D of the features on `blocks`: the encoder's width, or what the classifier takes."""
    return model.hidden_dim if blocks or model.representation_size is None else model.representation_size


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

"""The out-of-domain scores' arithmetic: the statistics each score keeps (`Stats`), how they are fit
from training features (`fit_features`), the scores themselves (`scores`), the threshold
(`with_threshold`) and the verdict's words (`Verdict`, `describe`). NumPy only: the features come
from `keras_vit.ood.features`, and the file format is `keras_vit.ood.stats_file`.

Shapes: B images, S feature sets (one per chosen block, then the pooled one), C classes, D width, N
training features kept by "knn".
"""

import dataclasses

import numpy as np

# This module imports NumPy only: `check_method`, `parse_blocks` and the constants serve the
# command-line tools' checks before any deep-learning library loads (they load this file on its own).

METHODS = ("msp", "energy", "mahalanobis", "rmds", "vim", "knn")
LOGIT_METHODS = ("msp", "energy")  # they read the logits only
# Chosen by `python -m experiments.ood` (experiments/results/ood.json, docs/app.md): the highest mean of
# near- and far-shift AUROC on the shipped checkpoint.
DEFAULT_METHOD = "mahalanobis"
DEFAULT_BLOCKS = "all+pooled"
POOLED = "pooled"
BLOCK_WORDS = (POOLED, "all", "all+pooled")
KNN_NEIGHBOURS = 50  # Sun et al.'s k for CIFAR-10 and OpenOOD's for ImageNet
KNN_BANK = 10_000  # training features kept by "knn", evenly spaced over the fit images


@dataclasses.dataclass(frozen=True)
class Stats:
    """What a score needs of a model's training features, its threshold, and the held-out scores.

    Attributes:
        method: one of METHODS.
        arrays: {name: array} of the method (`stats_file.ARRAYS[method]`): class means (S, C, D) and a shared
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



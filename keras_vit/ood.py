"""Out-of-domain scores: how unlike a classifier's training data an image is.

A classifier gives every image one of its classes, often with high confidence, a cat photo
included. These scores flag such images; each is larger for an image further from the training
data:

- "msp": 1 - the maximum softmax probability (Hendrycks & Gimpel, ICLR 2017).
- "energy": the negative log-sum-exp of the logits (Liu et al., NeurIPS 2020).
- "mahalanobis": the squared Mahalanobis distance of the image's features to the nearest class
  mean, under one covariance shared by the classes (Lee et al., NeurIPS 2018), summed over the
  encoder's blocks: the features of a block are the mean of its output tokens. The statistics
  (class means and precisions) come from training images (`fit`).

`python -m benchmarks.ood` measures them (docs/app.md, "Out-of-domain warning"). The statistics and a
threshold are stored beside a checkpoint as `ood.npz` (`stats_path`): the training CLI writes it, and
`load_for` finds it for a checkpoint, so an application can warn:

    stats = keras_vit.ood.load_for("run/model.keras", model)   # None when there is none
    if stats is not None and keras_vit.ood.score(model, pixels, stats)[0] > stats.threshold:
        ...  # unlike the training data

Shapes: B images, L encoder blocks, C classes, D width.
"""

import dataclasses
import os

import keras
import numpy as np
from keras import ops

from keras_vit.autodiff import model_function
from keras_vit.distribution import replicated

METHODS = ("msp", "energy", "mahalanobis")
FILENAME = "ood.npz"
MAX_FILE_BYTES = 512 * 2**20  # L x C x D means and L D x D matrices, float32: 65 MB for ViT-B/16, 1000 classes


@dataclasses.dataclass(frozen=True)
class Stats:
    """Statistics of a model's features on its training images, and the score's threshold.

    Attributes:
        means: (L, C, D) mean features of each class, per block.
        precision: (L, D, D) inverse of the covariance shared by the classes, per block.
        threshold: scores above it are out of domain (None until `with_threshold` sets it).
        method: the score that `score` computes and `threshold` applies to.
        false_alarm: the share of held-out in-domain images above `threshold` when it was chosen.
    """

    means: np.ndarray
    precision: np.ndarray
    threshold: float | None = None
    method: str = "mahalanobis"
    false_alarm: float | None = None


def features(model, pixels, batch_size=256):
    """(features (B, L, D), logits (B, C)) as float64 arrays for `pixels` (B, H, W, C) in [0, 255] at
    the model's image size; the features of a block are the mean of its output tokens.

    The model runs batch by batch through `keras_vit.autodiff.model_function` (see there: on JAX
    one compiled program per batch shape, never op by op), its outputs replicated over a
    distribution (`keras_vit.distribution.replicated`), so that every process reads the whole
    result; `predict` would split the batch across processes."""
    run = model_function(_block_features, model)
    pixels = np.asarray(pixels, "float32")
    feats, logits = [], []
    for start in range(0, len(pixels), batch_size):
        f, lg = run(pixels[start:start + batch_size])
        feats.append(keras.ops.convert_to_numpy(f))
        logits.append(keras.ops.convert_to_numpy(lg))
    return np.concatenate(feats).astype("float64"), np.concatenate(logits).astype("float64")


def _block_features(vit, pixels):
    """A ViT's forward pass that also returns each block's mean token: pixels (B, H, W, C) ->
    (features (B, L, D), logits (B, C))."""
    x = vit.embed_tokens(vit.normalize(pixels), training=False)  # (B, T, D)
    pooled = []
    for _, x, _ in vit.encoder.iterate(x, training=False):
        pooled.append(ops.cast(ops.mean(x, axis=1), "float32"))  # (B, T, D) -> (B, D)
    return replicated(ops.stack(pooled, axis=1)), replicated(vit.forward_head(vit.encoder.norm_output(x)))


def fit(model, pixels, labels=None, batch_size=256):
    """`Stats` (no threshold yet) of `model`'s features on in-domain `pixels` (B, H, W, C), grouped by
    `labels` (B,) or, without labels, by the model's predictions."""
    feats, logits = features(model, pixels, batch_size)
    return fit_features(feats, logits.argmax(-1) if labels is None else np.asarray(labels), logits.shape[-1])


def fit_features(feats, labels, num_classes):
    """`Stats` from features (B, L, D) (or (B, D): one set) and class labels (B,): the class means
    and the shared precision of each of the L feature sets."""
    feats = feats[:, None] if feats.ndim == 2 else feats
    # A class without images gets NaN means, which `scores` never takes for the nearest class.
    means = np.full((feats.shape[1], num_classes, feats.shape[2]), np.nan)
    centered = np.zeros_like(feats)
    for c in range(num_classes):
        rows = labels == c
        if rows.any():
            means[:, c] = feats[rows].mean(0)
            centered[rows] = feats[rows] - means[:, c]
    covariance = np.einsum("bld,ble->lde", centered, centered) / len(feats)  # (B, L, D) x (B, L, D) -> (L, D, D)
    # A little ridge keeps the inverse finite for features that never vary (a saturated unit).
    dim = covariance.shape[-1]
    ridge = 1e-6 * np.trace(covariance, axis1=1, axis2=2)[:, None, None] / dim + 1e-12
    return Stats(means, np.linalg.inv(covariance + ridge * np.eye(dim)))


def scores(feats, logits, stats=None):
    """{method: (B,) scores} from features (B, L, D) (or (B, D)) and logits (B, C); "mahalanobis"
    needs `stats` of the same feature sets."""
    shifted = logits - logits.max(-1, keepdims=True)
    log_sum_exp = np.log(np.exp(shifted).sum(-1))
    out = {"msp": 1.0 - np.exp(-log_sum_exp), "energy": -(log_sum_exp + logits.max(-1))}
    if stats is not None:
        feats = feats[:, None] if feats.ndim == 2 else feats
        total = 0.0
        for x, means, precision in zip(feats.transpose(1, 0, 2), stats.means, stats.precision):
            # (x - m)' P (x - m) = x'Px - 2 x'Pm + m'Pm, without the (B, C, D) differences.
            xp = x @ precision  # (B, D) x (D, D) -> (B, D)
            mp = means @ precision  # (C, D) x (D, D) -> (C, D)
            distance = (xp * x).sum(-1)[:, None] - 2 * xp @ means.T + (mp * means).sum(-1)[None]  # (B, C)
            total = total + np.nanmin(distance, -1)  # the nearest class, (B, C) -> (B,)
        out["mahalanobis"] = total
    return out


def score(model, pixels, stats, batch_size=256):
    """(B,) out-of-domain scores of `pixels` (B, H, W, C) in [0, 255] by `stats.method`; compare them
    with `stats.threshold`."""
    return scores(*features(model, pixels, batch_size), stats)[stats.method]


def with_threshold(stats, held_out_scores, false_alarm=0.05):
    """`stats` with the threshold that flags a `false_alarm` share of `held_out_scores`, the scores of
    in-domain images that `fit` did not see."""
    if not 0 < false_alarm < 1:
        raise ValueError(f"false_alarm={false_alarm} is not a share; use a value between 0 and 1, e.g. 0.05")
    threshold = float(np.quantile(held_out_scores, 1 - false_alarm))
    measured = float(np.mean(np.asarray(held_out_scores) > threshold))
    return dataclasses.replace(stats, threshold=threshold, false_alarm=measured)


def stats_path(checkpoint):
    """Where the statistics of `checkpoint` live: `ood.npz` in its folder (or in it, for a folder)."""
    folder = checkpoint if os.path.isdir(checkpoint) else os.path.dirname(os.path.abspath(checkpoint))
    return os.path.join(folder, FILENAME)


def save(stats, path):
    """Writes `stats` to `path` (.npz, no pickled objects), through a temporary file and a rename."""
    partial = f"{path}.partial.npz"
    arrays = {"means": stats.means.astype("float32"), "precision": stats.precision.astype("float32"),
              "method": np.str_(stats.method)}
    if stats.threshold is not None:
        arrays.update(threshold=np.float64(stats.threshold), false_alarm=np.float64(stats.false_alarm or 0.0))
    np.savez(partial, **arrays)
    os.replace(partial, path)


def load(path, model=None):
    """The `Stats` in `path`, read with allow_pickle=False; with `model`, checked against its classes
    and feature width. Raises ValueError for a file that is too large or holds other shapes."""
    size = os.path.getsize(path)
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{path} is {size} bytes; out-of-domain statistics are at most {MAX_FILE_BYTES}")
    with np.load(path, allow_pickle=False) as f:
        missing = {"means", "precision", "method"} - set(f.files)
        if missing:
            raise ValueError(f"{path} holds no out-of-domain statistics: {sorted(missing)} missing")
        means, precision, method = f["means"], f["precision"], str(f["method"])
        threshold = float(f["threshold"]) if "threshold" in f.files else None
        false_alarm = float(f["false_alarm"]) if "false_alarm" in f.files else None
    if means.ndim != 3 or precision.shape != (means.shape[0], means.shape[2], means.shape[2]) or method not in METHODS:
        raise ValueError(f"{path}: means {means.shape}, precision {precision.shape} and method {method!r} do not "
                         f"fit together; expected (L, C, D), (L, D, D) and one of {list(METHODS)}")
    if model is not None and means.shape != (model.num_layers, model.num_classes, model.hidden_dim):
        raise ValueError(f"{path} holds statistics of {means.shape[0]} blocks, {means.shape[1]} classes and width "
                         f"{means.shape[2]}, but the model has {model.num_layers}, {model.num_classes} and "
                         f"{model.hidden_dim}")
    return Stats(means.astype("float64"), precision.astype("float64"), threshold, method, false_alarm)


def load_for(checkpoint, model=None):
    """The `Stats` stored beside `checkpoint` (see `stats_path`), or None when there are none."""
    path = stats_path(checkpoint)
    return load(path, model) if os.path.exists(path) else None

"""The localization test of `python -m experiments.explain`, where the evidence is known: a
multi-label ViT (one sigmoid output per class) trained on synthetic images that hold one shape, or
two shapes of different classes, at random places.

Shapes: n images, S x S pixels, C channels, P patch side, (h, w) = (S / P, S / P) token grid.

On a two-shape image each class has its own shape, so a map of "why this class" should peak on that
shape, and blanking the patches it ranks highest should lower that class's probability more than the
other's. A class-agnostic map (rollout) is the same for both classes: its peak lies on at most one of
the two shapes, so it scores at most 50% on the first test.
"""

import keras
import numpy as np

import keras_vit
from experiments.explain.methods import patch_pixels
from training.datasets.shapes import CLASS_NAMES, shape_mask

BACKGROUND = 0.2  # the background level in [0, 1]; blanked patches are set to it
# The colour of each class, as added to the background.
COLORS = np.array([(1.0, 0.2, 0.2), (0.2, 1.0, 0.2), (0.2, 0.2, 1.0), (1.0, 1.0, 0.2)])


def make_objects(n, rng, size=32, patch=4, two=0.5, radius=(3.0, 5.0)):
    """n RGB images holding one shape, or two shapes of different classes (with probability `two`),
    placed so that no patch holds pixels of both.

    The four classes are the forms of `training.datasets.shapes` (square, disc, triangle, cross), each in its
    own color (COLORS), so that a small model learns them in a few hundred steps.

    Returns:
        images (n, S, S, 3) uint8, labels (n, 4) float32 multi-hot, masks (n, 2, S, S) bool (the
        second all False for one shape) and kinds (n, 2) int (-1 for no second shape).
    """
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    images = np.empty((n, size, size, 3), np.float32)
    labels, masks = np.zeros((n, len(CLASS_NAMES)), np.float32), np.zeros((n, 2, size, size), bool)
    kinds = np.full((n, 2), -1)
    for i in range(n):
        count = 2 if rng.random() < two else 1
        kinds[i, :count] = rng.choice(len(CLASS_NAMES), count, replace=False)
        while True:  # redraw the places until the shapes share no patch
            for s in range(count):
                r = rng.uniform(*radius)
                cy, cx = rng.uniform(r + 1, size - r - 1, 2)
                masks[i, s] = shape_mask(kinds[i, s], yy - cy, xx - cx, r)
            if count == 1 or not (footprint(masks[i, 0], patch) & footprint(masks[i, 1], patch)).any():
                break
        images[i] = BACKGROUND + rng.normal(0, 0.05, (size, size, 3))
        for s in range(count):
            images[i, masks[i, s]] += rng.uniform(0.5, 0.7) * COLORS[kinds[i, s]]
        labels[i, kinds[i, :count]] = 1.0
    return np.clip(np.round(images * 255), 0, 255).astype(np.uint8), labels, masks, kinds


def footprint(mask, patch):
    """(..., S, S) pixels -> (..., h, w): the patches holding at least one pixel of the mask."""
    *lead, size, _ = mask.shape
    return mask.reshape(*lead, size // patch, patch, size // patch, patch).any(axis=(-3, -1))


def train(images, labels, config, epochs, batch_size=64, learning_rate=2e-3, seed=0):
    """A `keras_vit.ViT` with config `config` (+ num_classes=4) fitted with sigmoid cross-entropy."""
    keras.utils.set_random_seed(seed)
    model = keras_vit.ViT(**config, num_classes=labels.shape[-1], num_channels=images.shape[-1])
    steps = epochs * -(-len(images) // batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, steps)
    model.compile(keras.optimizers.AdamW(schedule, weight_decay=0.05),
                  keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)])
    model.fit(keras.ops.convert_to_numpy(model.normalize(images)), labels, batch_size=batch_size, epochs=epochs,
              verbose=0)
    return model


def probabilities(model, x):
    """Sigmoid outputs (n, 4) of normalized images, in batches, computed in float64 from the
    logits: in float32 a logit above about 17 gives exactly 1.0, so a lowered but still high
    probability would read as unchanged."""
    logits = np.asarray(keras.ops.convert_to_numpy(model.predict(x, batch_size=256, verbose=0)), "float64")
    return 1.0 / (1.0 + np.exp(-logits))


def localization_scores(model, images, masks, kinds, method):
    """For every (two-shape image, class) pair: whether the class's map peaks on a patch of its own
    shape ("peak"), and whether blanking the patches the map ranks highest, as many as the shape
    covers, lowers the class's probability more than the other class's ("blank").

    Args:
        model: the trained multi-label model.
        images: (n, S, S, 3) uint8; only those with two shapes are used.
        masks, kinds: from `make_objects`.
        method: (model, x, classes, fill) -> (B, h, w) maps, as in `experiments.explain.methods.METHODS`.

    Returns:
        {"pairs": count, "peak": fraction, "blank": fraction}.
    """
    two = kinds[:, 1] >= 0
    x = keras.ops.convert_to_numpy(model.normalize(images[two]))
    pairs = np.repeat(x, 2, axis=0)  # each image twice: once per class
    classes, others = kinds[two].reshape(-1), kinds[two][:, ::-1].reshape(-1)
    fill = keras.ops.convert_to_numpy(model.normalize(np.full(images.shape[-1], BACKGROUND * 255)))
    maps = np.asarray(keras.ops.convert_to_numpy(method(model, pairs, classes, fill)), "float64")  # (2m, h, w)
    own = footprint(masks[two].reshape(-1, *masks.shape[2:]), model.token_pixels).reshape(len(maps), -1)  # (2m, N)
    flat = maps.reshape(len(maps), -1)
    peak = own[np.arange(len(maps)), flat.argmax(-1)]
    rank = np.argsort(np.argsort(-flat, axis=-1, kind="stable"), axis=-1)  # 0 for the most relevant patch
    blanked = rank < own.sum(-1, keepdims=True)  # as many patches as the class's shape covers
    pixels = patch_pixels(blanked.reshape(maps.shape), model.token_pixels)
    before, after = probabilities(model, pairs), probabilities(model, np.where(pixels, fill, pairs).astype("float32"))
    rows = np.arange(len(maps))
    drop_own = before[rows, classes] - after[rows, classes]
    drop_other = before[rows, others] - after[rows, others]
    return {"pairs": int(len(maps)), "peak": float(peak.mean()), "blank": float((drop_own > drop_other).mean())}

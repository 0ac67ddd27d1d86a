"""The seed's synthetic shapes (seed 000, "A toy version of the data effect"), in NumPy.

Four classes (square, disc, triangle, cross) of random size, brightness and position on a noisy,
randomly shaded background. `make_shapes` draws from the generator in exactly the seed's order,
so the same `np.random.default_rng(seed)` gives the same images and labels as the seed's script.
"""

import numpy as np

from training.datasets.info import Info

CLASS_NAMES = ("square", "disc", "triangle", "cross")
# Fixed generator seeds, as in the seed: the training images come from the run's seed and the
# 1,000 test images from seed 1000.
TEST_SEED, TEST_SIZE = 1000, 1000


def make_shapes(n, rng, size=32, masks=False):
    """Returns (X (n, size, size) float32, about in [0, 1], y (n,) int64 in 0..3); with `masks`,
    also each image's per-pixel labels (n, size, size) int32: 0 for the background, y + 1 on the
    shape (the same draws: the images do not change)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    X = np.empty((n, size, size), np.float32)
    labels = np.zeros((n, size, size), np.int32)
    y = rng.integers(0, 4, n)
    for i in range(n):
        r = rng.uniform(4, 7)  # half-width of the shape
        cy, cx = rng.uniform(r + 1, size - r - 1, 2)  # position jitter
        m = shape_mask(y[i], yy - cy, xx - cx, r)
        labels[i][m] = y[i] + 1
        g = rng.uniform(-0.2, 0.2, 2)  # random shading of the background
        bg = 0.4 + g[0] * (xx / size - 0.5) + g[1] * (yy / size - 0.5)
        X[i] = bg + m * rng.uniform(0.3, 0.6) + rng.normal(0, 0.08, (size, size))
    return (X, y, labels) if masks else (X, y)


def shape_mask(kind, dy, dx, r):
    """The pixels of shape `kind` (an index of CLASS_NAMES) of half-width r, as a boolean array,
    from each pixel's offsets (dy, dx) to the shape's center."""
    if kind == 0:
        return (abs(dy) < r) & (abs(dx) < r)
    if kind == 1:
        return dy**2 + dx**2 < r**2
    if kind == 2:
        return (abs(dy) < r) & (abs(dx) < (dy + r) / 2)
    return ((abs(dy) < r) & (abs(dx) < r / 3)) | ((abs(dx) < r) & (abs(dy) < r / 3))


def to_uint8(X):
    """(n, S, S) floats about in [0, 1] -> (n, S, S, 1) uint8 pixels, the format of every source."""
    return np.clip(np.round(X * 255.0), 0, 255).astype(np.uint8)[..., None]


def load(name, split):
    """tf.data source for "shapes" or "shapes:N" (N training images, default 4000).

    Splits: "train" (N images from generator seed 0, or "train@SEED"), "test" (the seed's fixed
    1,000 images from generator seed 1000).
    """
    import tensorflow as tf

    n_train = int(name.split(":")[1]) if ":" in name else 4000
    base, _, gen_seed = split.partition("@")
    if base == "train":
        X, y = make_shapes(n_train, np.random.default_rng(int(gen_seed or 0)))
    elif base == "test":
        X, y = make_shapes(TEST_SIZE, np.random.default_rng(TEST_SEED))
    else:
        raise ValueError(f"Dataset {name!r} has no split {split!r}; available splits: ['test', 'train']")
    info = Info(name, 4, CLASS_NAMES, 1, {"train": n_train, "test": TEST_SIZE})
    return tf.data.Dataset.from_tensor_slices((to_uint8(X), y.astype(np.int64))), info

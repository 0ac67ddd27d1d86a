"""Fashion-MNIST at many aspect ratios: each garment on a black canvas from 1:3 (tall) to 3:1 (wide).

"fashion_mnist_aspect": every 28 x 28 garment of Fashion-MNIST (through tfds, `fashion_mnist.py`)
is put on a canvas whose short side is 28 and whose long side is 28 a, at a random place along the
long side, the aspect ratio a drawn log-uniformly from [1, 3] and the canvas tall or wide with equal
odds. The draws are a fixed function of the split and the example's index, so the test canvases are
drawn the same way, and every run sees the same images. The garment itself is never resized: a
square model must squash the canvas (resize) or shrink it (pad), and a NaFlex model need not.
"""

import math

from training.datasets.info import Info

NAME = "fashion_mnist_aspect"
MAX_ASPECT = 3.0
SEEDS = {"train": 11, "test": 12}  # one stream of draws per split


def canvas(garment, index, seed):
    """A (28, 28, 1) uint8 garment -> its canvas (28, 28 a, 1) or (28 a, 28, 1), in TensorFlow: the
    aspect a, the orientation and the offset drawn from `index` (an int64 scalar tensor) and `seed`."""
    import tensorflow as tf

    draws = tf.random.stateless_uniform((3,), tf.stack([tf.cast(seed, tf.int64), index]), dtype=tf.float32)
    aspect = tf.exp(draws[0] * math.log(MAX_ASPECT))  # log-uniform in [1, 3]
    long = tf.cast(tf.round(28.0 * aspect), tf.int32)
    offset = tf.cast(tf.floor(draws[2] * tf.cast(long - 27, tf.float32)), tf.int32)  # 0 .. long - 28
    along = [offset, long - 28 - offset]  # the padding before and after the garment on the long side
    return tf.cond(draws[1] < 0.5, lambda: tf.pad(garment, [[0, 0], along, [0, 0]]),  # (28, long, 1)
                   lambda: tf.pad(garment, [along, [0, 0], [0, 0]]))  # (long, 28, 1)


def load(split):
    """(tf.data.Dataset of (canvas uint8 (H, W, 1), label int64), Info); splits "train" and "test",
    with tfds' slicing ("train[:1000]")."""
    from training.datasets.tfds import load_tfds

    base = split.split("[")[0]
    if base not in SEEDS:
        raise ValueError(f"Dataset {NAME!r} has no split {split!r}; available splits: {sorted(SEEDS)}")
    ds, info = load_tfds("fashion_mnist", split, None, None)
    seed = SEEDS[base]
    ds = ds.enumerate().map(lambda i, example: (canvas(example[0], i, seed), example[1]))
    return ds, Info(NAME, info.num_classes, info.class_names, 1, info.splits)

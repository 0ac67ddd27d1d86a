"""scikit-learn's handwritten digits (UCI "Optical Recognition of Handwritten Digits"), 28x28.

1,797 grayscale 8x8 images of the digits 0-9 with 17 grey levels, shipped inside scikit-learn, so
no download. They are scaled to 0-255 and upsampled to 28x28 (Pillow, bicubic), the size and
format of Fashion-MNIST: a small labelled set of another domain, for measuring transfer from the
shipped Fashion-MNIST checkpoint (`experiments.lora_transfer`).

Splits, fixed whatever the run's seed (a permutation with seed 0): "test" 500 images, "validation"
200, "train" the other 1,097, and "all" the 1,797.
"""

import numpy as np

from training.datasets.info import Info

SIZE = 28
TEST_SIZE, VALIDATION_SIZE = 500, 200
SPLITS = ("train", "validation", "test", "all")
CLASS_NAMES = tuple(str(d) for d in range(10))


def images():
    """(pixels uint8 (1797, 28, 28, 1), labels int64 (1797,)) in scikit-learn's order."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ModuleNotFoundError("the digits dataset needs scikit-learn: pip install -e '.[train]'") from e
    from PIL import Image

    digits = load_digits()
    small = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    big = [np.asarray(Image.fromarray(im).resize((SIZE, SIZE), Image.Resampling.BICUBIC)) for im in small]
    return np.stack(big)[..., None], digits.target.astype(np.int64)


def load(name, split):
    """tf.data source of `split` ("train", "test" or "all") and its Info."""
    import tensorflow as tf

    if split not in SPLITS:
        raise ValueError(f"Dataset {name!r} has no split {split!r}; available splits: {sorted(SPLITS)}")
    pixels, labels = images()
    order = np.random.default_rng(0).permutation(len(labels))
    cut = TEST_SIZE + VALIDATION_SIZE
    picks = {"test": np.sort(order[:TEST_SIZE]), "validation": np.sort(order[TEST_SIZE:cut]),
             "train": np.sort(order[cut:]), "all": np.arange(len(labels))}
    idx = picks[split]
    info = Info(name, 10, CLASS_NAMES, 1, {k: len(v) for k, v in picks.items()})
    return tf.data.Dataset.from_tensor_slices((pixels[idx], labels[idx])), info

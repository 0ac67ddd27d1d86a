"""Writes the demo's example images into apps/assets/ from Debian's `dataset-fashion-mnist` package.

    python -m apps.make_examples

Two test-set images per class, as 28 x 28 PNGs, and two "photo-style" versions (dark garment on a
light, tinted 224 x 224 background) that show the Fashion-MNIST-style preprocessing at work.
"""

import gzip
from pathlib import Path

import numpy as np
from PIL import Image

SOURCE = Path("/usr/share/datasets/fashion-mnist")
ASSETS = Path(__file__).resolve().parent / "assets"
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
PER_CLASS = 2
PHOTO_STYLE = (0, 8)  # the classes that also get a photo-style example


def read_idx(path):
    """An IDX file (gzip) -> uint8 array: images (N, 28, 28) or labels (N,)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def slug(name):
    return name.lower().replace("/", "-").replace(" ", "-")


def main():
    images = read_idx(SOURCE / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(SOURCE / "t10k-labels-idx1-ubyte.gz")
    ASSETS.mkdir(exist_ok=True)
    for c, name in enumerate(CLASS_NAMES):
        for i in np.flatnonzero(labels == c)[:PER_CLASS]:
            Image.fromarray(images[i], "L").save(ASSETS / f"fashion-mnist-test-{i:04d}-{slug(name)}.png")
        if c in PHOTO_STYLE:
            i = np.flatnonzero(labels == c)[PER_CLASS]
            garment = 255 - images[i].astype("float32")  # dark garment on white
            tint = np.array([236, 228, 214], "float32") / 255  # a beige table
            rgb = np.asarray(Image.fromarray(garment.astype("uint8")).resize((160, 160), Image.Resampling.BICUBIC), "float32")
            canvas = np.full((224, 224, 3), 255.0) * tint
            canvas[32:192, 32:192] = rgb[..., None] * tint
            Image.fromarray(canvas.astype("uint8"), "RGB").save(ASSETS / f"photo-style-{i:04d}-{slug(name)}.png")
    print(f"wrote {len(list(ASSETS.glob('*.png')))} images to {ASSETS}")


if __name__ == "__main__":
    main()

"""Writes the demo's example images into apps/assets/ from Fashion-MNIST's IDX files (Debian's
`dataset-fashion-mnist` package, or $FASHION_MNIST_DIR; see `training.datasets.fashion_mnist`).

    python -m scripts.make_examples

Two test-set images per class, as 28 x 28 PNGs, and two "photo-style" versions (dark garment on a
light, tinted 224 x 224 background) that show the Fashion-MNIST-style preprocessing at work.
"""

import numpy as np
from PIL import Image

from apps.sources import ASSETS, FASHION_MNIST_CLASSES, slug
from training.datasets.fashion_mnist import find_files, read_idx

PER_CLASS = 2
PHOTO_STYLE = (0, 8)  # the classes that also get a photo-style example


def main():
    files = find_files()
    images, labels = read_idx(files["test_data"]), read_idx(files["test_labels"])
    ASSETS.mkdir(exist_ok=True)
    for c, name in enumerate(FASHION_MNIST_CLASSES):
        for i in np.flatnonzero(labels == c)[:PER_CLASS]:
            Image.fromarray(images[i], "L").save(ASSETS / f"fashion-mnist-test-{i:04d}-{slug(name)}.png")
        if c in PHOTO_STYLE:
            i = np.flatnonzero(labels == c)[PER_CLASS]
            garment = 255 - images[i].astype("float32")  # dark garment on white
            tint = np.array([236, 228, 214], "float32") / 255  # a beige table
            rgb = np.asarray(Image.fromarray(garment.astype("uint8")).resize((160, 160), Image.Resampling.BICUBIC),
                             "float32")
            canvas = np.full((224, 224, 3), 255.0) * tint
            canvas[32:192, 32:192] = rgb[..., None] * tint
            Image.fromarray(canvas.astype("uint8"), "RGB").save(ASSETS / f"photo-style-{i:04d}-{slug(name)}.png")
    print(f"wrote {len(list(ASSETS.glob('*.png')))} images to {ASSETS}")


if __name__ == "__main__":
    main()

"""Datasets for training, the same on every Keras backend.

Sources (see `load`), one module each:
  - any tfds dataset by name ("cifar10", "imagenette", "imagenet2012" with `manual_dir`...), with
    tfds split syntax ("train", "test", "train[:90%]") (`tfds`);
  - "fashion_mnist", read through tfds from the local IDX files (`fashion_mnist`);
  - "fashion_mnist_aspect", its garments on canvases from 1:3 to 3:1 (`aspect`);
  - "shapes", the seed's synthetic squares, discs, triangles and crosses (`shapes`);
  - "digits", scikit-learn's 8x8 handwritten digits upsampled to 28x28 (`digits`);
  - a local folder with one sub-folder of images per class ("/data/pets", or "folder:/data/pets")
    (`folder`).

Every source yields (image uint8 (H, W, C), label int) examples and an `Info`; `pipeline` turns
them into the batches a model trains on.
"""

from commands import preflight
from training.datasets import aspect, digits, shapes
from training.datasets.folder import load_folder
from training.datasets.info import Info
from training.datasets.pipeline import check_image_size, pipeline
from training.datasets.tfds import load_tfds

__all__ = ["Info", "check_image_size", "load", "pipeline"]


def load(name, split, data_dir=None, manual_dir=None, seed=0, strict=False):
    """Returns (tf.data.Dataset of (image uint8 (H, W, C), label int64), Info).

    Raises ValueError naming close matches for an unknown dataset and the available splits for a
    missing one; FileNotFoundError saying how to get data that is not on this machine. A folder is
    scanned first (`training.datasets.folder`): unreadable images are skipped, or refused with `strict`.
    """
    if name == "shapes" or name.startswith("shapes:"):
        return shapes.load(name, split)
    if name == "digits":
        return digits.load(name, split)
    if name == aspect.NAME:
        return aspect.load(split)
    if preflight.is_folder(name):
        return load_folder(name.removeprefix("folder:"), split, seed=seed, strict=strict)
    return load_tfds(name, split, data_dir, manual_dir)

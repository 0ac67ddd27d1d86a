"""What the demo serves: the model and its class names (`check_source`, `load_model`,
`class_labels`, `ood_stats`), and the example images that the page offers (`find_examples`).

No heavy imports: `apps.demo` checks `--checkpoint` and `--examples` before Keras and a backend
load (seconds); `check_source` uses `commands.preflight`, as the training CLI does, and Keras and
keras_vit are imported by the loaders.

The example images, chosen to fit the served checkpoint, in this order:

1. `--examples DIR`: a folder of images, or of class sub-folders;
2. `<checkpoint folder>/examples`, the held-out images per class that `training.train` writes
   beside a checkpoint (`examples/<class name>/<n>.png`);
3. the Fashion-MNIST test images in apps/assets, only for a model whose classes are Fashion-MNIST's;
4. none: the page then says so, and the second tab draws no attention-distance plot.
"""

import dataclasses
import itertools
from pathlib import Path

from apps import DEFAULT_CHECKPOINT
from commands import preflight

_FORMATS = preflight.standalone("checkpoints.formats")
# What the demo serves, in words: a .keras file or a checkpoint of keras_vit.load_checkpoint
# (KINDS), and those or a handle or a catalog name (SOURCES).
KINDS = _FORMATS.kinds(first=["a .keras file"])
SOURCES = _FORMATS.kinds(first=["a .keras file"], last=[
    "a handle (hf://org/repo[@revision], gs://bucket/object, https://...)", "a name of keras_vit.list_pretrained()"])
HOW_TO_TRAIN = (f"Create it with the training CLI (see docs/training.md), or serve another model: "
                f"--checkpoint {SOURCES}.")


def check_source(source):
    """Raises a ValueError or FileNotFoundError naming what is wrong with `source` (a path, a handle
    or a catalog name) that can be told without reading the weights: a malformed handle, a missing
    path, a file kind the demo does not read, or a `.keras`/`.npz` file that is not a zip archive."""
    path = Path(str(source))
    if path == DEFAULT_CHECKPOINT and not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}. {HOW_TO_TRAIN}")
    preflight.check_weights(str(source), flag="--checkpoint")
    if path.is_file() and path.suffix != ".keras" and not _FORMATS.is_weights_file(path):
        raise ValueError(f"cannot load {path}: use {KINDS}")


def load_model(path):
    """Loads a `keras_vit.ViT` from a `.keras` file (in Keras safe mode: no code is deserialized) or,
    through `keras_vit.load_checkpoint`, from a checkpoint of one of its formats (`KINDS`), a
    handle (hf://, gs://, https://) or a catalog name."""
    import keras

    import keras_vit

    check_source(path)
    if keras_vit.hub.is_handle(str(path)) or keras_vit.catalog.lookup(str(path)):
        return _checked(keras_vit.load_checkpoint(str(path)), path)  # downloaded once, then cached
    path = Path(path)
    if path.suffix == ".keras":
        model = keras.saving.load_model(path, safe_mode=True)
    else:
        model = keras_vit.load_checkpoint(str(path))
    return _checked(model, path)


def _checked(model, path):
    import keras_vit

    if not isinstance(model, keras_vit.ViT):
        raise ValueError(f"{path} holds a {type(model).__name__}, not a keras_vit.ViT")
    return model


def ood_stats(checkpoint, model):
    """The out-of-domain statistics stored beside a local checkpoint (`ood.npz`, which training
    writes; see `keras_vit.ood`), checked against `model`, or None (none stored, or a handle)."""
    import keras_vit.ood

    if not Path(str(checkpoint)).exists():
        return None
    return keras_vit.ood.load_for(str(checkpoint), model)


def class_labels(model, labels_file=None):
    """One name per class: from `labels_file` (one per line) if given, else the model's
    `class_names`, else the ImageNet names for 1000-class heads, else "class i"."""
    import keras_vit

    n = model.num_classes
    if labels_file is not None:
        return list(keras_vit.checkpoints.read_labels(labels_file, n))
    if model.class_names:
        return list(model.class_names)
    if n == 1000:
        # Each name lists synonyms ("tench, Tinca tinca"); the first reads best in a label.
        return [name.split(",")[0].strip() for name in keras_vit.checkpoints.imagenet_classes()]
    return [f"class {i}" for i in range(n)]


ASSETS = Path(__file__).resolve().parent / "assets"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot")
SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
PER_CLASS = 4  # images taken from each class sub-folder
MAX_EXAMPLES = 48  # two pages of the gallery


@dataclasses.dataclass(frozen=True)
class Examples:
    """Example image paths (classes interleaved, so the first few span the classes) and where
    they come from, in words for the page."""

    paths: tuple
    source: str


def slug(name):
    """A class name as it appears in an example's file name: "T-shirt/top" -> "t-shirt-top"."""
    return name.lower().replace("/", "-").replace(" ", "-")


def find_examples(checkpoint, labels, folder=None):
    """The `Examples` for a model loaded from `checkpoint` (a path or handle) with class names
    `labels`, or from `folder` when given; None when there are none (see the module docstring)."""
    if folder is not None:
        return Examples(read_folder(folder), f"the folder {Path(folder).name}")
    beside = checkpoint_examples_folder(checkpoint)
    if beside is not None and beside.is_dir():
        paths = read_folder(beside)
        if paths:
            return Examples(paths, "the held-out images stored with the checkpoint")
    if tuple(name.lower() for name in labels) == tuple(name.lower() for name in FASHION_MNIST_CLASSES):
        return Examples(fashion_mnist_examples(), "the Fashion-MNIST test set")
    return None


def fashion_mnist_examples():
    """The shipped examples (`python -m scripts.make_examples` writes them): Fashion-MNIST test images
    and two photo-style images."""
    return tuple(sorted(ASSETS.glob("*.png")))


def checkpoint_examples_folder(checkpoint):
    """`<folder>/examples` beside a checkpoint file, or inside a checkpoint folder; None for a
    handle or catalog name."""
    path = Path(str(checkpoint))
    if not path.exists():
        return None
    return (path if path.is_dir() else path.parent) / "examples"


def check_folder(folder):
    """Raises a ValueError or FileNotFoundError unless `folder` holds at least one image."""
    path = Path(folder)
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise FileNotFoundError(f"--examples {folder} {what}; pass a folder of images or of class sub-folders")
    if not read_folder(path):
        raise ValueError(f"--examples {folder} holds no images ({', '.join(SUFFIXES)}), neither directly nor in "
                         "class sub-folders")


def read_folder(folder):
    """Up to `MAX_EXAMPLES` image paths: the folder's own images, then up to `PER_CLASS` of each
    class sub-folder's, interleaved by class."""
    folder = Path(folder)
    groups = [_images(folder)[:MAX_EXAMPLES]]
    groups += [_images(d)[:PER_CLASS] for d in sorted(folder.iterdir()) if d.is_dir()]
    mixed = (p for row in itertools.zip_longest(*groups) for p in row if p is not None)
    return tuple(itertools.islice(mixed, MAX_EXAMPLES))


def _images(folder):
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)

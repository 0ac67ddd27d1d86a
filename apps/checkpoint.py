"""Finding the model and the class names that the demo serves.

`check_source` imports no deep-learning library (it uses `training.preflight`, as the training CLI
does), so that `apps.demo` answers a mistyped path or handle before Keras and a backend load
(seconds); Keras and keras_vit are imported by the loaders.
"""

from pathlib import Path

from apps import DEFAULT_CHECKPOINT
from training import preflight

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

"""Finding the model and the class names that the demo serves."""

from pathlib import Path

import keras

import keras_vit
from apps import DEFAULT_CHECKPOINT
HOW_TO_TRAIN = (
    "Create it with the training CLI (see docs/training.md), or serve another model with "
    "--checkpoint PATH (a .keras file, an official .npz, a timm .safetensors or a Hugging Face folder), a handle "
    "(hf://org/repo, gs://bucket/object, https://...) or a name of keras_vit.list_pretrained()."
)


def load_model(path):
    """Loads a `keras_vit.ViT` from a `.keras` file (in Keras safe mode: no code is deserialized) or,
    through `keras_vit.load_checkpoint`, from an official `.npz`, a timm `.safetensors`, a
    Hugging Face folder, a handle (hf://, gs://, https://) or a catalog name."""
    if keras_vit.hub.is_handle(str(path)) or keras_vit.catalog.lookup(str(path)):
        return _checked(keras_vit.load_checkpoint(str(path)), path)  # downloaded once, then cached
    path = Path(path)
    if not path.exists():
        hint = HOW_TO_TRAIN if path == DEFAULT_CHECKPOINT else "Check the path given to --checkpoint."
        raise FileNotFoundError(f"no checkpoint at {path}. {hint}")
    if path.suffix == ".keras":
        model = keras.saving.load_model(path, safe_mode=True)
    elif path.is_dir() or path.suffix in (".npz", ".safetensors"):
        if not hasattr(keras_vit, "load_checkpoint"):
            raise RuntimeError(f"this keras_vit has no load_checkpoint, so {path} cannot be read; use a .keras file")
        model = keras_vit.load_checkpoint(str(path))
    else:
        raise ValueError(
            f"cannot load {path}: use a .keras file, an official .npz, a timm .safetensors or a Hugging Face folder"
        )
    return _checked(model, path)


def _checked(model, path):
    if not isinstance(model, keras_vit.ViT):
        raise ValueError(f"{path} holds a {type(model).__name__}, not a keras_vit.ViT")
    return model


def class_labels(model, labels_file=None):
    """One name per class: from `labels_file` (one per line) if given, else the model's
    `class_names`, else the ImageNet names for 1000-class heads, else "class i"."""
    n = model.num_classes
    if labels_file is not None:
        return list(keras_vit.checkpoints.read_labels(labels_file, n))
    if model.class_names:
        return list(model.class_names)
    if n == 1000:
        # Each name lists synonyms ("tench, Tinca tinca"); the first reads best in a label.
        return [name.split(",")[0].strip() for name in keras_vit.checkpoints.imagenet_classes()]
    return [f"class {i}" for i in range(n)]

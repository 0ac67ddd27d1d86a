"""The checkpoint formats, one `WeightsFormat` record each, and `detect`, the one sniffer that
`load_checkpoint` and the hub use.

A format's reader is a module of this package with `READER`, its container module of
`keras_vit.io`, whose `headers(path)` gives ({name: shape}, metadata) and `read(path, names)` the
arrays; `claims(path, config)`, its weights file if `path` (a file or a folder, `config` the
config.json in or beside it) is in the format, else None; `source(weights, shapes, metadata, side,
options)`, a `rules.Source`: the `ViT` arguments inferred from the header shapes and side files
({name: JSON}), and the table of rules of that model; and, for a format that `save_checkpoint`
writes, `write(model, path)`. To add a format, write such a module (its rules in the vocabulary of
`rules`) and add its record to `FORMATS`: the first that claims a path reads it. The file kinds
that messages, help texts, the hub and the demo name all come from these records.

This module imports only the standard library (a reader is imported when first used), so that the
demo and the training CLI can name the formats before Keras loads.
"""

import dataclasses
import importlib
import json
import pathlib


@dataclasses.dataclass(frozen=True)
class WeightsFormat:
    """One checkpoint format.

    Attributes:
        name: its name in messages, and `save_checkpoint`'s `format=` for one that it writes.
        module: the reader's module in `keras_vit.checkpoints` (see the module doc).
        what: a checkpoint of the format in words, e.g. "a timm .safetensors".
        weights: a suffix (".npz"): a weights file of any name; or a file name
            ("model.safetensors"): the weights file of a folder, beside its config.json.
        side_files: the other files of a Hub repo that the reader reads when present.
        writes: whether `save_checkpoint` writes it.
    """

    name: str
    module: str
    what: str
    weights: str
    side_files: tuple = ()
    writes: bool = False

    @property
    def folder(self):
        """Whether a checkpoint of the format is a folder (its weights a named file in it)."""
        return not self.weights.startswith(".")

    @property
    def reader(self):
        """The reader's module, imported on first use."""
        return importlib.import_module(f"keras_vit.checkpoints.{self.module}")


FORMATS = (
    WeightsFormat("google", "google", "an official .npz", ".npz"),
    WeightsFormat("timm", "timm", "a timm .safetensors", ".safetensors", writes=True),
    WeightsFormat("keras_hub", "kerashub", "a keras-hub preset folder", "model.weights.h5",
           ("task.json", "preprocessor.json", "image_converter.json", "metadata.json", "task.weights.h5"), writes=True),
    WeightsFormat("transformers", "transformers", "a Hugging Face folder", "model.safetensors",
           ("preprocessor_config.json",), writes=True),
)
WRITERS = {f.name: f for f in FORMATS if f.writes}  # save_checkpoint's format= -> its record
# The suffixes of a weights file that is a checkpoint alone (a handle's filename=, a URL).
FILE_SUFFIXES = tuple(dict.fromkeys(f.weights for f in FORMATS if not f.folder))
_PICKLED = (".pth", ".pt", ".bin", ".ckpt", ".pkl")
_CONVERT = (
    "keras_vit never unpickles files. Convert it once, in an environment you trust, with "
    "`sd = torch.load(path, map_location='cpu', weights_only=True); "
    "safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, 'model.safetensors')` "
    "and load the .safetensors file"
)


def kinds(first=(), last=()):
    """The formats in words, joined: "an official .npz, ..., or a Hugging Face folder", with the
    phrases `first` before them and `last` after."""
    words = [*first, *(f.what for f in FORMATS), *last]
    return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]


def is_weights_file(path):
    """Whether the file `path` can be a format's weights by its name: a suffix of `FILE_SUFFIXES`,
    or a folder format's weights file (read with the config.json beside it)."""
    path = pathlib.Path(path)
    return path.suffix in FILE_SUFFIXES or any(f.folder and path.name == f.weights for f in FORMATS)


def detect(path):
    """(format, weights file, {side file name: its JSON dict or None}) of a local file or folder;
    the side files are config.json and the format's `side_files`, in or beside `path`.

    A folder is read by its config.json alone, so the hub can ask before fetching the weights.
    Pickled PyTorch files are refused with the one-line conversion to safetensors.
    """
    path = pathlib.Path(path)
    if path.suffix in _PICKLED:
        raise ValueError(f"{path} is a pickled PyTorch file. {_CONVERT}")
    folder = path if path.is_dir() else path.parent
    config = read_json(folder / "config.json")
    found = next(((f, w) for f in FORMATS for w in [f.reader.claims(path, config)] if w is not None), None)
    pickled = path.is_dir() and any((path / n).exists() for n in ("pytorch_model.bin", "model.bin"))
    if pickled and (found is None or not found[1].exists()):
        raise ValueError(f"{path} holds pickled PyTorch weights. {_CONVERT}")
    if found is not None:
        side = {n: read_json(folder / n) for n in found[0].side_files if n.endswith(".json")}
        return (*found, {"config.json": config, **side})
    folders = "; ".join(f"{f.what}: config.json and {f.weights}" for f in FORMATS if f.folder)
    if path.is_dir():
        raise ValueError(f"{path} is a folder of no checkpoint format that keras_vit reads ({folders})")
    raise ValueError(f"{path} is no checkpoint file that keras_vit reads: {kinds()} ({folders})")


def read_json(path):
    """The dict in the JSON file `path`, or None if there is no such file."""
    try:
        value = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value if path.is_file() else None

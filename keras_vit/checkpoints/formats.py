"""The checkpoint formats, and `detect`, the one sniffer that `load_checkpoint` and the hub use.

A format is a module with `NAME`; `READER`, its container module of `keras_vit.io`, whose
`headers(path)` gives ({name: shape}, metadata) and `read(path, names)` the arrays; `SIDE_FILES`,
the other files of a Hub repo it reads when present (the JSON ones come parsed, in `side`);
`claims(path, config)`, its weights file if `path` (a file or a folder, `config` the config.json
in or beside it) is in the format, else None; `source(weights, shapes, metadata, side, options)`,
a `rules.Source`: the `ViT` arguments inferred from the header shapes and side files
({name: JSON}), and the table of rules of that model; and, for a format that `save_checkpoint`
writes, `WRITES`, its name there, and `write(model, path)`. To add a format, write such a module
(its rules in the vocabulary of `rules`) and list it in `FORMATS`: the first that claims a path
reads it.
"""

import json
import pathlib

from keras_vit.checkpoints import google, hf, kerashub, timm

FORMATS = (google, timm, kerashub, hf)
WRITERS = {f.WRITES: f for f in FORMATS if hasattr(f, "WRITES")}  # save_checkpoint's format= -> module
_PICKLED = (".pth", ".pt", ".bin", ".ckpt", ".pkl")
_CONVERT = (
    "keras_vit never unpickles files. Convert it once, in an environment you trust, with "
    "`sd = torch.load(path, map_location='cpu', weights_only=True); "
    "safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, 'model.safetensors')` "
    "and load the .safetensors file"
)


def detect(path):
    """(format module, weights file, {side file name: its JSON dict or None}) of a local file or
    folder; the side files are config.json and the format's `SIDE_FILES`, in or beside `path`.

    A folder is read by its config.json alone, so the hub can ask before fetching the weights.
    Pickled PyTorch files are refused with the one-line conversion to safetensors.
    """
    path = pathlib.Path(path)
    if path.suffix in _PICKLED:
        raise ValueError(f"{path} is a pickled PyTorch file. {_CONVERT}")
    folder = path if path.is_dir() else path.parent
    config = read_json(folder / "config.json")
    found = next(((f, w) for f in FORMATS for w in [f.claims(path, config)] if w is not None), None)
    pickled = path.is_dir() and any((path / n).exists() for n in ("pytorch_model.bin", "model.bin"))
    if pickled and (found is None or not found[1].exists()):
        raise ValueError(f"{path} holds pickled PyTorch weights. {_CONVERT}")
    if found is not None:
        side = {n: read_json(folder / n) for n in found[0].SIDE_FILES if n.endswith(".json")}
        return (*found, {"config.json": config, **side})
    if path.is_dir():
        raise ValueError(f"{path} is a folder without config.json + model.safetensors (a Hugging Face model)")
    raise ValueError(f"{path} is neither a .npz archive nor a .safetensors file; formats: Google .npz, "
                     "timm .safetensors, Hugging Face folder")


def read_json(path):
    """The dict in the JSON file `path`, or None if there is no such file."""
    try:
        value = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value if path.is_file() else None

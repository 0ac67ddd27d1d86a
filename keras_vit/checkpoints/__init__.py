"""Pretrained checkpoints: Google's `.npz` (vit_jax, AugReg, big_vision), timm `.safetensors` and
Hugging Face folders in, timm `.safetensors` out.

One home per format: `google` (vit_jax, AugReg, hybrid and big_vision `.npz`), `timm` (read and
written) and the `hf` package (Hugging Face ViT, SigLIP and DINOv2 folders). Each converts its
names and layouts to the canonical layout of `canonical`. `common` holds what no format owns (the
strict checks, building the `ViT`); `npz_io`, `safetensors_io` and `arrays` read the containers
with every header checked.
"""

import json
import pathlib

from keras_vit import catalog, hub
from keras_vit.checkpoints import google, hf, timm
from keras_vit.checkpoints.common import OVERRIDES, imagenet_classes, read_labels
from keras_vit.models import ViT

_PICKLED = (".pth", ".pt", ".bin", ".ckpt", ".pkl")
_CONVERT = (
    "keras_vit never unpickles files. Convert it once, in an environment you trust, with "
    "`sd = torch.load(path, map_location='cpu', weights_only=True); "
    "safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, 'model.safetensors')` "
    "and load the .safetensors file"
)


def load_checkpoint(path, **overrides):
    """Builds a `ViT` from a pretrained checkpoint, inferring its architecture from the tensors.

    Sources:
      - a local file or folder;
      - a handle: `hf://org/repo[@revision]` (a timm or transformers repo, or one holding Google
        `.npz` files), `gs://bucket/object` (Google's public buckets), or an `https://` URL;
      - a name from `keras_vit.list_pretrained()`, e.g. "vit_base_patch16_224.augreg2_in21k_ft_in1k".
    Handles are downloaded once into a cache and checked; see `keras_vit.hub`.

    Formats, detected from the file:
      - Google vit_jax / AugReg `.npz` ("Transformer/encoderblock_0/...") and big_vision `.npz`
        ("params/...", "params/img/..." for a SigLIP image tower): scan-stacked blocks, MAP heads,
        sin-cos models (no table stored: pass `image_size`). Defaults: tanh GELU, bilinear
        resampling, inputs in [-1, 1].
      - A timm `VisionTransformer` state dict as `.safetensors`. Its head count is not stored:
        it comes from `num_heads=`, the timm `config.json` beside it (as in timm's Hub repos),
        else the standard width table (192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16). The
        config.json also gives the input size, normalization, pooling and label names. Defaults:
        exact GELU, bicubic resampling, inputs in [-1, 1] (timm's ViT default; pass image_mean /
        image_std for models trained otherwise, e.g. DeiT).
      - A Hugging Face folder (config.json + model.safetensors) of a ViT, a SigLIP vision tower
        (`SiglipVisionModel`, `SiglipModel`, `SiglipForImageClassification`) or DINOv2
        (`Dinov2Model`, `Dinov2WithRegistersModel`): epsilon, activation, heads, grid and label
        names from config.json, normalization from preprocessor_config.json.

    Args:
        path: the file, the folder, a handle or a catalog name.
        **overrides: `image_size` (position embeddings are resampled with `resample_method`),
            `num_classes` (a different count gets a new zero-initialized head), `gelu_approximate`,
            `resample_method`, `image_mean`, `image_std`, `layer_norm_epsilon`, `pooling` ("token"
            on a file without class token reads the first token, big_vision's pool_type "0"),
            dropout rates, `class_names`, `dtype` (e.g. "float16" or "bfloat16": the weights are
            cast to it; float16 and bfloat16 files load into float32 by default), `name`;
            `labels` (a text file of class names, one per line); `num_heads` (timm only);
            `source_image_size` (the resolution a non-square checkpoint was trained at, when the
            file cannot say); `filename` (with hf:// handles: which file of the repo);
            `allow_nonfinite=True` to load weights holding NaN or Inf.

    1000-class models get the ImageNet-1k class names unless `labels` or `class_names` is given.
    Missing, unexpected or mis-shaped tensors raise one ValueError that names each of them, and so
    do NaN or Inf weights. Every tensor's name, dtype and size is checked from the file's headers
    before any data is read, so a file that declares more than it holds is refused, not allocated.
    Download failures raise `keras_vit.DownloadError` (a ConnectionError) naming the URL tried.
    """
    path = _locate(path, overrides.pop("filename", None))
    if path.is_dir():
        timm_config = _timm_config(path / "config.json")
        if timm_config is not None and (path / "model.safetensors").exists():
            return timm.load(path / "model.safetensors", overrides, timm.config_hints(timm_config))
        if (path / "config.json").exists() and (path / "model.safetensors").exists():
            return hf.load(path, overrides)
        if any((path / n).exists() for n in ("pytorch_model.bin", "model.bin")):
            raise ValueError(f"{path} holds pickled PyTorch weights. {_CONVERT}")
        raise ValueError(f"{path} is a folder without config.json + model.safetensors (a Hugging Face model)")
    if path.suffix in _PICKLED:
        raise ValueError(f"{path} is a pickled PyTorch file. {_CONVERT}")
    kind = _sniff(path)
    if kind == "npz":
        return google.load(path, overrides)
    timm_config = _timm_config(path.parent / "config.json")
    if timm_config is not None:
        return timm.load(path, overrides, timm.config_hints(timm_config))
    if (path.parent / "config.json").exists() and path.name == "model.safetensors":
        return hf.load(path.parent, overrides)
    return timm.load(path, overrides)


def _locate(source, filename):
    """The local path that `source` (a path, a handle or a catalog name) stands for."""
    if hub.is_handle(source):
        return pathlib.Path(hub.fetch(source, filename))
    if filename is not None:
        raise ValueError(f"filename={filename!r} picks a file of an hf:// repo; {source} is not an hf:// handle")
    path = pathlib.Path(source)
    if path.exists():
        return path
    entry = catalog.lookup(str(source))
    if entry is not None:
        return pathlib.Path(hub.fetch(entry.handle))
    close = catalog.closest(str(source))
    hint = f"; did you mean {' or '.join(repr(n) for n in close)}?" if close else (
        "; it is neither a handle (hf://, gs://, https://) nor a name of keras_vit.list_pretrained()")
    raise ValueError(f"checkpoint {source} does not exist{hint}")


def _timm_config(path):
    """The contents of a timm config.json (one with "architecture"), else None."""
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from e
    return config if isinstance(config, dict) and "architecture" in config else None


def _sniff(path):
    """"npz" for a zip archive, "safetensors" for anything else ending so; else an error."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"PK\x03\x04":
        return "npz"
    if path.suffix == ".safetensors":
        return "safetensors"
    raise ValueError(f"{path} is neither a .npz archive nor a .safetensors file; formats: Google .npz, "
                     "timm .safetensors, Hugging Face folder")


def save_checkpoint(model, path, format="timm"):
    """Writes `model` to `path` in the layout of `format`.

    "timm": a safetensors state dict that `timm.models.vision_transformer.VisionTransformer`
    loads (`load_state_dict`) when built with the same architecture: `img_size`, `patch_size`,
    `embed_dim`, `depth`, `num_heads`, `mlp_ratio`, `num_classes`, and for GAP models
    `class_token=False, global_pool="avg", fc_norm=False`; `act_layer` tanh-GELU when
    `model.gelu_approximate`. The file's metadata keeps what the tensors cannot say (heads, grid,
    normalization, GELU form, class names), so `load_checkpoint` restores the model exactly.
    """
    if not isinstance(model, ViT):
        raise ValueError(f"save_checkpoint takes a keras_vit.ViT, got {type(model).__name__}")
    if format != "timm":
        raise ValueError(f"format={format!r} is not supported; use 'timm'")
    timm.save(model, path)


__all__ = ["OVERRIDES", "imagenet_classes", "load_checkpoint", "read_labels", "save_checkpoint"]

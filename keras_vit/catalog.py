"""The catalog of official pretrained ViTs that `keras_vit.load` takes by name.

Names of timm-hosted models are timm's, so `"vit_base_patch16_224.augreg2_in21k_ft_in1k"` works as
a handle. Top-1 figures are as reported (not re-measured here): the AugReg and `orig` entries from
timm's `results/results-imagenet.csv` (pytorch-image-models commit aa4b585; bicubic resize, crop 0.9
at 224 and 1.0 at 384), the original `.npz` ViT-B/16 and ViT-L/16 from Dosovitskiy et al. (2021),
Table 5 (ImageNet-21k pre-training, fine-tuned at 384). All are Apache-2.0.
"""

import dataclasses
import difflib

_TIMM = "timm results-imagenet.csv (pytorch-image-models aa4b585)"
_PAPER = "Dosovitskiy et al. 2021, Table 5"
_ORIGINAL = "gs://vit_models/imagenet21k+imagenet2012/"


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """One catalog entry.

    Attributes:
        name: what `keras_vit.load` takes, e.g. "vit_base_patch16_224.augreg2_in21k_ft_in1k".
        handle: where the weights are, e.g. "hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k".
        resolution: the input side in pixels it was fine-tuned at.
        top1: reported ImageNet-1k top-1 accuracy (%), and `top1_source`, where it was reported.
        license: the weights' license.
        preset: the keras_vit preset of its architecture, at `resolution` with 1000 classes.
        timm_name: timm's name of the same architecture.
    """

    name: str
    handle: str
    resolution: int
    top1: float
    top1_source: str
    license: str
    preset: str
    timm_name: str


def _timm(name, top1, preset):
    architecture = name.split(".")[0]
    resolution = int(architecture.rsplit("_", 1)[1])
    return Pretrained(name, f"hf://timm/{name}", resolution, top1, _TIMM, "Apache-2.0", preset, architecture)


CATALOG = (
    # AugReg: Steiner et al. 2021, "How to train your ViT?", ImageNet-21k pre-training, ImageNet-1k fine-tuning.
    _timm("vit_tiny_patch16_224.augreg_in21k_ft_in1k", 75.452, "ViT-Ti/16"),
    _timm("vit_tiny_patch16_384.augreg_in21k_ft_in1k", 78.438, "ViT-Ti/16"),
    _timm("vit_small_patch32_224.augreg_in21k_ft_in1k", 76.010, "ViT-S/32"),
    _timm("vit_small_patch32_384.augreg_in21k_ft_in1k", 80.476, "ViT-S/32"),
    _timm("vit_small_patch16_224.augreg_in21k_ft_in1k", 81.402, "ViT-S/16"),
    _timm("vit_small_patch16_384.augreg_in21k_ft_in1k", 83.814, "ViT-S/16"),
    _timm("vit_base_patch32_224.augreg_in21k_ft_in1k", 80.732, "ViT-B/32"),
    _timm("vit_base_patch32_384.augreg_in21k_ft_in1k", 83.358, "ViT-B/32"),
    _timm("vit_base_patch16_224.augreg_in21k_ft_in1k", 84.534, "ViT-B/16"),
    _timm("vit_base_patch16_224.augreg2_in21k_ft_in1k", 85.108, "ViT-B/16"),
    _timm("vit_base_patch16_384.augreg_in21k_ft_in1k", 86.010, "ViT-B/16"),
    _timm("vit_large_patch16_224.augreg_in21k_ft_in1k", 85.856, "ViT-L/16"),
    _timm("vit_large_patch16_384.augreg_in21k_ft_in1k", 87.096, "ViT-L/16"),
    # The original release's weights, as converted by timm.
    _timm("vit_base_patch16_224.orig_in21k_ft_in1k", 81.782, "ViT-B/16"),
    _timm("vit_base_r50_s16_384.orig_in21k_ft_in1k", 84.988, "R50+ViT-B/16"),
    # The original release's own files.
    Pretrained("ViT-B_16.imagenet21k+imagenet2012", _ORIGINAL + "ViT-B_16.npz", 384, 83.97, _PAPER, "Apache-2.0",
               "ViT-B/16", "vit_base_patch16_384"),
    Pretrained("ViT-L_16.imagenet21k+imagenet2012", _ORIGINAL + "ViT-L_16.npz", 384, 85.15, _PAPER, "Apache-2.0",
               "ViT-L/16", "vit_large_patch16_384"),
    Pretrained("R50+ViT-B_16.imagenet21k+imagenet2012", _ORIGINAL + "R50+ViT-B_16.npz", 384, 84.988, _TIMM,
               "Apache-2.0", "R50+ViT-B/16", "vit_base_r50_s16_384"),
)
_BY_NAME = {entry.name: entry for entry in CATALOG}


def list_pretrained():
    """The catalog: a tuple of `Pretrained` entries (name, handle, resolution, top1, license, ...).

    Any entry's `name` can be passed to `keras_vit.load` in place of a path:
    `keras_vit.load("vit_base_patch16_224.augreg2_in21k_ft_in1k")`.
    """
    return CATALOG


def lookup(name):
    """The entry called `name`, or None."""
    return _BY_NAME.get(name)


def closest(name, n=3):
    """Up to `n` catalog names that look like `name`."""
    return difflib.get_close_matches(name, list(_BY_NAME), n=n, cutoff=0.6)

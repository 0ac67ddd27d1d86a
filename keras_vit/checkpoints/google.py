"""Google's `.npz` checkpoints: the original vit_jax release (and AugReg, and the R50+ViT hybrids),
whose names are the canonical ones (see `canonical`), and the files of big_vision
(`big_vision/models/vit.py`), including the image tower of SigLIP and SigLIP 2 two-tower
checkpoints.

Hybrids: the ResNet stem's tensors sit at the top level next to the ViT's, and the patch embedding
sees F feature channels instead of C. Google's pre-Linen code stored GroupNorm parameters as
(1, 1, 1, C); they are squeezed to (C,).

big_vision, relative to the vit_jax names: the blocks' modules are renamed
(MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0); the position table "pos_embedding"
sits at the top level without a class-token row (big_vision adds it before prepending the token),
or is absent when the model was built with posemb="sincos2d" (the table is then recomputed, see
`keras_vit.layers.sincos_2d`); the blocks may be scan-stacked under "Transformer/encoderblock/"
with a leading layer axis L; a MAP head is "MAPHead_0/...", already the canonical names.
pool_type maps to `pooling`: "tok" (a "cls" tensor) -> "token"; "map" (a MAPHead_0) -> "map";
"gap" -> "gap". "0" (first patch token) and "none" (every token classified) store nothing that
tells them from "gap": pass pooling="token" or pooling="none" for those. rep_size is the tanh
"pre_logits" Dense.

Shapes: P patch, C channels, F stem feature width, D width, K heads, Dh head width, M MLP width,
N patches, L layers.
"""

import re

import numpy as np

from keras_vit.checkpoints.canonical import BLOCK, LN2, MAP, MHA, MLP, POS, canonical_shapes
from keras_vit.checkpoints.common import build_model, check_tensors, grid_from_rows, source_grid_override
from keras_vit.checkpoints.npz_io import read as read_npz
from keras_vit.layers.resnet import STAGE_WIDTHS

# Flax's GELU is the tanh form; the official fine-tuning code resamples bilinearly and feeds
# pixels in [-1, 1].
DEFAULTS = dict(gelu_approximate=True, resample_method="bilinear", image_mean=(0.5,) * 3, image_std=(0.5,) * 3)
# Flax optimizer state (vit_jax), big_vision params, and the image tower of a big_vision two-tower
# (SigLIP) checkpoint, whose other entries ("params/txt/...", "params/t", "params/b") are ignored.
_PREFIXES = ("opt/target/", "params/", "params/img/")
_UNIT = re.compile(r"block(\d+)/unit(\d+)/")
_RENAMES = ((MHA, "MultiHeadDotProductAttention_0/"), (LN2, "LayerNorm_1/"), (MLP, "MlpBlock_0/"))
_SCAN = "Transformer/encoderblock/"


def load(path, overrides):
    """Builds a `ViT` from a vit_jax or big_vision `.npz` file."""
    raw = read_npz(path)
    prefix = next((p for p in _PREFIXES if p + "embedding/kernel" in raw), "")
    tensors = squeeze_norms({k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)})
    if "embedding/kernel" not in tensors:
        raise ValueError(f"{path} has no 'embedding/kernel'; it is not a ViT checkpoint (found {sorted(raw)[:8]} ...)")
    if is_big_vision(tensors, prefix):
        return load_big_vision(tensors, path, overrides)
    spec = _vit_jax_spec(tensors, source_grid_override(overrides, tensors["embedding/kernel"].shape[0]))
    spec.update(stem_spec(tensors))  # a hybrid's ResNet stem, if the file has one
    check_tensors({k: v.shape for k, v in tensors.items()}, canonical_shapes(spec), str(path))
    return build_model(spec, tensors, DEFAULTS, overrides)


def _vit_jax_spec(tensors, source_grid):
    """The architecture, read from tensor shapes; heads from the query kernel (D, K, Dh)."""
    p, _, c, d = tensors["embedding/kernel"].shape
    first = BLOCK.format(0)
    num_layers = len({k.split("/")[1] for k in tensors if k.startswith("Transformer/encoderblock_")})
    class_token = "cls" in tensors
    pos = tensors.get(POS)
    if pos is None:
        raise ValueError(f"the checkpoint has no {POS}; vit_jax checkpoints store a learned position table")
    return dict(
        patch_size=int(p), num_channels=int(c), hidden_dim=int(d), num_layers=int(num_layers),
        num_heads=int(tensors[first + MHA + "query/kernel"].shape[1]),
        mlp_dim=int(tensors[first + MLP + "Dense_0/kernel"].shape[-1]),
        num_classes=int(tensors["head/kernel"].shape[-1]) if "head/kernel" in tensors else 0,
        representation_size=int(tensors["pre_logits/kernel"].shape[-1]) if "pre_logits/kernel" in tensors else None,
        class_token=class_token, grid=grid_from_rows(pos.shape[-2] - int(class_token), source_grid),
    )


def is_stem_tensor(name):
    """Whether `name` belongs to a hybrid's ResNet stem (see `canonical`)."""
    return name.startswith(("conv_root/", "gn_root/")) or _UNIT.match(name) is not None


def squeeze_norms(tensors):
    """GroupNorm scales and biases of shape (1, 1, 1, C) -> (C,); everything else unchanged."""
    def squeeze(name, value):
        if is_stem_tensor(name) and "/gn" in "/" + name and value.ndim == 4:
            return value.reshape(value.shape[-1])
        return value

    return {k: squeeze(k, v) for k, v in tensors.items()}


def stem_spec(tensors):
    """{} for a plain ViT; for a hybrid, the stem's units per stage and the image channels."""
    if "conv_root/kernel" not in tensors:
        return {}
    units = {}
    for name in tensors:
        match = _UNIT.match(name)
        if match:
            stage, unit = int(match.group(1)), int(match.group(2))
            units[stage] = max(units.get(stage, 0), unit)
    if sorted(units) != list(range(1, len(units) + 1)) or len(units) > len(STAGE_WIDTHS):
        raise ValueError(f"the ResNet stem's stages are {sorted(units)}; expected 1 to 4 consecutive stages from block1")
    return dict(stem_layers=tuple(units[s] for s in sorted(units)), image_channels=int(tensors["conv_root/kernel"].shape[2]))


def is_big_vision(tensors, prefix):
    """Whether the (prefix-stripped) tensors use big_vision's names rather than vit_jax's."""
    return (prefix.startswith("params/") or "pos_embedding" in tensors
            or any(k.startswith(_SCAN) or "/MlpBlock_0/" in k for k in tensors if k.startswith("Transformer/")))


def load_big_vision(tensors, source, overrides):
    """Builds a `ViT` from big_vision tensors (prefix already stripped); `source` names the file."""
    scan = any(k.startswith(_SCAN) for k in tensors)
    patch = tensors["embedding/kernel"].shape[0]
    source_grid = source_grid_override(overrides, patch)
    if "pos_embedding" not in tensors and source_grid is None and "image_size" in overrides:
        # A sin-cos table is recomputed for any grid, so the training resolution does not matter.
        source_grid = source_grid_override({"source_image_size": overrides["image_size"]}, patch)
    spec = _big_vision_spec(tensors, scan, source_grid)
    expected = {_name(k, scan): _shape(k, s, spec, scan) for k, s in canonical_shapes(spec).items()}
    check_tensors({k: v.shape for k, v in tensors.items()}, expected, str(source))
    return build_model(spec, _to_canonical(tensors, spec, scan), DEFAULTS, overrides)


def _big_vision_spec(tensors, scan, source_grid):
    """The architecture, read from tensor shapes; heads from the query kernel (D, K, Dh)."""
    kernel, pos = tensors["embedding/kernel"], tensors.get("pos_embedding")
    if kernel.ndim != 4 or (pos is not None and (pos.ndim != 3 or pos.shape[0] != 1)):
        raise ValueError(f"embedding/kernel {kernel.shape} and pos_embedding {None if pos is None else pos.shape} are "
                         "not a ViT's (P, P, C, D) and (1, N, D): a SigLIP 2 NaFlex checkpoint? It is not read yet")
    p, _, c, d = kernel.shape
    first = _SCAN if scan else BLOCK.format(0)
    if scan:
        num_layers = tensors[first + "LayerNorm_0/scale"].shape[0]
    else:
        num_layers = len({k.split("/")[1] for k in tensors if k.startswith("Transformer/encoderblock_")})
    query = tensors.get(first + "MultiHeadDotProductAttention_0/query/kernel")
    if query is None:
        raise ValueError(f"no {first}MultiHeadDotProductAttention_0/query/kernel; not a big_vision ViT")
    if pos is None and source_grid is None:
        raise ValueError("a sin-cos (posemb='sincos2d') checkpoint stores no position table and so no input "
                         "size; pass image_size=(H, W), e.g. the resolution it was trained at")
    class_token = "cls" in tensors
    pooling = "token" if class_token else "map" if MAP + "probe" in tensors else "gap"
    return dict(
        patch_size=int(p), num_channels=int(c), hidden_dim=int(d), num_layers=int(num_layers),
        num_heads=int(query.shape[-2]), mlp_dim=int(tensors[first + "MlpBlock_0/Dense_0/kernel"].shape[-1]),
        num_classes=int(tensors["head/kernel"].shape[-1]) if "head/kernel" in tensors else 0,
        representation_size=int(tensors["pre_logits/kernel"].shape[-1]) if "pre_logits/kernel" in tensors else None,
        class_token=class_token, pooling=pooling, position_embedding="sincos" if pos is None else "learned",
        grid=tuple(source_grid) if pos is None else grid_from_rows(pos.shape[-2], source_grid),
    )


def _name(name, scan):
    """Canonical name -> big_vision name (the per-layer index dropped when scan-stacked)."""
    if name == POS:
        return "pos_embedding"
    if not name.startswith("Transformer/encoderblock_"):
        return name
    for old, new in _RENAMES:
        name = name.replace(old, new)
    return _SCAN + name.split("/", 2)[2] if scan else name


def _shape(name, shape, spec, scan):
    """Canonical shape -> big_vision shape."""
    if name == POS:
        return (1, spec["grid"][0] * spec["grid"][1], shape[-1])  # no class-token row
    if scan and name.startswith("Transformer/encoderblock_"):
        return (spec["num_layers"], *shape)  # (L, ...) stacked over layers
    return shape


def _to_canonical(tensors, spec, scan):
    """big_vision tensors -> canonical ones."""
    out = {}
    for name in canonical_shapes(spec):
        value = tensors[_name(name, scan)]
        if scan and name.startswith("Transformer/encoderblock_"):
            value = value[int(name.split("/")[1].rsplit("_", 1)[1])]  # (L, ...) -> (...)
        out[name] = value
    if spec["class_token"] and POS in out:
        # big_vision adds no position to the class token: a zero row is the same thing.
        pos = out[POS]
        out[POS] = np.concatenate([np.zeros_like(pos[:, :1]), pos], axis=1)  # (1, N, D) -> (1, 1 + N, D)
    return out

"""Google's `.npz` checkpoints: the original vit_jax release (and AugReg) and big_vision.

vit_jax names are the canonical ones (see `common`). big_vision renamed the block's modules
(MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0), keeps the position table at the top
level without a class-token row (it adds the table before prepending the token), and may store the
blocks scan-stacked under "Transformer/encoderblock/" with a leading layer axis L.
Shapes: P patch, C channels, D width, K heads, Dh head width, M MLP width, N patches.
"""

import numpy as np

from keras_vit.checkpoints import hybrid
from keras_vit.checkpoints.common import (
    BLOCK, LN2, MHA, MLP, POS, build_model, canonical_shapes, check_tensors, grid_from_rows, source_grid_override,
)
from keras_vit.checkpoints.npz_io import read as read_npz

_PREFIXES = ("opt/target/", "params/")
_BV_RENAMES = ((MHA, "MultiHeadDotProductAttention_0/"), (LN2, "LayerNorm_1/"), (MLP, "MlpBlock_0/"))
_SCAN = "Transformer/encoderblock/"


def load(path, overrides):
    """Builds a `ViT` from a vit_jax or big_vision `.npz` file."""
    raw = read_npz(path)
    prefix = next((p for p in _PREFIXES if p + "embedding/kernel" in raw), "")
    tensors = hybrid.squeeze_norms({k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)})
    if "embedding/kernel" not in tensors:
        raise ValueError(f"{path} has no 'embedding/kernel'; it is not a ViT checkpoint (found {sorted(raw)[:8]} ...)")
    if any("MAPHead" in k for k in tensors):
        raise ValueError(f"{path} has an attention-pooling (MAP) head, which load_checkpoint does not read yet")
    big_vision = prefix == "params/" or "pos_embedding" in tensors or any(k.startswith(_SCAN) for k in tensors)
    spec = _spec(tensors, big_vision, source_grid_override(overrides, tensors["embedding/kernel"].shape[0]))
    spec.update(hybrid.stem_spec(tensors))  # a hybrid's ResNet stem, if the file has one
    expected = canonical_shapes(spec)
    if big_vision:
        scan = any(k.startswith(_SCAN) for k in tensors)
        expected = _to_big_vision_shapes(expected, spec, scan)
        check_tensors({k: v.shape for k, v in tensors.items()}, expected, str(path))
        tensors = _from_big_vision(tensors, spec, scan)
    else:
        check_tensors({k: v.shape for k, v in tensors.items()}, expected, str(path))
    return build_model(spec, tensors, "google", overrides)


def _spec(tensors, big_vision, source_grid):
    """The architecture, read from tensor shapes; heads from the query kernel (D, K, Dh)."""
    p, _, c, d = tensors["embedding/kernel"].shape
    scan = any(k.startswith(_SCAN) for k in tensors)
    mha = "MultiHeadDotProductAttention_0/" if big_vision else MHA
    mlp = "MlpBlock_0/" if big_vision else MLP
    first = _SCAN if scan else BLOCK.format(0)
    lead = 1 if scan else 0  # the stacked layer axis
    if scan:
        num_layers = tensors[first + "LayerNorm_0/scale"].shape[0]
    else:
        num_layers = len({k.split("/")[1] for k in tensors if k.startswith("Transformer/encoderblock_")})
    class_token = "cls" in tensors
    pos = tensors.get("pos_embedding" if big_vision else POS)
    if pos is None:
        raise ValueError("the checkpoint has no learned position embedding (sin-cos tables are not loaded)")
    rows = pos.shape[-2] - (0 if big_vision else int(class_token))
    return dict(
        patch_size=int(p), num_channels=int(c), hidden_dim=int(d), num_layers=int(num_layers),
        num_heads=int(tensors[first + mha + "query/kernel"].shape[lead + 1]),
        mlp_dim=int(tensors[first + mlp + "Dense_0/kernel"].shape[-1]),
        num_classes=int(tensors["head/kernel"].shape[-1]) if "head/kernel" in tensors else 0,
        representation_size=int(tensors["pre_logits/kernel"].shape[-1]) if "pre_logits/kernel" in tensors else None,
        class_token=class_token, grid=grid_from_rows(rows, source_grid),
    )


def _bv_name(name, scan):
    """Canonical name -> big_vision name (the per-layer index dropped when scan-stacked)."""
    if name == POS:
        return "pos_embedding"
    for old, new in _BV_RENAMES:
        name = name.replace(old, new)
    if scan and name.startswith("Transformer/encoderblock_"):
        name = _SCAN + name.split("/", 2)[2]
    return name


def _to_big_vision_shapes(shapes, spec, scan):
    """Canonical name -> shape, renamed and reshaped to big_vision's layout."""
    out = {}
    for name, shape in shapes.items():
        if name == POS:
            shape = (1, spec["grid"][0] * spec["grid"][1], shape[-1])  # no class-token row
        elif scan and name.startswith("Transformer/encoderblock_"):
            shape = (spec["num_layers"], *shape)  # (L, ...) stacked over layers
        out[_bv_name(name, scan)] = shape
    return out


def _from_big_vision(tensors, spec, scan):
    """big_vision tensors -> canonical ones."""
    out = {}
    for name in canonical_shapes(spec):
        bv = _bv_name(name, scan)
        if scan and name.startswith("Transformer/encoderblock_"):
            out[name] = tensors[bv][int(name.split("/")[1].rsplit("_", 1)[1])]  # (L, ...) -> (...)
        else:
            out[name] = tensors[bv]
    if spec["class_token"]:
        # big_vision adds no position to the class token: a zero row is the same thing.
        pos = out[POS]
        out[POS] = np.concatenate([np.zeros_like(pos[:, :1]), pos], axis=1)  # (1, N, D) -> (1, 1 + N, D)
    return out

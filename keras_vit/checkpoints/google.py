"""Google's `.npz` checkpoints: the original vit_jax release (and AugReg), whose names are the
canonical ones (see `common`), and the files of big_vision, which `big_vision` reads.
Shapes: P patch, C channels, D width, K heads, Dh head width, M MLP width, N patches.
"""

import numpy as np

from keras_vit.checkpoints import big_vision, hybrid
from keras_vit.checkpoints.common import (
    BLOCK, MHA, MLP, POS, build_model, canonical_shapes, check_tensors, grid_from_rows, source_grid_override,
)
from keras_vit.checkpoints.npz_io import read as read_npz

# Flax optimizer state (vit_jax), big_vision params, and the image tower of a big_vision two-tower
# (SigLIP) checkpoint, whose other entries ("params/txt/...", "params/t", "params/b") are ignored.
_PREFIXES = ("opt/target/", "params/", "params/img/")


def load(path, overrides):
    """Builds a `ViT` from a vit_jax or big_vision `.npz` file."""
    raw = read_npz(path)
    prefix = next((p for p in _PREFIXES if p + "embedding/kernel" in raw), "")
    tensors = hybrid.squeeze_norms({k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)})
    if "embedding/kernel" not in tensors:
        raise ValueError(f"{path} has no 'embedding/kernel'; it is not a ViT checkpoint (found {sorted(raw)[:8]} ...)")
    if big_vision.is_big_vision(tensors, prefix):
        return big_vision.load(tensors, path, overrides)
    spec = _spec(tensors, source_grid_override(overrides, tensors["embedding/kernel"].shape[0]))
    spec.update(hybrid.stem_spec(tensors))  # a hybrid's ResNet stem, if the file has one
    check_tensors({k: v.shape for k, v in tensors.items()}, canonical_shapes(spec), str(path))
    return build_model(spec, tensors, "google", overrides)


def _spec(tensors, source_grid):
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

"""Hugging Face folders (`config.json` + `model.safetensors`), read by the module for the
config's `model_type`: `vit` (transformers ViT), `siglip` (SigLIP vision towers and classifiers)
and `dinov2` (DINOv2, with or without registers); `common` holds what they share.
"""

from keras_vit.checkpoints.hf import dinov2, siglip, vit
from keras_vit.checkpoints.hf.common import read_config

# config.json's model_type -> the reader of that folder.
READERS = {t: reader for reader in (vit, siglip, dinov2) for t in reader.MODEL_TYPES}


def load(folder, overrides):
    """Builds a `ViT` from a Hugging Face folder, by the reader of its model_type."""
    model_type = read_config(folder).get("model_type", "vit")
    if model_type not in READERS:
        raise ValueError(f"{folder}/config.json has model_type={model_type!r}; supported: {sorted(READERS)}")
    return READERS[model_type].load(folder, overrides)

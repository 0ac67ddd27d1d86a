"""keras_vit: the Vision Transformer (Dosovitskiy et al., ICLR 2021) as Keras 3 layers."""

import importlib
import typing

from keras_vit import layers, naflex
from keras_vit.cost import block_macs, count_params, model_macs
from keras_vit.explain import (attention_maps, attention_rollout, class_relevance, mean_attention_distance,
                               position_embedding_similarity)
from keras_vit.distribution import layout_map
from keras_vit.catalog import list_pretrained
from keras_vit.export import export
from keras_vit.checkpoints import load, load_checkpoint, save_checkpoint  # noqa: F401  (load_checkpoint: load's earlier name)
from keras_vit.hub import DownloadError
from keras_vit.models import PRESETS, ViT, preset_config, resize
from keras_vit.preprocessing import Preprocessing

__version__ = "0.1.0"

__all__ = [
    "DownloadError",
    "PRESETS",
    "Preprocessing",
    "ViT",
    "attention_maps",
    "attention_rollout",
    "block_macs",
    "class_relevance",
    "count_params",
    "export",
    "layers",
    "layout_map",
    "list_pretrained",
    "load",
    "mean_attention_distance",
    "model_macs",
    "naflex",
    "position_embedding_similarity",
    "preset_config",
    "push_to_hub",
    "resize",
    "save_checkpoint",
]

# Loaded on first use (PEP 562): publishing imports huggingface_hub and its HTTP client, which
# `import keras_vit` does not need.
_LAZY = {"push_to_hub": "keras_vit.checkpoints.publish"}
if typing.TYPE_CHECKING:  # the same names, for type checkers and the API reference
    from keras_vit.checkpoints.publish import push_to_hub  # noqa: F401


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])

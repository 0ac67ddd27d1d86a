from keras_vit.models.presets import PRESETS, SIZES, preset_config
from keras_vit.models.resize import new_head_config, resize
from keras_vit.models.vit import ViT

__all__ = ["PRESETS", "SIZES", "ViT", "new_head_config", "preset_config", "resize"]

from keras_vit.models.presets import PRESETS, SIZES, preset_config
from keras_vit.models.resize import resize
from keras_vit.models.vit import ViT

__all__ = ["PRESETS", "SIZES", "ViT", "preset_config", "resize"]

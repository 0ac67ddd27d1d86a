from keras_vit.models.presets import PRESETS, SIZES, preset_config
from keras_vit.models.resize import adapt, new_head_config, resize, variable_shapes, weights
from keras_vit.models.vit import ViT
from keras_vit.models.backbone import ViTFeatures

__all__ = ["PRESETS", "SIZES", "ViT", "ViTFeatures", "adapt", "new_head_config", "preset_config", "resize",
           "variable_shapes", "weights"]

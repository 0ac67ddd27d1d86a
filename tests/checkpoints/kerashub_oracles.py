"""keras-hub presets with random weights, written by keras-hub's own `save_to_preset`: ViT, and the
vision towers of SigLIP and DINOv2."""

import keras_hub
import numpy as np

TINY_HUB = dict(image_shape=(32, 32, 3), patch_size=4, num_layers=2, num_heads=3, hidden_dim=48, mlp_dim=96)
TINY_TOWER = dict(image_shape=(32, 32, 3), patch_size=4, num_layers=2, num_heads=3, hidden_dim=48, intermediate_dim=96)
MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.3, 0.4)


def keras_hub_preset(folder, backbone_options=None, head=None, normalized=True, seed=0):
    """A random-weight keras-hub ViT saved with `save_to_preset` into `folder`; returns the model."""
    model = keras_hub.models.ViTBackbone(**{**TINY_HUB, **(backbone_options or {})})
    converter = _converter(keras_hub.layers.ViTImageConverter, normalized)
    if head is not None:
        preprocessor = keras_hub.models.ViTImageClassifierPreprocessor(image_converter=converter)
        model = keras_hub.models.ViTImageClassifier(backbone=model, preprocessor=preprocessor, **head)
    _randomize(model, seed)
    model.save_to_preset(str(folder))
    if head is None:
        converter.save_to_preset(str(folder))
    return model


def siglip_preset(folder, options=None, alone=False, seed=0):
    """A random-weight keras-hub `SigLIPBackbone` (beside its vision tower, a tiny text tower), or its
    `SigLIPVisionEncoder` `alone`, saved into `folder` with an image converter stating MEAN, STD;
    returns the vision encoder."""
    vision = keras_hub.models.SigLIPVisionEncoder(**{**TINY_TOWER, **(options or {})})
    model = vision if alone else keras_hub.models.SigLIPBackbone(vision, keras_hub.models.SigLIPTextEncoder(
        vocabulary_size=50, embedding_dim=48, hidden_dim=48, num_layers=1, num_heads=3, intermediate_dim=96))
    _randomize(model, seed)
    model.save_to_preset(str(folder))
    _converter(keras_hub.layers.SigLIPImageConverter, True).save_to_preset(str(folder))
    return vision


def dinov2_preset(folder, options=None, seed=0):
    """A random-weight keras-hub `DINOV2Backbone` saved into `folder` with an image converter stating
    MEAN, STD; returns the backbone as keras-hub loads it back (`from_preset` recomputes the table
    at `image_shape` from the one at `position_embedding_shape`)."""
    model = keras_hub.models.DINOV2Backbone(**{**TINY_TOWER, "position_embedding_shape": (32, 32, 3),
                                               **(options or {})})
    _randomize(model, seed)
    model.save_to_preset(str(folder))
    _converter(keras_hub.layers.DINOV2ImageConverter, True).save_to_preset(str(folder))
    return keras_hub.models.DINOV2Backbone.from_preset(str(folder))


def torch_bicubic(table, grid, new_grid, antialias):
    """A position table (1, 1 + h * w, D) resampled to `new_grid` by torch's bicubic
    `F.interpolate`, which keras-hub's DINOv2 uses on the torch backend; the class row is kept."""
    import torch

    patches = torch.from_numpy(np.asarray(table[:, 1:]).reshape(1, *grid, -1)).permute(0, 3, 1, 2)  # (1, D, h, w)
    patches = torch.nn.functional.interpolate(patches, size=new_grid, mode="bicubic", align_corners=False,
                                              antialias=antialias)
    patches = patches.permute(0, 2, 3, 1).reshape(1, -1, table.shape[-1]).numpy()  # (1, D, h', w') -> (1, h' * w', D)
    return np.concatenate([table[:, :1], patches], axis=1)


def _converter(cls, normalized):
    """An image converter at 32 px: pixels x scale + offset = (pixels / 255 - MEAN) / STD, or pixels / 255."""
    return cls(image_size=(32, 32), scale=[1 / (255 * s) for s in STD] if normalized else 1 / 255,
               offset=[-m / s for m, s in zip(MEAN, STD)] if normalized else None)


def _randomize(model, seed):
    """Random values in every float variable (integer position ids keep theirs)."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        if "float" in str(v.dtype):
            v.assign(rng.normal(0.0, 0.2, v.shape).astype("float32"))

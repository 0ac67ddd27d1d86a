"""keras-hub ViT presets with random weights, written by keras-hub's own `save_to_preset`."""

import keras_hub
import numpy as np

TINY_HUB = dict(image_shape=(32, 32, 3), patch_size=4, num_layers=2, num_heads=3, hidden_dim=48, mlp_dim=96)
MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.3, 0.4)


def keras_hub_preset(folder, backbone_options=None, head=None, normalized=True, seed=0):
    """A random-weight keras-hub ViT saved with `save_to_preset` into `folder`; returns the model."""
    model = keras_hub.models.ViTBackbone(**{**TINY_HUB, **(backbone_options or {})})
    converter = keras_hub.layers.ViTImageConverter(
        image_size=(32, 32), scale=[1 / (255 * s) for s in STD] if normalized else 1 / 255,
        offset=[-m / s for m, s in zip(MEAN, STD)] if normalized else None)
    if head is not None:
        preprocessor = keras_hub.models.ViTImageClassifierPreprocessor(image_converter=converter)
        model = keras_hub.models.ViTImageClassifier(backbone=model, preprocessor=preprocessor, **head)
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0.0, 0.2, v.shape).astype("float32"))
    model.save_to_preset(str(folder))
    if head is None:
        converter.save_to_preset(str(folder))
    return model

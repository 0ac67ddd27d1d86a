"""Adapting a trained ViT to a new task (§3.2, "Fine-tuning and higher resolution"): a new input
resolution, and a new classifier."""

import numpy as np

from keras_vit.layers import resample_position_embedding
from keras_vit.models.vit import ViT


def resize(model, image_size, method=None):
    """Returns a copy of `model` that takes images of `image_size`.

    The patch size, and so every weight, is unchanged except the patch rows of a learned position
    embedding, which are resampled from the old token grid to the new one; the class-token row is
    kept. Fixed sin-cos embeddings are recomputed for the new grid. Resizing to the same size
    returns an exact copy.

    Args:
        model: a `ViT`.
        image_size: int or (H, W), multiples of the patch size.
        method: one of `RESAMPLE_METHODS`; None uses `model.resample_method`.
    """
    if not isinstance(model, ViT):
        raise ValueError(f"resize takes a keras_vit.ViT, got {type(model).__name__}")
    config = model.get_config()
    config.update(image_size=image_size)
    if method is not None:
        config.update(resample_method=method)
    resized = ViT.from_config(config)
    for old, new in zip(model.weights, resized.weights):
        value = np.asarray(old.numpy())
        if old is model.position_embedding.embedding:
            if model.position_embedding_kind == "sincos":
                continue
            value = resample_position_embedding(
                value,
                model.grid_size,
                resized.grid_size,
                num_prefix_tokens=model.num_prefix_tokens,
                method=resized.resample_method,
            )
        new.assign(value)
    return resized


def new_head_config(config, num_classes, class_names=None):
    """A ViT's constructor arguments `config` for a new task of `num_classes` classes: the
    classifier starts at zero, the paper's new fine-tuning head (§3.2), and the old class names
    are dropped. The caller copies every other weight."""
    return {**config, "num_classes": num_classes, "class_names": class_names, "head_initializer": "zeros"}

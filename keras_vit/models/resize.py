"""Adapting a trained ViT to a new task (§3.2, "Fine-tuning and higher resolution"): a new input
resolution, and a new head. `adapt` is the one copy of weights between two ViTs of one
architecture, paired by variable path; `resize`, `keras_vit.load` and fine-tuning's
`--weights` all go through it. Variables are keyed by their path below the model (`weights`), and
`variable_shapes` gives a model's shapes without its values, as checkpoint formats need them.

Shapes: (h, w) token grid, R prefix rows (class and register tokens), D width.
"""

import keras
import numpy as np

from keras_vit.layers import resample_position_embedding
from keras_vit.layers.resample import LINEAR, resample_matrix
from keras_vit.models.vit import ViT

POSITIONS = "position_embedding/embedding"
FACTORIZED = ("position_embedding/rows", "position_embedding/columns")  # a factorized table's rows and columns
# The weights a new head replaces: the paper removes "the pre-trained prediction head" (§3.2),
# which at pre-training time is an MLP (§3.1), so its hidden pre-logits layer goes too.
NEW_HEAD = ("head/pre_logits/", "head/classifier/")


def resize(model, image_size, method=None):
    """Returns a copy of `model` that takes images of `image_size`.

    The patch size, and so every weight, is unchanged except the patch rows of a learned position
    embedding, which are resampled from the old token grid to the new one (the class-token row is
    kept), and a factorized one's row and column tables, resampled linearly as timm does. Fixed
    sin-cos embeddings are recomputed for the new grid. Resizing to the same size
    returns an exact copy.

    Args:
        model: a `ViT`.
        image_size: int or (H, W), multiples of the patch size.
        method: one of `RESAMPLE_METHODS`; None uses `model.resample_method`.
    """
    if not isinstance(model, ViT):
        raise ValueError(f"resize takes a keras_vit.ViT, got {type(model).__name__}")
    config = dict(model.get_config(), image_size=image_size)
    if method is not None:
        config.update(resample_method=method)
    return adapt(weights(model), model.grid_size, config)


def new_head_config(config, num_classes, class_names=None):
    """A ViT's constructor arguments `config` for a new task of `num_classes` classes, with the
    paper's new fine-tuning head (§3.2): the pre-trained head goes, pre-logits layer included
    (`representation_size=None`), and a zero-initialized D x `num_classes` classifier takes its
    place. The old class names go too. Pass the result to `adapt` with `new_head=True`."""
    return {**config, "num_classes": num_classes, "class_names": class_names, "head_initializer": "zeros",
            "representation_size": None}


def adapt(values, grid, config, new_head=False):
    """Builds `ViT(**config)` and copies `values` into it, each variable from the value of the
    same path.

    Args:
        values: {path: array} of a ViT of the same encoder (`weights(model)`, or a checkpoint's).
        grid: (h, w), the token grid of the model `values` come from; a learned position table
            (1, R + h * w, D) is resampled to the new grid with `config`'s `resample_method`, a
            factorized one's tables (1, h, D) and (1, w, D) linearly.
        config: the new model's arguments: another `image_size`, dropout, dtype, names, or a new
            head from `new_head_config`.
        new_head: leave the head of `NEW_HEAD` as `config` initializes it, and ignore that of
            `values`.

    Every other variable of the new model must have a value of its shape: a ValueError names
    those that have none.
    """
    model = ViT(**config)
    missing = []
    for variable in model.weights:
        key = variable_path(variable, model)
        if (new_head and key.startswith(NEW_HEAD)) or (key == POSITIONS and model.position_embedding_kind == "sincos"):
            continue  # the new head keeps its initialization; a sin-cos table is computed, not learned
        value = values.get(key)
        if key == POSITIONS and value is not None:
            value = resample_position_embedding(np.asarray(value, "float32"), grid, model.grid_size,
                                                num_prefix_tokens=model.num_prefix_tokens, method=model.resample_method)
        if key in FACTORIZED and value is not None:  # (1, h, D) or (1, w, D), resampled as timm does
            axis = FACTORIZED.index(key)
            matrix = resample_matrix(grid[axis], model.grid_size[axis], LINEAR)  # (h', h)
            value = (matrix @ np.asarray(value[0], "float64"))[None].astype("float32")
        if value is None or tuple(value.shape) != tuple(variable.shape):
            missing.append(f"{key} {tuple(variable.shape)}" + ("" if value is None else f" (given {value.shape})"))
            continue
        variable.assign(value)
    if missing:
        raise ValueError(f"the weights given have no value of the right shape for {missing}")
    return model


def variable_path(variable, model):
    """The variable's path below the model: "vit/encoder/norm/gamma" -> "encoder/norm/gamma"."""
    parts = variable.path.split("/")
    return "/".join(parts[parts.index(model.name) + 1:] if model.name in parts else parts[1:])


def weights(model):
    """{path: numpy array} of every variable of `model`, as `adapt` takes them."""
    return {variable_path(v, model): keras.ops.convert_to_numpy(v) for v in model.weights}


def variable_shapes(config):
    """(the model, {path: shape}) of `ViT(**config)`, built under `keras.StatelessScope`: its
    variables have shapes and no values, so no memory is taken whatever the model's size."""
    with keras.StatelessScope(initialize_variables=False):
        model = ViT(**config)
    _forget(model.weights)
    return model, {variable_path(v, model): tuple(v.shape) for v in model.weights}


def _forget(variables):
    """Drops `variables` from the list of variables that Keras initializes (allocating them) when
    the next stateless scope ends; these are only ever read for their shapes."""
    try:
        from keras.src.backend.common import global_state  # private: keras_vit.upstream
    except ImportError:  # a Keras that keeps no such list: nothing to drop
        return
    pending = global_state.get_global_attribute("uninitialized_variables") or []
    ids = {id(v) for v in variables}
    pending[:] = [v for v in pending if id(v) not in ids]

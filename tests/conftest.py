"""Shared fixtures. The backend is chosen by KERAS_BACKEND before keras is imported; `scripts/test`
runs this suite once per backend."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import keras_vit  # noqa: E402

# The tiny config of the house style: 32 px, patch 4, 2 layers, width 48.
TINY = dict(image_size=32, patch_size=4, hidden_dim=48, num_layers=2, num_heads=3, mlp_dim=96, num_classes=5)


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow (scripts/test does, and so does CI)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


def randomize(model, seed=0, scale=0.2):
    """Fills every weight with N(0, scale) so that zero-initialized heads and tokens are exercised."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0.0, scale, v.shape).astype("float32"))
    return model


def tiny_vit(**overrides):
    return keras_vit.ViT(**{**TINY, **overrides})


def random_vit(**overrides):
    """A tiny model with random weights, but for its sin-cos table, which stays the computed one."""
    model = tiny_vit(**overrides)
    fixed = [(v, to_numpy(v)) for v in model.weights if not v.trainable]
    randomize(model)
    for variable, value in fixed:
        variable.assign(value)
    return model


def images(shape=(2, 32, 32, 3), seed=1):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def logits(model, inputs):
    """`model(inputs)` as NumPy; on JAX compiled (`predict_on_batch`), whose eager calls compile
    each op for each new input shape, which takes much longer for a test's few calls."""
    if keras.backend.backend() == "jax":
        return model.predict_on_batch(inputs)
    return to_numpy(model(inputs))

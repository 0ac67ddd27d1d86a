"""layers.LayerNormalization: Keras' LayerNormalization in config, variables and outputs, and its
gradient (closed form on JAX, Keras' own on TensorFlow and torch) against the NumPy oracle."""

import keras
import numpy as np
import pytest
from tests.conftest import to_numpy

from keras_vit import layers
from keras_vit.explain import autodiff

SHAPE = (2, 5, 48)  # (B, T, D)


def _pair(axis=-1, center=True, dtype="float32", shape=SHAPE):
    """keras_vit's layer and Keras' with the same random gamma and beta."""
    ours = layers.LayerNormalization(axis=axis, epsilon=1e-6, center=center, dtype=dtype)
    theirs = keras.layers.LayerNormalization(axis=axis, epsilon=1e-6, center=center, dtype=dtype)
    rng = np.random.default_rng(1)
    for layer in (ours, theirs):
        layer.build(shape)
    weights = [rng.normal(1.0, 0.5, v.shape).astype("float32") for v in theirs.weights]
    ours.set_weights(weights)
    theirs.set_weights(weights)
    return ours, theirs


def _input(shape=SHAPE, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 3.0 + 1.0).astype("float32")


@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("axis", [-1, [1, 2]])
def test_outputs_variables_and_config_are_keras_layer_normalization(center, axis):
    ours, theirs = _pair(axis, center)
    x = _input()
    np.testing.assert_allclose(to_numpy(ours(x)), to_numpy(theirs(x)), atol=1e-6, rtol=0)
    assert [v.path.split("/")[-1] for v in ours.weights] == [v.path.split("/")[-1] for v in theirs.weights]
    assert [v.shape for v in ours.weights] == [v.shape for v in theirs.weights]
    assert {**ours.get_config(), "name": None} == {**theirs.get_config(), "name": None}


def test_mixed_bfloat16_computes_in_float32_and_returns_bfloat16():
    ours, theirs = _pair(dtype="mixed_bfloat16")
    x = keras.ops.cast(_input(), "bfloat16")
    y = ours(x)
    assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
    assert ours.gamma.dtype == "float32"
    # Both round one float32 result to bfloat16 (8 bits of mantissa): at most one step of 2^-7 apart.
    a, b = (to_numpy(keras.ops.cast(t, "float32")) for t in (y, theirs(x)))
    assert np.all(np.abs(a - b) <= 2.0**-7 * np.maximum(np.abs(b), 1.0))


def _oracle(x, gamma, beta, cot, axes):
    """y and dL/dx, dL/dgamma, dL/dbeta of L = sum(y * cot), in float64: the closed form."""
    x, cot = x.astype("float64"), cot.astype("float64")
    shape = [x.shape[a] if a in axes else 1 for a in range(x.ndim)]
    weight_shape, gamma = gamma.shape, gamma.reshape(shape)
    mean = x.mean(axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(((x - mean) ** 2).mean(axes, keepdims=True) + 1e-6)
    normed = (x - mean) * inv_std
    g = cot * gamma
    dx = inv_std * (g - g.mean(axes, keepdims=True) - normed * (g * normed).mean(axes, keepdims=True))
    rest = tuple(a for a in range(x.ndim) if a not in axes)
    y = normed * gamma + (0.0 if beta is None else beta.reshape(shape))
    grads = [dx, (cot * normed).sum(rest).reshape(weight_shape)]
    return y, grads + ([] if beta is None else [cot.sum(rest).reshape(weight_shape)])


def _gradients(layer, x, cot):
    weights = [keras.ops.convert_to_tensor(to_numpy(v)) for v in layer.trainable_variables]

    def fn(x, *weights):
        return layer.stateless_call(list(weights), [], x)[0], None

    out, _, grads = autodiff.vjp(fn, (x, *weights), cot)
    return to_numpy(out), [to_numpy(g) for g in grads]


@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("axis", [-1, [1, 2]])
def test_gradient_is_the_closed_form_and_autodiffs(center, axis):
    ours, theirs = _pair(axis, center)
    x, cot = _input(), _input(seed=2)
    axes = tuple(a % x.ndim for a in ([axis] if isinstance(axis, int) else axis))
    y, grads = _gradients(ours, x, cot)
    beta = to_numpy(ours.beta) if center else None
    y_ref, grads_ref = _oracle(x, to_numpy(ours.gamma), beta, cot, axes)
    _, grads_keras = _gradients(theirs, x, cot)
    np.testing.assert_allclose(y, y_ref, atol=2e-5)
    assert len(grads) == len(grads_ref) == len(grads_keras) == (3 if center else 2)
    for g, ref, k in zip(grads, grads_ref, grads_keras):
        scale = np.abs(ref).max()
        np.testing.assert_allclose(g, ref, atol=1e-5 * scale)
        np.testing.assert_allclose(g, k, atol=1e-5 * scale)


def test_saved_file_round_trip(tmp_path):
    ours, _ = _pair()
    x = _input()
    inputs = keras.Input(SHAPE[1:])
    model = keras.Model(inputs, ours(inputs))
    model.save(tmp_path / "norm.keras")
    loaded = keras.saving.load_model(tmp_path / "norm.keras", safe_mode=True)
    assert type(loaded.layers[-1]) is layers.LayerNormalization
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(ours(x)), atol=1e-6)


def test_every_norm_of_the_model_is_this_layer():
    from tests.conftest import tiny_vit

    model = tiny_vit(qk_norm=True, fc_norm=True)
    norms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.LayerNormalization)]
    assert len(norms) == 2 * 2 + 2 * 2 + 1  # per block norm1, norm2, q_norm, k_norm; then fc_norm
    assert all(type(layer) is layers.LayerNormalization for layer in norms)

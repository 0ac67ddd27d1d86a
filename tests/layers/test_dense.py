"""layers.Dense and layers.dense.matmul: Keras' Dense in config, variables and outputs; under a
bfloat16 policy on JAX on a CPU, a bf16 product with a float32 result, rounded to bf16."""

import keras
import numpy as np
import pytest
from tests.conftest import to_numpy

from keras_vit import layers
from keras_vit.layers.dense import dense_then, matmul

SHAPE = (2, 5, 48)  # (B, T, N)


def _pair(dtype="float32", units=24):
    """keras_vit's Dense and Keras' with the same random kernel and bias."""
    ours = layers.dense.Dense(units, dtype=dtype)
    theirs = keras.layers.Dense(units, dtype=dtype)
    rng = np.random.default_rng(1)
    for layer in (ours, theirs):
        layer.build(SHAPE)
    weights = [rng.normal(0.0, 0.3, v.shape).astype("float32") for v in theirs.weights]
    ours.set_weights(weights)
    theirs.set_weights(weights)
    return ours, theirs


def _input(seed=0):
    return np.random.default_rng(seed).standard_normal(SHAPE).astype("float32")


def test_outputs_variables_and_config_are_keras_dense():
    ours, theirs = _pair()
    x = _input()
    np.testing.assert_allclose(to_numpy(ours(x)), to_numpy(theirs(x)), atol=1e-6, rtol=0)
    assert [v.path.split("/")[-1] for v in ours.weights] == [v.path.split("/")[-1] for v in theirs.weights]
    assert {**ours.get_config(), "name": None} == {**theirs.get_config(), "name": None}


def test_mixed_bfloat16_gives_keras_values_in_bfloat16():
    ours, theirs = _pair("mixed_bfloat16")
    x = keras.ops.cast(_input(), "bfloat16")
    y = ours(x)
    assert keras.backend.standardize_dtype(y.dtype) == "bfloat16" and ours.kernel.dtype == "float32"
    # Both accumulate in float32 and round to bfloat16 (then add the bias): a step of 2^-7 apart at most.
    a, b = (to_numpy(keras.ops.cast(t, "float32")) for t in (y, theirs(x)))
    assert np.all(np.abs(a - b) <= 2.0**-6 * np.maximum(np.abs(b), 1.0))


def test_a_bf16_product_asks_for_a_float32_result_on_jax():
    """The form that XLA:CPU runs in bf16: dot_general of bf16 operands with an f32 result."""
    if keras.backend.backend() != "jax":  # elsewhere it is keras.ops.matmul, bit for bit
        x, w = (keras.ops.cast(np.random.default_rng(s).normal(size=shape), "bfloat16")
                for s, shape in ((0, (4, 8)), (1, (8, 3))))
        np.testing.assert_array_equal(to_numpy(keras.ops.cast(matmul(x, w), "float32")),
                                      to_numpy(keras.ops.cast(keras.ops.matmul(x, w), "float32")))
        return
    import jax
    from jax import numpy as jnp

    x, w = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 3), jnp.bfloat16)
    text = jax.jit(matmul).lower(x, w).as_text()
    assert "tensor<4x8xbf16>, tensor<8x3xbf16>) -> tensor<4x3xf32>" in text, text
    assert matmul(x, w).dtype == jnp.bfloat16
    f32 = jax.jit(matmul).lower(x.astype("float32"), w.astype("float32")).as_text()
    assert "-> tensor<4x3xf32>" in f32 and "bf16" not in f32


def test_gradients_match_keras_dense_under_mixed_bfloat16():
    from keras_vit.explain import autodiff

    ours, theirs = _pair("mixed_bfloat16")
    x = keras.ops.cast(_input(), "bfloat16")
    cot = keras.ops.ones((*SHAPE[:2], 24), "bfloat16")
    grads = [to_numpy(keras.ops.cast(autodiff.vjp(lambda t, layer=layer: (layer(t), None), (x,), cot)[2][0],
                                     "float32")) for layer in (ours, theirs)]
    np.testing.assert_allclose(grads[0], grads[1], atol=2.0**-6 * np.abs(grads[1]).max())


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_lora_and_int8_quantization_give_keras_outputs(dtype):
    ours, theirs = _pair(dtype)
    x = _input()
    plain = to_numpy(keras.ops.cast(theirs(x), "float32"))
    for layer in (ours, theirs):
        layer.enable_lora(2)
        layer.lora_kernel_a.assign(np.full(layer.lora_kernel_a.shape, 0.2, "float32"))
        layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.1, "float32"))
    a, b = (to_numpy(keras.ops.cast(layer(x), "float32")) for layer in (ours, theirs))
    assert np.abs(b - plain).max() > 0.1  # the adapter counts
    np.testing.assert_allclose(a, b, atol=1e-5 if dtype == "float32" else 2.0**-6 * np.abs(b).max())
    ours, theirs = _pair()
    for layer in (ours, theirs):
        layer.quantize("int8")
    np.testing.assert_allclose(to_numpy(ours(x)), to_numpy(theirs(x)), atol=1e-5)


def test_every_mlp_dense_of_the_model_is_this_layer_and_a_saved_model_loads(tmp_path):
    from tests.conftest import random_vit

    model = random_vit()
    denses = [layer for layer in model._flatten_layers() if type(layer) is layers.dense.Dense]
    assert len(denses) == 2 * model.num_layers  # fc1, fc2 per block
    x = np.random.default_rng(0).uniform(-1, 1, (2, *model.image_size, 3)).astype("float32")
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)), atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_with_a_bias_gives_the_gradients_of_matmul_plus_bias(dtype):
    from keras_vit.explain import autodiff

    rng = np.random.default_rng(3)
    x, w, b = (keras.ops.cast(rng.normal(size=shape).astype("float32"), dtype) for shape in ((3, 5, 8), (8, 4), (4,)))
    cot = keras.ops.cast(rng.normal(size=(3, 5, 4)).astype("float32"), dtype)
    ours = autodiff.vjp(lambda *a: (matmul(*a), None), (x, w, b), cot)
    theirs = autodiff.vjp(lambda x, w, b: (keras.ops.matmul(x, w) + b, None), (x, w, b), cot)
    for name, a, c in zip(("y", "dx", "dw", "db"), [ours[0], *ours[2]], [theirs[0], *theirs[2]]):
        assert keras.backend.standardize_dtype(a.dtype) == dtype, name
        a, c = (to_numpy(keras.ops.cast(t, "float32")) for t in (a, c))
        tol = 1e-5 if dtype == "float32" else 2.0**-6 * np.abs(c).max()
        np.testing.assert_allclose(a, c, atol=tol, rtol=0, err_msg=name)


def test_a_product_with_a_bias_is_one_addmm_on_torch(monkeypatch):
    """On torch the bias is written into the product's output (timm's `F.linear` does the same);
    elsewhere the product is `keras.ops.matmul` plus `keras.ops.add`, which the tests above compare."""
    if keras.backend.backend() != "torch":
        return
    import torch

    calls = []
    addmm = torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *a, **k: calls.append(a[1].shape) or addmm(*a, **k))
    ours, theirs = _pair()
    x = _input()
    np.testing.assert_allclose(to_numpy(ours(x)), to_numpy(theirs(x)), atol=1e-6, rtol=0)
    assert calls == [torch.Size([SHAPE[0] * SHAPE[1], SHAPE[2]])]


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_dense_then_an_activation_gives_the_activation_of_the_layer(dtype):
    from keras_vit.layers.transformer import gelu

    ours, _ = _pair(dtype)
    x = _input()
    np.testing.assert_array_equal(to_numpy(keras.ops.cast(dense_then(ours, x, gelu), "float32")),
                                  to_numpy(keras.ops.cast(gelu(ours(x)), "float32")))
    ours.enable_lora(2)  # the LoRA kernel is the kernel that the product reads
    ours.lora_kernel_b.assign(np.full(ours.lora_kernel_b.shape, 0.1, "float32"))
    expected = to_numpy(keras.ops.cast(gelu(ours(x)), "float32"))
    # Keras adds the LoRA product to the kernel after its cast to the compute dtype, the variable read
    # here before: one bfloat16 rounding apart.
    tol = 1e-6 if dtype == "float32" else 2.0**-7 * np.abs(expected).max()
    np.testing.assert_allclose(to_numpy(keras.ops.cast(dense_then(ours, x, gelu), "float32")), expected,
                               atol=tol, rtol=0)


def test_dense_then_an_activation_calls_a_quantized_layer():
    ours, _ = _pair()
    ours.quantize("int8")
    x = _input()
    np.testing.assert_array_equal(to_numpy(dense_then(ours, x, keras.ops.relu)), to_numpy(keras.ops.relu(ours(x))))


def test_on_tensorflow_on_a_cpu_the_activation_follows_a_2d_matmul_and_bias_add():
    """The chain that TensorFlow's graph optimizer runs as one oneDNN kernel: MatMul -> BiasAdd -> GELU."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the 2-D chain is TensorFlow's path on a CPU; other backends call the layer")
    import tensorflow as tf

    from keras_vit.layers.dense import tensorflow_executor_on_cpu
    from keras_vit.layers.transformer import gelu

    if not tensorflow_executor_on_cpu():
        pytest.skip("the 2-D chain is TensorFlow's path on a CPU; this process sees an accelerator")
    ours, _ = _pair()
    graph = tf.function(lambda x: dense_then(ours, x, gelu)).get_concrete_function(
        tf.TensorSpec(SHAPE, tf.float32)).graph
    ops_ = {op.type: op for op in graph.get_operations()}
    matmul_op, bias_add = ops_["MatMul"], ops_["BiasAdd"]
    assert bias_add.inputs[0].op is matmul_op and "BatchMatMulV2" not in ops_, list(ops_)
    readers = [op.type for op in graph.get_operations() if bias_add.outputs[0].name in [t.name for t in op.inputs]]
    assert sorted(readers) == ["Mul", "Mul"], readers  # 0.5 x and the argument of erf
    assert "Erf" in ops_

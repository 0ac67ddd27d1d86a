"""layers.attention_core.attend: the values and gradients of `ops.dot_product_attention` of the
split Q, K and V; on JAX on a CPU, 3-D batched products over (batch x heads) with a float32 result,
forward and backward, and the packed tensor's gradient in one piece; on TensorFlow on a CPU, one
transpose of the packed tensor and two batched products, without einsum."""

import keras
import numpy as np
import pytest
from tests.conftest import to_numpy

from keras_vit.explain import autodiff
from keras_vit.layers.attention_core import attend, split

B, T, K, DH = 2, 7, 3, 8


def _qkv(dtype="float32"):
    rng = np.random.default_rng(0)
    return [keras.ops.cast(rng.standard_normal((B, T, K, DH)).astype("float32"), dtype) for _ in range(3)]


def _mask(query_rows):
    """(B, 1, T or 1, S) boolean: random keys masked out, the first key kept and the last masked."""
    keep = np.random.default_rng(1).random((B, 1, query_rows, T)) > 0.4
    keep[..., 0], keep[..., -1] = True, False
    return keras.ops.convert_to_tensor(keep)


def _ours(q, k, v, scale, mask):
    return attend(keras.ops.stack([q, k, v], axis=2), scale, mask)  # (B, T, 3, K, Dh)


def _reference(q, k, v, scale, mask):
    return keras.ops.dot_product_attention(q, k, v, scale=scale, mask=mask)


def test_split_takes_q_k_and_v_apart():
    q, k, v = _qkv()
    for a, b in zip(split(keras.ops.stack([q, k, v], axis=2)), (q, k, v)):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


@pytest.mark.parametrize("scale", [1.0, DH**-0.5])
@pytest.mark.parametrize("mask_rows", [None, 1, T])
def test_values_and_gradients_are_dot_product_attention(scale, mask_rows):
    q, k, v = _qkv()
    mask = None if mask_rows is None else _mask(mask_rows)
    cot = keras.ops.convert_to_tensor(np.random.default_rng(2).standard_normal((B, T, K, DH)).astype("float32"))
    ours = autodiff.vjp(lambda *a: (_ours(*a, scale, mask), None), (q, k, v), cot)
    theirs = autodiff.vjp(lambda *a: (_reference(*a, scale, mask), None), (q, k, v), cot)
    np.testing.assert_allclose(to_numpy(ours[0]), to_numpy(theirs[0]), atol=1e-5, rtol=0)
    for name, a, b in zip("qkv", ours[2], theirs[2]):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=2e-5, rtol=0, err_msg=f"d{name}")
    if mask is not None:  # a masked key gets no weight, so no gradient of its value
        dv = to_numpy(ours[2][2])
        unused = ~to_numpy(mask).any(axis=(1, 2))  # (B, S): keys that no query attends to
        assert unused.any() and np.all(dv[unused] == 0)


def test_bfloat16_is_dot_product_attention_to_bfloat16_rounding():
    q, k, v = _qkv("bfloat16")
    cot = keras.ops.ones((B, T, K, DH), "bfloat16")
    ours = autodiff.vjp(lambda *a: (_ours(*a, 0.5, None), None), (q, k, v), cot)
    theirs = autodiff.vjp(lambda *a: (_reference(*a, 0.5, None), None), (q, k, v), cot)
    assert keras.backend.standardize_dtype(ours[0].dtype) == "bfloat16"
    for a, b in zip([ours[0], *ours[2]], [theirs[0], *theirs[2]]):
        a, b = (to_numpy(keras.ops.cast(t, "float32")) for t in (a, b))
        np.testing.assert_allclose(a, b, atol=2.0**-6 * np.abs(b).max())


def test_jax_on_a_cpu_runs_3d_products_with_a_float32_result_forward_and_backward():
    if keras.backend.backend() != "jax":
        pytest.skip("the 3-D products are JAX's path on a CPU; other backends run ops.dot_product_attention")
    import jax
    from jax import numpy as jnp

    if jax.default_backend() != "cpu":
        pytest.skip(f"the 3-D products are JAX's path on a CPU, not on {jax.default_backend()}")
    qkv = jnp.ones((B, T, 3, K, DH), jnp.bfloat16)

    def loss(qkv):
        return jnp.sum(attend(qkv, 1.0, None).astype(jnp.float32))

    text = jax.jit(jax.value_and_grad(loss)).lower(qkv).as_text()
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert len(dots) == 6, text  # two forward products, four backward ones
    bk = B * K
    for line in dots:
        assert line.count(f"tensor<{bk}x") == 3 and "xbf16>, tensor<" in line and "xf32>" in line, line
    assert "stablehlo.pad" not in text  # the gradients of Q, K and V are stacked, not padded and added


def test_tensorflow_on_a_cpu_transposes_the_packed_tensor_once_and_runs_two_batched_products():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the batched products are TensorFlow's path on a CPU; other backends run their own")
    import tensorflow as tf

    from keras_vit.layers.dense import tensorflow_executor_on_cpu

    if not tensorflow_executor_on_cpu():
        pytest.skip("the batched products are TensorFlow's path on a CPU; this process sees an accelerator")
    graph = tf.function(lambda qkv: attend(qkv, 0.5, None)).get_concrete_function(
        tf.TensorSpec((B, T, 3, K, DH), tf.bfloat16)).graph
    kinds = [op.type for op in graph.get_operations()]
    assert kinds.count("BatchMatMulV2") == 2 and kinds.count("Transpose") == 2, kinds  # the packed input, the output
    assert "Einsum" not in kinds and "Softmax" in kinds, kinds


def test_tensorflow_under_xla_keeps_dot_product_attention():
    """XLA ran the batched products no faster (`benchmarks.studies.tf_forward`): under `jit_compile`
    the graph is Keras' `ops.dot_product_attention`."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("XLA's path on TensorFlow")
    import tensorflow as tf

    kinds = {}
    for xla in (False, True):
        graph = tf.function(lambda qkv: attend(qkv, 0.5, None), jit_compile=xla).get_concrete_function(
            tf.TensorSpec((B, T, 3, K, DH), tf.float32)).graph
        kinds[xla] = {op.type for op in graph.get_operations()}
    assert "Einsum" in kinds[True] and "BatchMatMulV2" not in kinds[True], kinds[True]
    from keras_vit.layers.dense import tensorflow_executor_on_cpu

    if tensorflow_executor_on_cpu():  # outside any graph: the executor's path
        assert "Einsum" not in kinds[False], kinds[False]

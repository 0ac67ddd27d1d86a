"""The attention core, softmax(Q K^T) V, of Q, K and V packed in one tensor.

On JAX on a CPU, `ops.dot_product_attention` (`jax.nn.dot_product_attention`) forms its products
as 4-D einsums over (B, T, K, Dh), which XLA:CPU runs in Eigen, and in bf16 with a bf16 result,
which it runs in float32. `attend` there flattens batch and heads into one axis and asks for
3-D batched products with a float32 result, which XLA:CPU gives its fast library and runs in the
operands' dtype; a custom gradient asks the same of the four backward products (autodiff would give
them a float32 cotangent) and returns the gradient of the packed tensor in one piece (autodiff of
the split into Q, K and V pads and adds three). `python -m benchmarks.run` times it against
`ops.dot_product_attention` (the `[keras-attention]` candidates).

On TensorFlow's own executor on a CPU (not XLA: `layers.dense.tensorflow_executor_on_cpu`),
`ops.dot_product_attention` takes Q, K and V in (B, T, K, Dh), and its einsums copy each of them to
(B, K, T, Dh) and copy the result back: the executor makes every transpose a copy. `attend` there
transposes the packed tensor once, to (3, B, K, T, Dh), and runs two batched `tf.matmul`s
(`benchmarks.studies.tf_forward`, docs/performance.md). XLA, every other backend and every other
device keep `ops.dot_product_attention`, whose layout torch's fused kernel expects.

Shapes: B batch, K heads, T query tokens, S key tokens (S = T), Dh head width.
"""

import functools

import keras
from keras import ops

from keras_vit.layers.dense import tensorflow_executor_on_cpu


def split(qkv):
    """(B, T, 3, K, Dh) -> Q, K, V, each (B, T, K, Dh)."""
    # Q, K, V are taken from the leading axis, where a runtime splits in place (OpenVINO copied a split
    # along the last axis and gathered for an index); the two swaps of K and T cancel out, as
    # dot_product_attention swaps them back.
    qkv = ops.transpose(qkv, (2, 0, 3, 1, 4))  # -> (3, B, K, T, Dh)
    return tuple(ops.swapaxes(y, 1, 2) for y in ops.unstack(qkv, 3, axis=0))


def attend(qkv, scale, mask=None):
    """(B, T, 3, K, Dh) -> (B, T, K, Dh): softmax(scale Q K^T) V, the softmax in float32, as
    `ops.dot_product_attention` computes it. `mask` (B, 1, T or 1, S) is boolean, True where a query
    may attend to a key, or None."""
    if keras.backend.backend() == "jax":
        import jax

        if jax.default_backend() == "cpu":
            return _jax_attend(qkv, scale, mask)
    if tensorflow_executor_on_cpu():
        return _tf_attend(qkv, float(scale), mask)
    return ops.dot_product_attention(*split(qkv), scale=scale, mask=mask)


def _tf_attend(qkv, scale, mask):
    import tensorflow as tf

    q, k, v = tf.unstack(tf.transpose(qkv, (2, 0, 3, 1, 4)))  # (B, T, 3, K, Dh) -> 3 x (B, K, T, Dh)
    # The logits in the operands' dtype, then float32, as ops.dot_product_attention computes them.
    logits = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32)  # (B, K, T, Dh) x (B, K, S, Dh) -> (B, K, T, S)
    if scale != 1.0:
        logits = logits * scale
    if mask is not None:  # (B, 1, T or 1, S), broadcast over heads (and queries)
        logits = tf.where(mask, logits, tf.float32.min)
    p = tf.cast(tf.nn.softmax(logits, axis=-1), v.dtype)
    return tf.transpose(tf.matmul(p, v), (0, 2, 1, 3))  # (B, K, T, Dh) -> (B, T, K, Dh)


def _jax_attend(qkv, scale, mask):
    from jax import numpy as jnp

    b, t, _, heads, dh = qkv.shape
    qkv = jnp.reshape(jnp.transpose(qkv, (2, 0, 3, 1, 4)), (3, -1, t, dh))  # -> (3, B, K, T, Dh) -> (3, B K, T, Dh)
    if mask is not None:  # (B, 1, T or 1, S) -> (B K, T or 1, S)
        mask = jnp.reshape(jnp.broadcast_to(mask, (b, heads) + mask.shape[2:]), (-1,) + mask.shape[2:])
    out = _jax_core(float(scale))(qkv, mask)  # (B K, T, Dh)
    return jnp.swapaxes(jnp.reshape(out, (-1, heads, t, dh)), 1, 2)


@functools.cache
def _jax_core(scale):
    """(qkv (3, N, T, Dh), mask (N, T or 1, T) or None) -> (N, T, Dh), with the backward products
    written out; built on first use, so that importing keras_vit loads no JAX."""
    import jax
    from jax import numpy as jnp

    def product(a, b, contract):  # batched over axis 0 of both, float32 result
        return jax.lax.dot_general(a, b, (contract, ((0,), (0,))), preferred_element_type=jnp.float32)

    def probabilities(q, k, mask):
        logits = product(q, k, ((2,), (2,))) * scale  # (N, T, Dh) x (N, S, Dh) -> (N, T, S)
        if mask is not None:
            logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)  # as jax.nn.dot_product_attention
        return jax.nn.softmax(logits, axis=-1)

    def forward(qkv, mask):
        q, k, v = qkv[0], qkv[1], qkv[2]
        p = probabilities(q, k, mask)  # float32, kept for the softmax's backward
        return product(p.astype(v.dtype), v, ((2,), (1,))).astype(qkv.dtype), (qkv, p)

    @jax.custom_vjp
    def core(qkv, mask):
        return forward(qkv, mask)[0]

    def backward(residuals, grad):
        qkv, p = residuals
        q, k, v = qkv[0], qkv[1], qkv[2]
        dtype = qkv.dtype
        grad = grad.astype(dtype)  # (N, T, Dh)
        dv = product(p.astype(dtype), grad, ((1,), (1,)))  # (N, T, S) x (N, T, Dh) -> (N, S, Dh)
        dp = product(grad, v, ((2,), (2,)))  # (N, T, Dh) x (N, S, Dh) -> (N, T, S)
        dlogits = (p * (dp - jnp.sum(dp * p, axis=-1, keepdims=True)) * scale).astype(dtype)  # softmax's backward
        dq = product(dlogits, k, ((2,), (1,)))  # (N, T, S) x (N, S, Dh) -> (N, T, Dh)
        dk = product(dlogits, q, ((1,), (1,)))  # (N, T, S) x (N, T, Dh) -> (N, S, Dh)
        return jnp.stack([dq, dk, dv]).astype(dtype), None

    core.defvjp(forward, backward)
    return core

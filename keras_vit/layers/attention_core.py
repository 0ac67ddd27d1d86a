"""The attention core, softmax(Q K^T) V.

On JAX on a CPU, `ops.dot_product_attention` (`jax.nn.dot_product_attention`) forms its products
as 4-D einsums over (B, T, K, Dh), which XLA:CPU runs in Eigen, and in bf16 with a bf16 result,
which it runs in float32. `attend` there flattens batch and heads into one axis and asks for
3-D batched products with a float32 result, which XLA:CPU gives its fast library and runs in the
operands' dtype; a custom gradient asks the same of the four backward products (autodiff would give
them a float32 cotangent). `python -m benchmarks.studies.attention_core` times the two against
each other. Every other backend and device keeps `ops.dot_product_attention`, whose layout the
exported graphs and torch's fused kernel expect.

Shapes: B batch, K heads, T query tokens, S key tokens, Dh head width.
"""

import functools

import keras
from keras import ops


def attend(q, k, v, scale, mask=None):
    """(B, T, K, Dh), (B, S, K, Dh), (B, S, K, Dh) -> (B, T, K, Dh): softmax(scale q k^T) v, the
    softmax in float32, as `ops.dot_product_attention` computes it. `mask` (B, 1, T or 1, S) is
    boolean, True where a query may attend to a key, or None."""
    if keras.backend.backend() == "jax":
        import jax

        if jax.default_backend() == "cpu":
            return _jax_attend(q, k, v, scale, mask)
    return ops.dot_product_attention(q, k, v, scale=scale, mask=mask)


def _jax_attend(q, k, v, scale, mask):
    from jax import numpy as jnp

    b, t, heads, dh = q.shape

    def heads_major(x):  # (B, T, K, Dh) -> (B K, T, Dh); XLA merges the layer's own swap into this one
        return jnp.reshape(jnp.swapaxes(x, 1, 2), (-1, x.shape[1], dh))

    if mask is not None:  # (B, 1, T or 1, S) -> (B K, T or 1, S)
        mask = jnp.reshape(jnp.broadcast_to(mask, (b, heads) + mask.shape[2:]), (-1,) + mask.shape[2:])
    out = _jax_core(float(scale))(heads_major(q), heads_major(k), heads_major(v), mask)  # (B K, T, Dh)
    return jnp.swapaxes(jnp.reshape(out, (-1, heads, t, dh)), 1, 2)


@functools.cache
def _jax_core(scale):
    """(q (N, T, Dh), k (N, S, Dh), v (N, S, Dh), mask (N, T or 1, S) or None) -> (N, T, Dh), with the
    backward products written out; built on first use, so that importing keras_vit loads no JAX."""
    import jax
    from jax import numpy as jnp

    def product(a, b, contract):  # batched over axis 0 of both, float32 result
        return jax.lax.dot_general(a, b, (contract, ((0,), (0,))), preferred_element_type=jnp.float32)

    def probabilities(q, k, mask):
        logits = product(q, k, ((2,), (2,))) * scale  # (N, T, Dh) x (N, S, Dh) -> (N, T, S)
        if mask is not None:
            logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)  # as jax.nn.dot_product_attention
        return jax.nn.softmax(logits, axis=-1)

    @jax.custom_vjp
    def core(q, k, v, mask):
        p = probabilities(q, k, mask)
        return product(p.astype(v.dtype), v, ((2,), (1,))).astype(q.dtype)  # (N, T, S) x (N, S, Dh)

    def forward(q, k, v, mask):
        p = probabilities(q, k, mask)  # float32, kept for the softmax's backward
        return product(p.astype(v.dtype), v, ((2,), (1,))).astype(q.dtype), (q, k, v, p)

    def backward(residuals, grad):
        q, k, v, p = residuals
        dtype = q.dtype
        grad = grad.astype(dtype)  # (N, T, Dh)
        dv = product(p.astype(dtype), grad, ((1,), (1,)))  # (N, T, S) x (N, T, Dh) -> (N, S, Dh)
        dp = product(grad, v, ((2,), (2,)))  # (N, T, Dh) x (N, S, Dh) -> (N, T, S)
        dlogits = (p * (dp - jnp.sum(dp * p, axis=-1, keepdims=True)) * scale).astype(dtype)  # softmax's backward
        dq = product(dlogits, k, ((2,), (1,)))  # (N, T, S) x (N, S, Dh) -> (N, T, Dh)
        dk = product(dlogits, q, ((1,), (1,)))  # (N, T, S) x (N, T, Dh) -> (N, S, Dh)
        return dq.astype(dtype), dk.astype(dtype), dv.astype(dtype), None

    core.defvjp(forward, backward)
    return core

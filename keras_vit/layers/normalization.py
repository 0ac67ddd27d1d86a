"""Layer normalization (Ba et al., 2016) whose JAX backward pass is written out in closed form.

Shapes: x (..., D), normalized over the `axis` dimensions (D, the last one, in every ViT norm).
"""

import functools

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` with the same arguments, config, variables (`gamma`, `beta`)
    and outputs (within 1e-6), whose gradient on JAX is the closed form

        x^ = (x - mean(x)) / sqrt(var(x) + eps)
        dx = (g - mean(g) - x^ mean(g x^)) / sqrt(var(x) + eps),   g = dL/dx^ = dL/dy * gamma

    (a `jax.custom_vjp`). Keras' JAX LayerNorm lets autodiff differentiate through `var` and
    `rsqrt`, and XLA:CPU runs that backward pass slowly: the JAX train step of ViT-S/16 on a CPU
    spends more time there than in the matrix products (see docs/performance.md). TensorFlow and
    torch keep Keras' path (torch's own `layer_norm` kernel). Statistics are computed in float32,
    as Keras does, whatever the compute dtype.

    Input: (..., D). Output: the same shape, in the layer's compute dtype.
    """

    def call(self, inputs):
        if keras.backend.backend() != "jax" or self.rms_scaling:
            return super().call(inputs)
        x = ops.cast(inputs, "float32")
        axes = tuple(a % len(x.shape) for a in self.axis)
        y = _jax_standardize()(x, axes, float(self.epsilon))
        y = y if self.gamma is None else y * _along(self.gamma, axes, x.shape)
        y = y if self.beta is None else y + _along(self.beta, axes, x.shape)
        return ops.cast(y, self.compute_dtype)


def _along(weight, axes, shape):
    """A weight of the normalized axes' sizes, shaped to broadcast against an input of `shape`."""
    if axes == (len(shape) - 1,):
        return weight
    return ops.reshape(weight, [shape[a] if a in axes else 1 for a in range(len(shape))])


@functools.cache
def _jax_standardize():
    """standardize(x, axes, epsilon) -> (x - mean) / sqrt(var + epsilon) over `axes`, with its
    closed-form gradient; built on first use, so that importing keras_vit loads no JAX."""
    import jax
    from jax import numpy as jnp

    def forward(x, axes, epsilon):
        centered = x - jnp.mean(x, axes, keepdims=True)
        inv_std = jax.lax.rsqrt(jnp.mean(jnp.square(centered), axes, keepdims=True) + epsilon)
        normed = centered * inv_std
        return normed, (normed, inv_std)

    def backward(axes, epsilon, residuals, grad):
        normed, inv_std = residuals
        mean_grad = jnp.mean(grad, axes, keepdims=True)
        mean_proj = jnp.mean(grad * normed, axes, keepdims=True)  # the part of grad along x^
        return (inv_std * (grad - mean_grad - normed * mean_proj),)

    standardize = jax.custom_vjp(lambda x, axes, epsilon: forward(x, axes, epsilon)[0], nondiff_argnums=(1, 2))
    standardize.defvjp(forward, backward)
    return standardize

"""Matrix products of bfloat16 operands that XLA:CPU runs in bfloat16, and a bias added in the
product on torch.

Keras' `mixed_bfloat16` asks for bf16 products with a bf16 result. XLA:CPU converts the operands of
such a product to float32, runs the float32 kernel and converts the result back: 0.89x the float32
product. The same product asked for with a float32 result runs in bf16, at 1.84x, and rounding that
result to bf16 gives what the bf16 product gives, which accumulates in float32 too
(`python -m benchmarks.studies.xla_cpu_bf16`, docs/performance.md). `matmul` asks for it so on JAX
on a CPU. On torch, a product with a bias is one `torch.addmm`, as timm's `F.linear`. Every other
case keeps `keras.ops.matmul` (and `keras.ops.add`).

Shapes: x (..., N), w (N, M).
"""

import functools

import keras
from keras import ops


def matmul(x, w, bias=None):
    """x @ w (+ bias), (..., N) x (N, M) (+ (M,)) -> (..., M): `keras.ops.matmul`, except with bfloat16
    operands on JAX on a CPU, where the product is asked for in float32 and rounded to bfloat16, and
    with a bias of the operands' dtype on torch (`torch.addmm`)."""
    if keras.backend.backend() == "jax":
        import jax
        from jax import numpy as jnp

        x, w = ops.convert_to_tensor(x), ops.convert_to_tensor(w)  # a variable reads as its autocast value
        bias = None if bias is None else ops.convert_to_tensor(bias)
        if (x.dtype == jnp.bfloat16 and w.dtype == jnp.bfloat16 and jax.default_backend() == "cpu"
                and w.ndim == 2 and (bias is None or bias.dtype == jnp.bfloat16)):
            if bias is None:
                return _jax_bf16_matmul()(x, w)
            return _jax_bf16_matmul_bias()(x, w, bias)
    elif keras.backend.backend() == "torch" and bias is not None:
        x, w, bias = ops.convert_to_tensor(x), ops.convert_to_tensor(w), ops.convert_to_tensor(bias)
        if w.ndim == 2 and x.dtype == w.dtype == bias.dtype:
            return _torch_matmul_bias(x, w, bias)
    y = ops.matmul(x, w)
    return y if bias is None else ops.add(y, bias)


@functools.cache
def _jax_bf16_matmul():
    """(x, w) -> x @ w for bf16 x (..., N) and w (N, M), each product of the forward and backward
    pass asked for in float32 and rounded to bf16 (autodiff would give the backward products a
    float32 cotangent, and XLA:CPU would run them in float32); built on first use, so that
    importing keras_vit loads no JAX."""
    import jax
    from jax import numpy as jnp

    def product(a, b, dims):
        return jax.lax.dot_general(a, b, (dims, ((), ())), preferred_element_type=jnp.float32).astype(jnp.bfloat16)

    @jax.custom_vjp
    def bf16_matmul(x, w):
        return product(x, w, ((x.ndim - 1,), (0,)))

    def forward(x, w):
        return bf16_matmul(x, w), (x, w)

    def backward(residuals, grad):
        x, w = residuals
        grad = grad.astype(jnp.bfloat16)
        dx = product(grad, w, ((grad.ndim - 1,), (1,)))  # (..., M) x (N, M) -> (..., N)
        batch = tuple(range(x.ndim - 1))
        dw = product(x, grad, (batch, batch))  # (..., N) x (..., M) -> (N, M), summed over the batch axes
        return dx, dw

    bf16_matmul.defvjp(forward, backward)
    return bf16_matmul


@functools.cache
def _jax_bf16_matmul_bias():
    """(x, w, b) -> x @ w + b for bf16 x (..., N), w (N, M) and b (M,): `_jax_bf16_matmul` plus the
    bias, whose gradient is summed over the batch axes in float32. (Autodiff sums the bf16
    cotangent, which XLA:CPU ran as a float32 copy and a strided reduce-window: 17% of ViT-S/16's
    bf16 train step; `benchmarks.studies.jax_profile`.)"""
    import jax
    from jax import numpy as jnp

    matmul = _jax_bf16_matmul()

    @jax.custom_vjp
    def bf16_matmul_bias(x, w, b):
        return matmul(x, w) + b

    def forward(x, w, b):
        y, vjp = jax.vjp(matmul, x, w)
        return y + b, vjp

    def backward(vjp, grad):
        grad = grad.astype(jnp.bfloat16)
        dx, dw = vjp(grad)
        db = jnp.sum(jnp.reshape(grad, (-1, grad.shape[-1])), axis=0, dtype=jnp.float32)
        return dx, dw, db.astype(jnp.bfloat16)

    bf16_matmul_bias.defvjp(forward, backward)
    return bf16_matmul_bias


@functools.cache
def _tensorflow_cpu_only():
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return all(device.device_type == "CPU" for device in tf.config.list_logical_devices())


def tensorflow_executor_on_cpu():
    """Whether the op being built runs on TensorFlow's own executor on a CPU: Keras runs on TensorFlow,
    TensorFlow sees no GPU (nor other accelerator), and the op is not built for XLA (a function with
    `jit_compile=True`). Keras' `jit_compile="auto"` leaves XLA off on such a machine."""
    if not _tensorflow_cpu_only():
        return False
    import tensorflow as tf

    # Whether a graph is built for XLA has no public API; TensorFlow's own ops (cond_v2, while_v2,
    # array_grad) ask this function. Without it the ops are built as for XLA, which computes the same
    # values (and tests/layers/test_dense.py fails).
    try:
        from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext
    except ImportError:
        return False
    return not GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def dense_then(layer, x, activation):
    """`activation(layer(x))` for a `Dense` `layer` with a bias. On TensorFlow's own executor on a CPU
    (`tensorflow_executor_on_cpu`), the product is formed as a 2-D `MatMul` followed by `BiasAdd` and
    `activation`, in that order: TensorFlow's graph optimizer (grappler's remapper) runs that chain as
    one oneDNN kernel where `activation` is the exact GELU as `layers.transformer.gelu` writes it
    (`benchmarks.studies.tf_forward`, docs/performance.md). Keras' Dense forms a batched product and
    an `AddV2`, which it leaves apart. A quantized layer, XLA, and every other backend call the layer."""
    if not tensorflow_executor_on_cpu() or layer.quantization_mode is not None or not layer.use_bias:
        return activation(layer(x))
    import tensorflow as tf

    dtype = layer.compute_dtype
    x = tf.cast(x, dtype)
    y = tf.matmul(tf.reshape(x, (-1, x.shape[-1])), tf.cast(layer.kernel, dtype))  # (P, N) x (N, M) -> (P, M)
    y = tf.nn.bias_add(y, tf.cast(layer.bias, dtype))
    if layer.activation is not None:
        y = layer.activation(y)
    y = activation(y)
    return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [layer.units]], axis=0))  # (P, M) -> (..., M)


def _torch_matmul_bias(x, w, bias):
    """x @ w + bias as one `torch.addmm`, which writes the bias into the product's output (a
    product followed by an add reads and writes the (..., M) result once more: 2-3% of ViT-S/16's
    forward on a CPU; `benchmarks.studies.torch_bf16_profile`)."""
    import torch

    y = torch.addmm(bias, torch.reshape(x, (-1, x.shape[-1])), w)  # (..., N) -> (P, N) x (N, M) -> (P, M)
    return torch.reshape(y, (*x.shape[:-1], w.shape[-1]))


@keras.saving.register_keras_serializable(package="keras_vit")
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` with the same arguments, config and variables, whose product is
    `matmul`'s: under a bfloat16 policy on JAX on a CPU it runs in bf16, and on torch the bias is
    added in the product (see the module doc).
    Quantized layers (`quantize`) keep Keras' own path; LoRA's kernel (`enable_lora`) is the
    `kernel` that the product reads, as in Keras.

    Input: (..., N). Output: (..., units), in the layer's compute dtype.
    """

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses to quantize a subclass of Dense, whose `call` may compute something else;
        # this one's `call` differs only in how the product runs, and a quantized layer runs
        # Keras' own `quantized_call`, so it quantizes as `keras.layers.Dense` does.
        return super().quantize(mode, type_check=False, config=config)

    def call(self, inputs, training=None):
        if keras.backend.backend() not in ("jax", "torch"):
            return super().call(inputs, training=training)
        x = matmul(inputs, self.kernel, self.bias)
        return x if self.activation is None else self.activation(x)

"""Which form of the padding mask makes masked attention faster: a boolean `mask` or an additive `bias`.

    KERAS_BACKEND=jax python -m benchmarks.studies.attention_mask [--reps 9]

A padded patch sequence (NaFlex) masks its padding keys in every block. `ops.dot_product_attention`
takes that mask in two forms: `mask` (boolean, True where a query may attend) or `bias` (added to
the logits: 0, or a large negative number). This times, on the backend of KERAS_BACKEND, the
forward and backward pass of `ops.dot_product_attention` (gradients of Q, K and V) with each form,
and without any mask as the reference, in turn (A B C, C B A, ...; medians). The step is compiled
as `model.fit` compiles it: `jax.jit` on JAX, `tf.function(jit_compile=True)` on TensorFlow, eager
autograd on torch. The mask is a key mask (B, 1, 1, S) with the last quarter of the tokens padding,
as `keras_vit.layers.Attention` builds it.

Shapes: ViT-S/16 at 256 tokens; B batch 16, T = S tokens 257 (a class token and 256 patches),
K heads 6, Dh head width 64.
"""

import os

import keras
import numpy as np
from keras import ops

from benchmarks import timing
from benchmarks.cpu import cpu_info
from commands import cli

B, T, K, DH = 16, 257, 6, 64


def inputs():
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(B, T, K, DH)).astype("float32") for _ in range(3))
    valid = np.arange(T)[None] < T - T // 4  # (1, S): the last quarter is padding
    valid = np.broadcast_to(valid, (B, T))[:, None, None, :]  # (B, 1, 1, S)
    bias = np.where(valid, 0.0, -1e9).astype("float32")
    return [ops.convert_to_tensor(a) for a in (q, k, v)], ops.convert_to_tensor(valid), ops.convert_to_tensor(bias)


def loss(q, k, v, form, valid, bias):
    options = {"mask": dict(mask=valid), "bias": dict(bias=bias), "none": {}}[form]
    return ops.sum(ops.dot_product_attention(q, k, v, **options) ** 2)


def step(form, valid, bias):
    """A compiled function (q, k, v) -> the loss and its gradients, as `model.fit` compiles a step."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.jit(jax.value_and_grad(lambda q, k, v: loss(q, k, v, form, valid, bias), argnums=(0, 1, 2)))
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def run(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                value = loss(q, k, v, form, valid, bias)
            return value, tape.gradient(value, [q, k, v])

        return run

    def run(q, k, v):  # torch: eager autograd
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        value = loss(q, k, v, form, valid, bias)
        value.backward()
        return value, (q.grad, k.grad, v.grad)

    return run


def main(argv=None):
    parser = cli.parser("python -m benchmarks.studies.attention_mask", __doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=9, help="timed repetitions per form (the median is kept)")
    args = parser.parse_args(argv)
    (q, k, v), valid, bias = inputs()
    steps = {form: step(form, valid, bias) for form in ("none", "mask", "bias")}
    calls = {form: (lambda fn=fn: [ops.convert_to_numpy(g) for g in fn(q, k, v)[1]]) for form, fn in steps.items()}
    reference = calls["mask"]()
    for form in ("bias",):  # the two forms compute the same attention
        np.testing.assert_allclose(calls[form](), reference, rtol=1e-4, atol=1e-4)
    median = timing.alternate(calls, args.reps, warmup=2)
    cpu = cpu_info()
    print(f"{keras.backend.backend()} on {cpu['model']} ({cpu['cores']} CPUs, {' '.join(cpu['key_flags'])}); "
          f"1-minute load average {os.getloadavg()[0]:.1f}; {args.reps} alternating repetitions, medians")
    print("| form | ms per forward + backward | vs no mask |")
    print("|---|---:|---:|")
    for form, seconds in median.items():
        print(f"| {form} | {1e3 * seconds:.1f} | {seconds / median['none']:.2f}x |")


if __name__ == "__main__":
    main()

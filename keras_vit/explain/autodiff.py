"""Vector-Jacobian products through each backend's own autodiff.

`keras.ops` has no gradient function: Keras leaves differentiation to the backend (its trainers call
`jax.value_and_grad`, `tf.GradientTape` or `torch.autograd` directly). Explanations that need the
gradient of a class score (`keras_vit.class_relevance`) therefore call the backend here, in the one
place where the three APIs are told apart. Only the inputs given are differentiated: no gradient is
formed for the weights, so a backward pass costs about one forward pass, not two.
"""

import contextlib
import weakref

import keras


def vjp(fn, primals, cotangent):
    """Runs `fn(*primals) -> (out, aux)` and pulls `cotangent` back through `out`.

    Args:
        fn: a function of backend tensors returning `(out, aux)`; `aux` is returned, not
            differentiated (it may be None).
        primals: the tensors to differentiate with respect to.
        cotangent: a tensor shaped like `out`: the vector v of v^T J.

    Returns:
        (out, aux, grads): `grads` holds d<out, cotangent>/d primal for each primal, shaped like it,
        zero where `out` does not depend on it.
    """
    primals = tuple(keras.ops.convert_to_tensor(p) for p in primals)
    return _BACKENDS[keras.backend.backend()](fn, primals, keras.ops.convert_to_tensor(cotangent))


def no_grad():
    """A context in which no autodiff graph is recorded: `torch.no_grad()` on PyTorch (whose
    trainable weights would otherwise make every forward pass keep its activations), nothing on
    the other backends, which record only inside `vjp`."""
    if keras.backend.backend() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def model_function(fn, model):
    """`fn(model, *args)` as a function of `args`; on JAX compiled with `jax.jit`, once per model
    and argument shapes, the model's weights passed in as arguments (read at each call, so later
    training is seen; never baked into the program as constants).

    Eager JAX compiles each primitive of a `jax.vjp` on its first use with new shapes: a sweep
    through a small model took 30 s of compilation on a 2-core machine, where one compiled program
    takes a few seconds and runs faster after. A model whose weights are sharded over several
    devices must not run op by op at all: each operation is then its own program with its own
    collective, and on a 2-core machine XLA's CPU runtime aborted such a sequence ("Termination
    timeout for all gather", `tests/training/test_distributed_cli.py`). TensorFlow and PyTorch run `fn`
    eagerly.
    """
    if keras.backend.backend() != "jax":
        return lambda *args: fn(model, *args)
    import jax

    compiled = _COMPILED.setdefault(model, {})
    variables = model.variables
    if fn not in compiled:

        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return fn(model, *args)

        compiled[fn] = jax.jit(stateless)
    return lambda *args: compiled[fn]([v.value for v in variables], *args)


_COMPILED = weakref.WeakKeyDictionary()  # model -> {fn: its jitted stateless form}


def _jax_vjp(fn, primals, cotangent):
    import jax

    out, pullback, aux = jax.vjp(fn, *primals, has_aux=True)
    return out, aux, tuple(pullback(cotangent))


def _tensorflow_vjp(fn, primals, cotangent):
    import tensorflow as tf

    # Watching only the primals keeps the tape from recording the weights' gradients.
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(primals)
        out, aux = fn(*primals)
    grads = tape.gradient(out, primals, output_gradients=cotangent, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return out, aux, tuple(grads)


def _torch_vjp(fn, primals, cotangent):
    import torch

    primals = tuple(p.detach().requires_grad_(True) for p in primals)
    with torch.enable_grad():
        out, aux = fn(*primals)
        grads = torch.autograd.grad(out, primals, grad_outputs=cotangent, allow_unused=True)
    grads = tuple(torch.zeros_like(p) if g is None else g for p, g in zip(primals, grads))
    detach = lambda t: None if t is None else t.detach()  # noqa: E731
    return out.detach(), detach(aux), grads


_BACKENDS = {"jax": _jax_vjp, "tensorflow": _tensorflow_vjp, "torch": _torch_vjp}

"""Vector-Jacobian products through each backend's own autodiff.

`keras.ops` has no gradient function: Keras leaves differentiation to the backend (its trainers call
`jax.value_and_grad`, `tf.GradientTape` or `torch.autograd` directly). Explanations that need the
gradient of a class score (`keras_vit.class_relevance`) therefore call the backend here, in the one
place where the three APIs are told apart. Only the inputs given are differentiated: no gradient is
formed for the weights, so a backward pass costs about one forward pass, not two.
"""

import contextlib

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

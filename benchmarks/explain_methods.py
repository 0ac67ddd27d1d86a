"""The explanation methods that `python -m benchmarks.explain` compares, and its perturbation test.

Shapes: B batch, H x W x C images, P patch side in pixels, (h, w) token grid, N = h * w patches,
T tokens, D width.

Every method maps (model, images (B, H, W, C) normalized, classes (B,)) to a map (B, h, w) where
higher means more relevant to the class. The candidates for `keras_vit.class_relevance` all come
from one backward sweep (`keras_vit.relevance.gradient_sweep`) and differ only in how they fold its
per-layer attention A and gradient dy/dA:

- "class_relevance": Chefer et al. (ICCV 2021), r <- r + r E_k[(dy/dA * A)^+] over all layers;
- "gradient-weighted rollout": rollout of the same E_k[(dy/dA * A)^+], rows renormalized with the
  identity as rollout does;
- "gradient-weighted last layer": the last layer's E_k[(dy/dA * A)^+] alone;
- "gradient x input": sum over D of dy/dx * x at the encoder's input tokens (no attention).
"""

import numpy as np
from keras import ops

import keras_vit
from keras_vit import autodiff
from keras_vit.relevance import block_inputs, chefer_step, gradient_sweep, pooled_row, relevance_grid


def _sweep_map(fold):
    """A method from `fold(model, sweep, tokens)` -> row (B, T), compiled on JAX."""

    def traced(model, images, classes):
        tokens, _ = block_inputs(model, images)
        return relevance_grid(model, fold(model, gradient_sweep(model, tokens, classes), tokens))

    return lambda model, images, classes: autodiff.model_function(traced, model)(
        ops.convert_to_tensor(images), ops.convert_to_tensor(np.asarray(classes, "int32")))


def _fold_last_layer(model, sweep, tokens):
    _, probs, grad, _ = next(sweep)
    return chefer_step(model, None, probs, grad)  # p E_k[(grad * A)^+]


def _fold_rollout(model, sweep, tokens):
    row = None
    for _, probs, grad, _ in sweep:
        a = ops.mean(ops.relu(grad * probs), axis=1) + ops.eye(probs.shape[-1])  # (B, K, T, T) -> (B, T, T)
        a = a / ops.sum(a, axis=-1, keepdims=True)
        row = pooled_row(model, probs.shape[0], probs.shape[-1]) if row is None else row
        row = ops.squeeze(ops.matmul(row[:, None, :], a), 1)  # (B, 1, T) x (B, T, T) -> (B, T)
    return row


def _fold_gradient_input(model, sweep, tokens):
    for _, _, _, grad_x in sweep:  # the last one is the gradient at the first block's input
        pass
    return ops.sum(grad_x * tokens[0], axis=-1)  # (B, T, D) -> (B, T)


def last_layer_attention(model, images, classes):
    """The last layer's summary row (class token, or mean patch row), head mean: class-agnostic."""
    row = keras_vit.attention_maps(model, images, layers=-1, head_mean=True, query="summary")[:, 0]  # (B, T)
    return relevance_grid(model, row)


def occlusion(model, images, classes, predict):
    """The drop in the class's probability when each patch alone is set to the background: one
    forward pass per patch (N per image), the slow reference."""
    b, (h, w) = len(images), model.grid_size
    single = patch_pixels(np.eye(h * w, dtype=bool).reshape(h * w, h, w), model.token_pixels)  # (N, H, W, 1): patch j
    occluded = np.where(single[None], background(model), images[:, None]).astype("float32")  # (B, N, H, W, C)
    base = np.take_along_axis(predict(images), classes[:, None], axis=-1)  # (B, 1)
    probs = predict(occluded.reshape(-1, *images.shape[1:])).reshape(b, h * w, -1)  # (B, N, classes)
    return (base - np.take_along_axis(probs, classes[:, None, None], axis=-1)[..., 0]).reshape(b, h, w)

METHODS = {
    "random order": lambda model, images, classes: np.random.default_rng(len(images)).random((len(images), *model.grid_size)),
    "rollout": lambda model, images, classes: keras_vit.attention_rollout(model, images),
    "last-layer attention": last_layer_attention,
    "class_relevance": lambda model, images, classes: keras_vit.class_relevance(model, images, classes),
    "gradient-weighted rollout": _sweep_map(_fold_rollout),
    "gradient-weighted last layer": _sweep_map(_fold_last_layer),
    "gradient x input": _sweep_map(_fold_gradient_input),
}


def background(model):
    """A black pixel (the Fashion-MNIST background), normalized as the model expects: (C,)."""
    return np.asarray(ops.convert_to_numpy(model.normalize(np.zeros(model.num_channels))))


def patch_pixels(selected, patch):
    """(..., h, w) bool per patch -> (..., H, W, 1) per pixel."""
    return np.repeat(np.repeat(selected, patch, -2), patch, -1)[..., None]


def perturbation_curves(model, predict, images, classes, maps, rng, fill=None):
    """Deletion and insertion (Petsiuk et al., RISE, 2018): the probability of `classes` as the
    patches are set to the background (`fill`, default `background(model)`) from the most relevant
    down (deletion), and as they are revealed on a blank image from the most relevant down
    (insertion). Ties in a map are broken at random.

    Returns:
        (deletion, insertion), each (B, N + 1): after k = 0 .. N patches.
    """
    b, (h, w) = len(images), model.grid_size
    n = h * w
    flat = np.asarray(maps, "float64").reshape(b, n)
    order = np.lexsort((rng.random((b, n)), -flat), axis=-1)  # most relevant first, random among ties
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(n)[None].repeat(b, 0), axis=-1)
    chosen = rank[:, None, :] < np.arange(n + 1)[None, :, None]  # (B, N + 1, N): the k first patches
    pixels = patch_pixels(chosen.reshape(b, n + 1, h, w), model.token_pixels)  # (B, N + 1, H, W, 1)
    fill = background(model) if fill is None else fill
    curves = []
    for kept, other in ((fill, images[:, None]), (images[:, None], fill)):
        steps = np.where(pixels, kept, other).astype("float32")  # (B, N + 1, H, W, C)
        probs = predict(steps.reshape(-1, *images.shape[1:])).reshape(b, n + 1, -1)
        curves.append(np.take_along_axis(probs, classes[:, None, None], axis=-1)[..., 0])
    return tuple(curves)


def area_under(curve):
    """(B, N + 1) -> (B,): the trapezoid area over the fraction of patches, 0 to 1."""
    return np.trapezoid(curve, dx=1.0 / (curve.shape[-1] - 1), axis=-1)

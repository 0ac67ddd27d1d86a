"""The explanation methods that `python -m benchmarks.explain` compares, and its perturbation test.

Shapes: B batch, H x W x C images, P patch side in pixels, (h, w) token grid, N = h * w patches,
T tokens, D width.

Every method maps (model, images (B, H, W, C) normalized, classes (B,)) to a map (B, h, w) where
higher means more relevant to the class. The candidates for `keras_vit.class_relevance` all come
from one backward sweep (`keras_vit.relevance.gradient_sweep`) and differ only in how they combine
its per-layer attention A and gradient dy/dA into Abar before r <- r + r Abar:

- "class_relevance": Chefer et al. (ICCV 2021), Abar = E_k[(dy/dA * A)^+];
- "class_relevance, head mean before ReLU": Abar = (E_k[dy/dA * A])^+;
- "class_relevance, abs(grad x A)": Abar = E_k[|dy/dA * A|] (negative evidence counts too).
"""

import numpy as np
from keras import ops

import keras_vit
from keras_vit import autodiff
from keras_vit.relevance import block_inputs, chefer_step, gradient_sweep, relevance_grid


def _chefer_variant(combine):
    """Chefer et al.'s accumulation (`keras_vit.relevance.chefer_step`) with another per-layer
    Abar = combine(dy/dA (B, K, T, T), A (B, K, T, T)) -> (B, T, T); compiled on JAX."""

    def traced(model, images, classes):
        tokens, _ = block_inputs(model, images)
        row = None
        for _, probs, grad, _ in gradient_sweep(model, tokens, classes):
            row = chefer_step(model, row, probs, grad, combine)
        return relevance_grid(model, row)

    return lambda model, images, classes: autodiff.model_function(traced, model)(
        ops.convert_to_tensor(images), ops.convert_to_tensor(np.asarray(classes, "int32")))


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
    "class_relevance, head mean before ReLU": _chefer_variant(lambda g, a: ops.relu(ops.mean(g * a, axis=1))),
    "class_relevance, abs(grad x A)": _chefer_variant(lambda g, a: ops.mean(ops.abs(g * a), axis=1)),
}


def background(model):
    """A black pixel (the Fashion-MNIST background), normalized as the model expects: (C,)."""
    return np.asarray(ops.convert_to_numpy(model.normalize(np.zeros(model.num_channels))))


def patch_pixels(selected, patch):
    """(..., h, w) bool per patch -> (..., H, W, 1) per pixel."""
    return np.repeat(np.repeat(selected, patch, -2), patch, -1)[..., None]


def perturbation_curves(model, predict, images, classes, maps, rng, fill=None, step=1):
    """Deletion and insertion (Petsiuk et al., RISE, 2018): the probability of `classes` as the
    patches are set to the background (`fill`, default `background(model)`) from the most relevant
    down (deletion), and as they are revealed on a blank image from the most relevant down
    (insertion), `step` patches at a time. Ties in a map are broken at random.

    Returns:
        (deletion, insertion), each (B, S): after k = 0, step, 2 step, ..., N patches (the last
        step may be shorter).
    """
    b, (h, w) = len(images), model.grid_size
    n = h * w
    flat = np.asarray(maps, "float64").reshape(b, n)
    order = np.lexsort((rng.random((b, n)), -flat), axis=-1)  # most relevant first, random among ties
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(n)[None].repeat(b, 0), axis=-1)
    counts = np.unique(np.append(np.arange(0, n + 1, step), n))  # (S,): patches removed or revealed
    chosen = rank[:, None, :] < counts[None, :, None]  # (B, S, N): the k first patches
    pixels = patch_pixels(chosen.reshape(b, len(counts), h, w), model.token_pixels)  # (B, S, H, W, 1)
    fill = background(model) if fill is None else fill
    curves = []
    for kept, other in ((fill, images[:, None]), (images[:, None], fill)):
        steps = np.where(pixels, kept, other).astype("float32")  # (B, S, H, W, C)
        probs = predict(steps.reshape(-1, *images.shape[1:])).reshape(b, len(counts), -1)
        curves.append(np.take_along_axis(probs, classes[:, None, None], axis=-1)[..., 0])
    return tuple(curves), counts / n


def area_under(curve, fractions):
    """(B, S) over the fractions of patches (S,), 0 to 1 -> (B,): the trapezoid area."""
    return np.trapezoid(curve, fractions, axis=-1)

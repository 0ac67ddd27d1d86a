"""The explanation methods that `python -m experiments.explain` compares, and its perturbation test.

Shapes: B batch, H x W x C images, P patch side in pixels, (h, w) token grid, N = h * w patches,
T tokens, D width.

Every method maps (model, images (B, H, W, C) normalized, classes (B,), fill (C,): the background
that the test sets patches to) to a map (B, h, w) where higher means more relevant to the class.
The candidates for `keras_vit.class_relevance` (VARIANTS) all come from one backward sweep
(`keras_vit.explain.relevance.gradient_sweep`) and differ in the score differentiated (the logit, or its
log-softmax log p_c), in how they combine each layer's attention A and gradient dy/dA into Abar
before r <- r + r Abar (Chefer et al., ICCV 2021: Abar = E_k[(dy/dA * A)^+]; the head mean before
the positive part; the absolute value; rows scaled to sum 1), and in what the row is multiplied by
(the change of each patch's token when set to the background, the rollout, 0 on background
patches); or they are gradient x input, sum_D dy/dx * (x - x_blank), at the embedding or a middle
layer.
"""

import numpy as np
from keras import ops

import keras_vit
from keras_vit.explain import autodiff
from keras_vit.explain.relevance import (background_patches, block_inputs, chefer_step, gradient_sweep, pooled_row,
                                 relevance_grid)


def _sweep_method(fold, score="logit", background_zero=False):
    """A method from one backward sweep (`keras_vit.explain.relevance.gradient_sweep`) of `score` ("logit",
    "log-softmax": log p_c, or "softmax": p_c), folded by
    `fold(model, tokens, background tokens, sweep)` -> (B, T); with `background_zero`, 0 on the
    patches equal to the background (`keras_vit.explain.relevance.background_patches`); compiled on JAX."""

    def traced(model, images, classes, fill):
        tokens, logits = block_inputs(model, images)
        target = ops.one_hot(classes, model.num_classes, dtype="float32")  # (B, classes)
        if score != "logit":  # d log p_c / d logits = e_c - p; d p_c = p_c (e_c - p)
            p = ops.softmax(logits, axis=-1)
            target = (target - p) * (ops.sum(target * p, axis=-1, keepdims=True) if score == "softmax" else 1.0)
        # The blanked image's tokens.
        blank = model.embed_tokens(ops.broadcast_to(fill, ops.shape(images)), training=False)
        grid = relevance_grid(model, fold(model, tokens, blank, gradient_sweep(model, tokens, classes, target)))
        return (grid * ops.cast(ops.logical_not(background_patches(model, images, fill)), "float32")
                if background_zero else grid)

    return lambda model, images, classes, fill: autodiff.model_function(traced, model)(
        ops.convert_to_tensor(images), ops.convert_to_tensor(np.asarray(classes, "int32")),
        ops.convert_to_tensor(np.asarray(fill, "float32")))


def _chefer(combine=None):
    """Chefer et al.'s accumulation (`keras_vit.explain.relevance.chefer_step`), with another per-layer
    Abar = combine(dy/dA (B, K, T, T), A (B, K, T, T)) -> (B, T, T) when given."""

    def fold(model, tokens, blank, sweep):
        row = None
        for _, probs, grad, _ in sweep:
            row = chefer_step(model, row, probs, grad, combine)
        return row

    return fold


def _gradient_times_input(layer=0, blanked=True):
    """sum_D dy/dx * (x - x_blank) at the tokens entering block `layer` (an index or "middle";
    x_blank: the tokens of the blanked image, at the embedding only; elsewhere x itself): the
    first-order estimate of what setting each patch to the background does to the score."""

    def fold(model, tokens, blank, sweep):
        at = model.num_layers // 2 if layer == "middle" else layer
        for index, _, _, grad_x in sweep:
            if index == at:
                delta = tokens[0] - blank if blanked and at == 0 else tokens[at]
                return ops.sum(grad_x * delta, axis=-1)  # (B, T, D) -> (B, T)

    return fold


def _normalized_rows(g, a):
    """Chefer's Abar with each row scaled to sum 1 (rows without positive entries stay 0)."""
    abar = ops.mean(ops.relu(g * a), axis=1)
    return abar / ops.maximum(ops.sum(abar, axis=-1, keepdims=True), 1e-30)


def _times_token_change(fold):
    """`fold`'s row times |x - x_blank| at the embedding, per patch: a patch that equals the
    background cannot change the score when set to it."""

    def times(model, tokens, blank, sweep):
        return fold(model, tokens, blank, sweep) * ops.sqrt(ops.sum(ops.square(tokens[0] - blank), axis=-1))

    return times


def _chefer_times_rollout(combine=None):
    """Chefer's row times the rollout's (0.5 I + 0.5 head mean of A, from the same sweep)."""

    def fold(model, tokens, blank, sweep):
        row, rolled = None, None
        for _, probs, grad, _ in sweep:
            row = chefer_step(model, row, probs, grad, combine)
            rolled = pooled_row(model, probs.shape[0], probs.shape[-1]) if rolled is None else rolled
            rolled = 0.5 * rolled + 0.5 * ops.squeeze(ops.matmul(rolled[:, None, :], ops.mean(probs, axis=1)), 1)
        return row * rolled

    return fold


def _chefer_times_gradient_input(model, tokens, blank, sweep):
    """Chefer's row times the gradient x input at the embedding, patch by patch."""
    row = None
    for _, probs, grad, grad_x in sweep:
        row = chefer_step(model, row, probs, grad)
    return row * ops.sum(grad_x * (tokens[0] - blank), axis=-1)


def last_layer_attention(model, images, classes, fill):
    """The last layer's summary row (class token, or mean patch row), head mean: class-agnostic."""
    row = keras_vit.attention_maps(model, images, layers=-1, head_mean=True, query="summary")[:, 0]  # (B, T)
    return relevance_grid(model, row)


def occlusion(model, images, classes, fill, predict):
    """The drop in the class's probability when each patch alone is set to the background `fill`
    (C,): one forward pass per patch (N per image), the slow reference."""
    b, (h, w) = len(images), model.grid_size
    single = patch_pixels(np.eye(h * w, dtype=bool).reshape(h * w, h, w), model.token_pixels)  # (N, H, W, 1): patch j
    occluded = np.where(single[None], fill, images[:, None]).astype("float32")  # (B, N, H, W, C)
    base = np.take_along_axis(predict(images), classes[:, None], axis=-1)  # (B, 1)
    probs = predict(occluded.reshape(-1, *images.shape[1:])).reshape(b, h * w, -1)  # (B, N, classes)
    return (base - np.take_along_axis(probs, classes[:, None, None], axis=-1)[..., 0]).reshape(b, h, w)


METHODS = {  # name -> (model, images, classes, fill: the background (C,), normalized) -> (B, h, w)
    "random order": lambda model, images, classes, fill: np.random.default_rng(len(images)).random(
        (len(images), *model.grid_size)),
    "rollout": lambda model, images, classes, fill: keras_vit.attention_rollout(model, images),
    "last-layer attention": last_layer_attention,
    "class_relevance":
        lambda model, images, classes, fill: keras_vit.class_relevance(model, images, classes, baseline=fill),
}
HEAD_MEAN_FIRST = lambda g, a: ops.relu(ops.mean(g * a, axis=1))  # noqa: E731
VARIANTS = {  # the other candidates measured for class_relevance (docs/explain.md)
    "Chefer, logit (the published rule)": _sweep_method(_chefer()),
    "Chefer, logit, head mean before ReLU": _sweep_method(_chefer(HEAD_MEAN_FIRST)),
    "Chefer, logit, abs(grad x A)": _sweep_method(_chefer(lambda g, a: ops.mean(ops.abs(g * a), axis=1))),
    "Chefer, logit, background 0": _sweep_method(_chefer(), background_zero=True),
    "Chefer, logit, rows normalized": _sweep_method(_chefer(_normalized_rows)),
    "Chefer, logit, x token change": _sweep_method(_times_token_change(_chefer())),
    "Chefer, logit, x rollout": _sweep_method(_chefer_times_rollout()),
    "Chefer, log-softmax": _sweep_method(_chefer(), "log-softmax"),
    "Chefer, log-softmax, head mean before ReLU": _sweep_method(_chefer(HEAD_MEAN_FIRST), "log-softmax"),
    "Chefer, log-softmax, rows normalized": _sweep_method(_chefer(_normalized_rows), "log-softmax"),
    "Chefer, log-softmax, x token change": _sweep_method(_times_token_change(_chefer()), "log-softmax"),
    "Chefer, log-softmax, x rollout": _sweep_method(_chefer_times_rollout(), "log-softmax"),
    "grad x input": _sweep_method(_gradient_times_input()),
    "grad x input, softmax": _sweep_method(_gradient_times_input(), "softmax"),
    "grad x tokens, middle layer": _sweep_method(_gradient_times_input("middle")),
    "Chefer, logit, x grad x input": _sweep_method(_chefer_times_gradient_input),
}


def background(model):
    """A black pixel (the Fashion-MNIST background), normalized as the model expects: (C,)."""
    return np.asarray(ops.convert_to_numpy(model.normalize(np.zeros(model.num_channels))))


def patch_pixels(selected, patch):
    """(..., h, w) bool per patch -> (..., H, W, 1) per pixel."""
    return np.repeat(np.repeat(selected, patch, -2), patch, -1)[..., None]


def perturbation_curves(model, predict, images, classes, maps, rng, fill, step=1):
    """Deletion and insertion (Petsiuk et al., RISE, 2018): the probability of `classes` as the
    patches are set to the background `fill` (C,) from the most relevant
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
    curves = []
    for kept, other in ((fill, images[:, None]), (images[:, None], fill)):
        steps = np.where(pixels, kept, other).astype("float32")  # (B, S, H, W, C)
        probs = predict(steps.reshape(-1, *images.shape[1:])).reshape(b, len(counts), -1)
        curves.append(np.take_along_axis(probs, classes[:, None, None], axis=-1)[..., 0])
    return tuple(curves), counts / n


def area_under(curve, fractions):
    """(B, S) over the fractions of patches (S,), 0 to 1 -> (B,): the trapezoid area."""
    return np.trapezoid(curve, fractions, axis=-1)

"""Class-specific relevance: which patches made the model score a given class (Chefer, Gur and Wolf,
"Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers",
ICCV 2021, its rule for self-attention).

Shapes: B batch, C classes, L layers, K heads, T tokens (prefix + N = h * w patches), (h, w) token
grid, D width.

Each layer's attention A (B, K, T, T) is weighted by the gradient of the class's log-probability
y_c = log softmax(logits)_c (its logit against the other classes') with respect to it; the
positive part, averaged over heads, is Abar = E_k[(dy_c/dA * A)^+]. Starting
from the identity, each layer adds its contribution along the residual path, R <- R + Abar R, so
R = (I + Abar_L) ... (I + Abar_1). Only one row of R is read: the class token's (pooling="token"),
or the mean of the patch rows (pooling "gap" and "map", whose head reads every patch token). That
row is accumulated as a vector, r <- r + r Abar_l, from the last layer to the first, which is the
order in which backpropagation reaches the layers. Patches whose pixels all equal the baseline (by
default black) get 0: setting a patch that is already the background to it changes nothing.

Both changes to Chefer et al.'s rule (whose score is the logit, and which ranks every patch) were
chosen by the faithfulness benchmark (`python -m experiments.explain`, docs/explain.md).

Memory holds one layer's (B, K, T, T) maps at a time, as `attention_rollout` does: the forward pass
keeps only each block's input tokens (B, T, D); then each block, from the last to the first, runs
again under the backend's autodiff (`keras_vit.explain.autodiff`), which returns the gradient with respect
to the block's input (passed on to the block below) and to its attention probabilities.

Patch sequences (`keras_vit.naflex`) are explained with their padding masked as in the model: the
padding keys get no attention, the pooled row is the valid patches' mean, and the maps come back
one per image on its own grid.
"""

import functools

import keras
import numpy as np
from keras import ops

from keras_vit import naflex
from keras_vit.explain import autodiff
from keras_vit.explain.maps import head_logits


def class_relevance(model, images, classes=None, *, baseline=None):
    """Relevance of each patch for one class per image (B, h, w), float32: Chefer et al.'s
    gradient-weighted attention (ICCV 2021) for the class's log-probability (log-softmax of the
    logits), 0 on patches equal to the background; chosen by the faithfulness benchmark
    (`python -m experiments.explain`, docs/explain.md).

    Unlike `attention_rollout`, the map depends on the class asked about: on an image that holds
    two objects, each class's map points at its own object. The score explained is the class's
    logit less the log-sum-exp of all logits, so the map shows what raises this class rather than
    the others (for a model trained with a softmax, its log-probability).

    Cost: one forward pass, then for each block a second run with explicit attention and a
    backward pass with respect to its input and attention (never the weights): about three
    forward passes in all (docs/explain.md gives the measured ratio per backend).

    Several classes of one image: pass that image alone (B = 1) with a sequence of C classes; the
    result is (C, h, w). The forward pass then runs once and each class adds only the backward
    sweep, about two forward passes of one image.

    Args:
        model: a `keras_vit.ViT` with a classifier head (`num_classes` > 0) and pooling "token",
            "gap" or "map".
        images: (B, H, W, C), normalized as the model expects; or patch sequences, whose maps come
            back as a list of B NumPy arrays, each on its own image's grid (h_b, w_b).
        classes: the class to explain for each image: None (each image's top class), one int for
            every image, or a sequence of B ints in [0, num_classes).
        baseline: the background pixel, in the model's input space (normalized as `images`): a
            float for every channel or a sequence of C floats. A patch whose pixels are all
            within 1e-3 of it (less than one 8-bit level for a normalization std below 3.9) gets
            relevance 0. Default: a black pixel, `model.normalize(0)`.

    Returns:
        (B, h, w) relevance, higher for patches that raise the class's log-probability; with
        B = 1 and C classes, (C, h, w). It is the patch part of the pooled row of R - I, the share
        that the layers add: with pooling="token" the same as R's, and with "gap" or "map" R's less
        the constant 1/N that the identity gives every patch.
    """
    classes = check_classes(model, images, classes)
    baseline = check_baseline(model, baseline)
    classes = np.full(_batch(images), -1, "int32") if classes is None else classes  # -1: the top class
    out = autodiff.model_function(_class_relevance, model)(keras.tree.map_structure(ops.convert_to_tensor, images),
                                                           classes, baseline)
    if naflex.is_patch_sequence(images):  # (B, L) -> each image's grid; (C, L) for one image and C classes
        coord, valid = (np.asarray(ops.convert_to_numpy(images[k])) for k in ("patch_coord", "patch_valid"))
        count = int(out.shape[0])
        return naflex.token_grids(out, np.repeat(coord, count // len(coord), axis=0),
                                  np.repeat(valid, count // len(valid), axis=0))
    return out


def _batch(images):
    return (images["patches"] if naflex.is_patch_sequence(images) else images).shape[0]


BASELINE_TOLERANCE = 1e-3  # |pixel - baseline| below which a pixel counts as the background


def _class_relevance(model, images, classes, baseline):
    """(B, h, w) relevance of images; (B, L) per token of patch sequences."""
    mask = model.token_mask(images)
    tokens, logits = block_inputs(model, images)
    classes = ops.where(classes < 0, ops.cast(ops.argmax(logits, axis=-1), "int32"), classes)
    # d log p_c / d logits
    target = ops.one_hot(classes, model.num_classes, dtype="float32") - ops.softmax(logits, axis=-1)
    row = None
    for _, probs, grad, _ in gradient_sweep(model, tokens, classes, target, mask):
        row = chefer_step(model, row, probs, grad, token_mask=mask)
    kept = ops.cast(ops.logical_not(background_patches(model, images, baseline)), "float32")
    if mask is not None:
        return ops.cast(row[:, model.num_prefix_tokens :], "float32") * kept  # (B, R + L) -> (B, L)
    return relevance_grid(model, row, model.token_grid(images)) * kept


def check_baseline(model, baseline):
    """`baseline` (None, a float or C floats, in the model's input space) -> (C,) float32."""
    c = model.num_channels
    if baseline is None:
        return np.asarray(ops.convert_to_numpy(model.normalize(np.zeros(c))), "float32")
    allowed = f"use None (a black pixel), a float or a sequence of {c} floats in the model's input space"
    values = None if isinstance(baseline, (bool, np.bool_, str, bytes)) else np.asarray(baseline)
    if (values is None or values.dtype == bool or not np.issubdtype(values.dtype, np.number)
            or values.shape not in ((), (c,))):
        raise ValueError(f"baseline={baseline!r} is not allowed; {allowed}")
    if not np.isfinite(values).all():
        raise ValueError(f"baseline={baseline!r} is not allowed: it is not finite; {allowed}")
    return np.broadcast_to(values, (c,)).astype("float32")


def background_patches(model, images, baseline):
    """(B, h, w) bool: the patches whose pixels are all within BASELINE_TOLERANCE of `baseline` (C,);
    (B, L) for patch sequences."""
    if naflex.is_patch_sequence(images):
        patches = ops.cast(images["patches"], "float32")
        pixels = ops.reshape(patches, (ops.shape(patches)[0], ops.shape(patches)[1], -1, model.num_channels))
        return ops.all(ops.all(ops.abs(pixels - baseline) <= BASELINE_TOLERANCE, axis=-1), axis=-1)  # (B, L, P P, C)
    (h, w), p = model.token_grid(images), model.token_pixels
    near = ops.all(ops.abs(ops.cast(images, "float32") - baseline) <= BASELINE_TOLERANCE, axis=-1)  # (B, H, W)
    cells = ops.reshape(near[:, : h * p, : w * p], (-1, h, p, w, p))
    return ops.all(ops.all(cells, axis=4), axis=2)  # (B, h, p, w, p) -> (B, h, w)


def check_classes(model, images, classes):
    """Validates `classes` against the model and the batch; returns None or an int array (B,)
    (or (C,) for one image)."""
    if model.num_classes == 0:
        raise ValueError("class_relevance explains a class logit, but this model has num_classes=0 (no classifier "
                         "head); use a model with num_classes > 0")
    if model.pooling == "none":
        raise ValueError('class_relevance explains one logit per image, but pooling="none" gives one per patch; use '
                         'a model with pooling "token", "gap" or "map"')
    if classes is None:
        return None
    n, batch = model.num_classes, _batch(images)
    allowed = f"use None (each image's top class), an int in [0, {n}) or a sequence of {batch} such ints"
    if isinstance(classes, (bool, np.bool_, str, bytes)):
        raise ValueError(f"classes={classes!r} is not allowed; {allowed}")
    values = np.asarray(classes)
    if values.dtype == bool or not np.issubdtype(values.dtype, np.integer) or values.ndim > 1:
        raise ValueError(f"classes={classes!r} is not allowed; {allowed}")
    if values.ndim == 1 and len(values) != batch and not (batch == 1 and len(values)):
        raise ValueError(f"classes has {len(values)} entries for {batch} images; {allowed} (or, for one image, "
                         "a sequence of classes)")
    bad = values[(values < 0) | (values >= n)]
    if bad.size:
        raise ValueError(f"classes={classes!r} is not allowed: {int(bad.flat[0])} is not a class of this model; "
                         f"{allowed}")
    return np.broadcast_to(values, (batch,)).astype("int32") if values.ndim == 0 else values.astype("int32")


def block_inputs(model, images):
    """The forward pass, keeping each block's input: L + 1 tensors (B, T, D) (the last is the
    last block's output), and the logits (B, classes)."""
    with autodiff.no_grad():
        tokens = [model.embed_tokens(images, training=False)]  # (B, H, W, C) -> (B, T, D)
        tokens += [x for _, x, _ in model.encoder.iterate(tokens[0], training=False,
                                                          attention_mask=model.attention_mask(images))]
        return tokens, head_logits(model, tokens[-1], model.token_mask(images))


def gradient_sweep(model, tokens, classes, target=None, token_mask=None):
    """Backpropagates the logit of `classes` (B,) block by block, from the last to the first
    (or, with `target` (B, classes), the sum of the logits weighted by it).

    `tokens` are `block_inputs`'s; with one image and C classes, they are repeated to C rows.
    `token_mask` (B, T): patch sequences' (`ViT.token_mask`), None for images.
    Yields (layer index, attention probabilities A (B, K, T, T), their gradient dy/dA, and the
    gradient dy/dx with respect to the block's input tokens (B, T, D)).
    """
    count = ops.shape(classes)[0]
    repeat = (lambda x: ops.repeat(x, count, axis=0)) if tokens[0].shape[0] != count else (lambda x: x)
    if target is None:
        target = ops.one_hot(classes, model.num_classes, dtype="float32")  # (B, classes): d sum_b y_b,c_b / d logits
    mask = None if token_mask is None else repeat(token_mask)
    keys = None if mask is None else ops.expand_dims(mask, 1)  # (B, 1, T), the key mask
    _, _, (grad_x,) = autodiff.vjp(lambda x: (head_logits(model, x, mask), None), (repeat(tokens[-1]),), target)
    t = tokens[0].shape[1]
    for index in reversed(range(model.num_layers)):
        block = model.encoder.blocks[index]
        offset = ops.zeros((count, model.num_heads, t, t), "float32")
        _, probs, (grad_x, grad_probs) = autodiff.vjp(
            functools.partial(_block_with_offset, block, keys=keys), (repeat(tokens[index]), offset), grad_x
        )
        yield index, ops.cast(probs, "float32"), ops.cast(grad_probs, "float32"), grad_x


def _block_with_offset(block, x, offset, keys=None):
    """block(x) -> (output, probabilities), a zero `offset` added to its probabilities, so that
    the gradient with respect to it is the gradient with respect to them; `keys` the key mask."""
    with block.attn.offset_probabilities(offset):
        return block(x, training=False, return_attention_scores=True, attention_mask=keys)


def chefer_step(model, added, probs, grad, combine=None, token_mask=None):
    """One layer of the rule, r <- r + r Abar with Abar = E_k[(grad * A)^+], or
    `combine(grad, probs)` (B, T, T) when given (the benchmark's variants).

    The row is carried as r = p + `added`, p the pooled row (`pooled_row`) and `added` (B, T) what
    the layers added to it (None before the last layer). Kept apart, the layers' share keeps its
    float32 precision: with pooling "gap", p puts 1/N on every patch, and a small class-specific
    share added to it would lose its last digits. `token_mask` (B, T): patch sequences'.
    """
    # (B, K, T, T) -> (B, T, T)
    abar = ops.mean(ops.relu(grad * probs), axis=1) if combine is None else combine(grad, probs)
    row = pooled_row(model, ops.shape(probs)[0], probs.shape[-1], token_mask)
    row = row if added is None else row + added
    step = ops.squeeze(ops.matmul(row[:, None, :], abar), 1)  # (B, 1, T) x (B, T, T) -> (B, T)
    return step if added is None else added + step


def pooled_row(model, batch, t, token_mask=None):
    """(B, T): the tokens the head reads, as weights (`ViT.summary_row` of the identity): the first
    token for pooling="token", else the mean of the (valid) patch tokens. `token_mask` has B rows,
    or one (one image explained for B classes).

    The identity is read as one (T, T) matrix and the row broadcast to the batch afterwards. With
    the identity broadcast to (B, T, T) first and a mask of one row, XLA:CPU (jaxlib 0.10.2, on an
    AVX2-only AMD EPYC) compiles the masked mean wrongly: every row but the first came out wrong,
    while the same function without `jax.jit` was right (tests/explain/test_explain_naflex.py)."""
    row = model.summary_row(ops.eye(t, dtype="float32"), token_mask)  # (T, T) -> (T,), or (B or 1, T)
    return ops.broadcast_to(row, (batch, t))


def relevance_grid(model, row, grid=None):
    """A row over the tokens (B, T) -> its patch entries on the token grid `grid` (default: the
    model's `grid_size`) (B, h, w), float32."""
    return ops.cast(model.patch_grid(row, grid), "float32")  # (B, T) -> (B, h, w)

"""What a ViT attends to: attention maps and attention rollout, computed block by block.

Shapes: B batch, L layers, K heads, T tokens (prefix + h * w patches), (h, w) token grid, D width.

The attention functions run the encoder one block at a time with `return_attention_scores=True`,
so the normal forward pass keeps the fused attention kernel and pays nothing for them. Each block's
(B, K, T, T) probabilities are reduced to what was asked for (the chosen heads or their mean, one
query row, the rollout product) before the next block runs, so memory holds one layer's maps, not
L of them: at 896 px, ViT-B/16's 12 x 12 maps of 3,137^2 tokens would take 5.6 GB per image.
They use only `keras.ops`, so they run on every backend and inside `jax.jit` or `tf.function`.

Patch sequences (`keras_vit.naflex`) work too: the padding is masked in every block, the mean patch
row is the valid patches' mean, and maps on the patch grid come back as a list of NumPy arrays,
one per image on its own grid (h_b, w_b) (`keras_vit.naflex.token_grids`).
"""

from keras import ops

from keras_vit import naflex

QUERIES = ("all", "summary")


def attention_maps(model, images, layers=None, heads=None, head_mean=False, query="all"):
    """Attention probabilities of the chosen layers and heads, as a backend tensor.

    Args:
        model: a `keras_vit.ViT`.
        images: (B, H, W, C), normalized as the model expects, or patch sequences (T = R + L,
            padding rows and columns included: the padding keys get no attention).
        layers: layer indices (negative counts from the end), or None for all L.
        heads: head indices, or None for all K.
        head_mean: average over the chosen heads instead of keeping them.
        query: "all" keeps every query row (T, T); "summary" keeps one row (T,), the row of what
            the head reads (`ViT.summary_row`): the class token's for pooling="token", else the
            mean of the patch rows.

    Returns:
        (B, L', K', T, T), with the K' axis dropped by `head_mean` and the last T axis but one
        dropped by `query="summary"`. With the defaults, (B, L, K, T, T) as before.
    """
    layers, heads = _select(layers, model.num_layers, "layers"), _select(heads, model.num_heads, "heads")
    if query not in QUERIES:
        raise ValueError(f"query={query!r} is not allowed; use one of {QUERIES}")
    kept = {}
    for index, _, scores in _layer_scores(model, images, last=max(layers)):
        if index not in layers:
            continue
        a = scores if heads == tuple(range(model.num_heads)) else ops.take(scores, heads, axis=1)  # (B, K', T, T)
        if head_mean:
            a = ops.mean(a, axis=1)  # (B, K', T, T) -> (B, T, T)
        kept[index] = model.summary_row(a, model.token_mask(images)) if query == "summary" else a
    return ops.stack([kept[i] for i in layers], axis=1)  # L' x (B, ...) -> (B, L', ...)


def attention_rollout(model, images, maps=None):
    """Attention rollout (Abnar & Zuidema, 2020) on the patch grid, (B, h, w).

    Each layer's attention is averaged over heads, the identity is added for the residual path,
    rows are renormalized, and the layers are multiplied from first to last. The result is the
    row of what the head reads (`ViT.summary_row`): the class token's for pooling="token", else
    the mean of the patch rows.

    The product is folded in as each block runs, so only one layer's maps and the running (B, T, T)
    product are held at a time.

    Args:
        model: a `keras_vit.ViT`.
        images: (B, H, W, C), normalized as the model expects; or patch sequences, whose maps
            come back as a list of B NumPy arrays, each on its own image's grid (h_b, w_b).
        maps: precomputed `attention_maps(model, images)` (B, L, K, T, T) or its head mean
            (B, L, T, T), to avoid a second forward pass.
    """
    if maps is not None:
        maps = ops.cast(maps, "float32")
        layer_maps = maps if len(maps.shape) == 4 else ops.mean(maps, axis=2)  # (B, L, K, T, T) -> (B, L, T, T)
        per_layer = (layer_maps[:, i] for i in range(layer_maps.shape[1]))
    else:
        per_layer = (_head_mean(s) for _, _, s in _layer_scores(model, images))
    rollout = None
    for a in per_layer:
        rollout = _rollout_step(rollout, a)
    return _rollout_grid(model, rollout, images)


def attention_summary(model, images):
    """The demo's prediction and explanations in one block-by-block pass: the logits, every layer's
    and head's summary row and the rollout, holding one layer's (B, K, T, T) maps at a time.

    Args:
        model: a `keras_vit.ViT`.
        images: (B, H, W, C), normalized as the model expects, or patch sequences.

    Returns:
        (logits, rows, rollout): logits (B, classes) in float32, equal to `model(images)`; rows
        (B, L, K, T), equal to `attention_maps(model, images, query="summary")`; rollout (B, h, w),
        equal to `attention_rollout(model, images)`.
    """
    rows, rollout, mask = [], None, model.token_mask(images)
    for _, x, scores in _layer_scores(model, images):
        rows.append(model.summary_row(scores, mask))  # (B, K, T, T) -> (B, K, T)
        rollout = _rollout_step(rollout, _head_mean(scores))
    logits = head_logits(model, x, mask)  # no second pass (tests/explain/test_explain.py checks them)
    return logits, ops.stack(rows, axis=1), _rollout_grid(model, rollout, images)  # L x (B, K, T) -> (B, L, K, T)


def head_logits(model, x, token_mask=None):
    """The last block's tokens (B, T, D) -> the logits (B, classes) in float32: the encoder's final
    norm and the head, as `model(images)` applies them (`token_mask` (B, T): patch sequences')."""
    return model.forward_head(model.encoder.norm_output(x), token_mask)


def _head_mean(scores):
    return ops.mean(ops.cast(scores, "float32"), axis=1)  # (B, K, T, T) -> (B, T, T)


def _rollout_step(rollout, a):
    """Folds one layer's head-mean attention a (B, T, T) into the running product (None at first):
    the identity is added for the residual path and the rows are renormalized."""
    a = a + ops.eye(a.shape[-1], dtype=a.dtype)
    a = a / ops.sum(a, axis=-1, keepdims=True)
    return a if rollout is None else ops.matmul(a, rollout)  # (B, T, T) x (B, T, T) -> (B, T, T)


def _rollout_grid(model, rollout, images):
    """The rollout product (B, T, T) -> its summary row on the patch grid of `images` (B, h, w), or
    for patch sequences on each image's grid, a list."""
    return token_map(model, model.summary_row(rollout, model.token_mask(images)), images)


def token_map(model, row, images):
    """A row over the tokens (B, T) -> its patch entries on the patch grid (B, h, w); for patch
    sequences a list of B NumPy arrays, each on its image's grid (`naflex.token_grids`)."""
    if naflex.is_patch_sequence(images):
        return naflex.token_grids(row[:, model.num_prefix_tokens :], images["patch_coord"], images["patch_valid"])
    return model.patch_grid(row, model.token_grid(images))  # (B, T) -> (B, h, w)


def _layer_scores(model, images, last=None):
    """Yields (layer index, (B, T, D) tokens, (B, K, T, T) attention probabilities) block by block,
    up to `last`."""
    x = model.embed_tokens(images, training=False)  # (B, H, W, C) -> (B, T, D)
    yield from model.encoder.iterate(x, last=last, training=False, return_attention_scores=True,
                                     attention_mask=model.attention_mask(images))


def _select(indices, count, name):
    """None -> all of range(count); else the indices made non-negative, checked against count."""
    if indices is None:
        return tuple(range(count))
    indices = (indices,) if isinstance(indices, int) else tuple(indices)
    if not indices or any(not -count <= int(i) < count for i in indices):
        raise ValueError(f"{name}={indices!r} is not allowed; use indices in [-{count}, {count}) or None for all")
    return tuple(int(i) % count for i in indices)

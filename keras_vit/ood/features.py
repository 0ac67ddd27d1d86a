"""The features that the out-of-domain scores read: the mean output token of chosen encoder blocks
and/or the pooled features that the classifier takes (`block_choice`), computed by one pass of the
model (`features`); `fit`, `score` and `check` run a model and call `keras_vit.ood.scores`.

Shapes: B images, H x W x C pixels, S feature sets (one per chosen block, then the pooled one),
C classes, D width.
"""

import numpy as np

from keras_vit.ood.scores import (BLOCK_WORDS, DEFAULT_BLOCKS, DEFAULT_METHOD, POOLED, Verdict, check_method,
                                  fit_features, scores)

# Keras and the rest of keras_vit load inside the functions that run a model.


def block_choice(blocks, num_layers):
    """(block indices, pooled) of the feature sets that `blocks` names: "pooled" (the features the
    classifier takes), "all" or None (every block's mean token), "all+pooled" (both), an int n (the
    last n blocks), or a list of block indices (negative ones from the end) that may end in "pooled"."""
    from keras_vit.layers.transformer import select_blocks

    if isinstance(blocks, str):
        if blocks not in BLOCK_WORDS:
            raise ValueError(f"blocks={blocks!r} is not allowed; use one of {list(BLOCK_WORDS)}, None (every block), "
                             "an int n (the last n) or a list of block indices, optionally ending in 'pooled'")
        return (() if blocks == POOLED else select_blocks(None, num_layers)), blocks != "all"
    if isinstance(blocks, (list, tuple)) and blocks and blocks[-1] == POOLED:
        return (select_blocks(list(blocks[:-1]), num_layers) if len(blocks) > 1 else ()), True
    return select_blocks(blocks, num_layers), False


def features(model, pixels, blocks=DEFAULT_BLOCKS, batch_size=256):
    """(features (B, S, D), logits (B, C)) as float64 arrays for `pixels` (B, H, W, C) in [0, 255] at
    the model's image size: the mean output token of each block that `blocks` chooses, then the
    pooled features that the classifier takes when it chooses them (see `block_choice`).

    The model runs batch by batch through `keras_vit.explain.autodiff.model_function` (see there: on JAX
    one compiled program per batch shape, never op by op), its outputs replicated over a
    distribution (`keras_vit.distribution.replicated`), so that every process reads the whole
    result; `predict` would split the batch across processes."""
    if model.num_classes == 0 or model.head.classifier is None:
        raise ValueError("out-of-domain scores need a classifier; this model has num_classes=0 (a feature extractor)")
    if model.head.pooling == "none":
        raise ValueError("out-of-domain scores need one prediction per image; this model has pooling='none' "
                         "(one per patch)")
    import keras

    from keras_vit.explain.autodiff import model_function

    chosen, pooled = block_choice(blocks, model.num_layers)
    if chosen and pooled and feature_width(model, ()) != model.hidden_dim:
        raise ValueError(f"the pooled features have width {model.representation_size} (pre-logits) and the blocks "
                         f"{model.hidden_dim}, so they cannot be scored together; choose blocks={POOLED!r} or blocks")
    run = model_function(lambda vit, x: _features(vit, x, chosen, pooled), model)
    pixels = np.asarray(pixels, "float32")
    feats, logits = [], []
    for start in range(0, len(pixels), batch_size):
        f, lg = run(pixels[start:start + batch_size])
        feats.append(keras.ops.convert_to_numpy(f))
        logits.append(keras.ops.convert_to_numpy(lg))
    return np.concatenate(feats).astype("float64"), np.concatenate(logits).astype("float64")


def _features(vit, pixels, blocks, pooled):
    """A ViT's forward pass that also returns the features: pixels (B, H, W, C) -> (features
    (B, S, D), logits (B, C))."""
    from keras import ops

    from keras_vit.distribution import replicated

    x = vit.embed_tokens(vit.normalize(pixels), training=False)  # (B, T, D)
    sets = []
    for index, x, _ in vit.encoder.iterate(x, training=False):
        if index in blocks:
            sets.append(ops.cast(ops.mean(x, axis=1), "float32"))  # (B, T, D) -> (B, D)
    head_input = vit.head.features(vit.encoder.norm_output(x))  # (B, T, D) -> (B, D)
    if pooled:
        sets.append(ops.cast(head_input, "float32"))
    logits = ops.cast(vit.head.classifier(head_input), "float32")
    return replicated(ops.stack(sets, axis=1)), replicated(logits)


def fit(model, pixels, labels=None, method=DEFAULT_METHOD, blocks=DEFAULT_BLOCKS, batch_size=256, **options):
    """`Stats` (no threshold yet) of `method` on `model`'s features of in-domain `pixels` (B, H, W, C),
    grouped by `labels` (B,) or, without labels, by the model's predictions. `options` go to
    `fit_features` (e.g. neighbours=)."""
    check_method(method, blocks)
    feats, logits = features(model, pixels, blocks, batch_size)
    classifier = classifier_weights(model) if method == "vim" else None
    return fit_features(method, feats, logits, logits.argmax(-1) if labels is None else np.asarray(labels),
                        *block_choice(blocks, model.num_layers), classifier, **options)


def classifier_weights(model):
    """(kernel (D, C), bias (C,)) of the model's classifier, as float64 arrays."""
    from keras import ops

    dense = model.head.classifier
    if getattr(dense, "quantization_mode", None) is not None:
        raise ValueError(f"method 'vim' reads the classifier's float weights, but it is quantized "
                         f"({dense.quantization_mode}); fit the statistics before model.quantize(...)")
    bias = np.zeros(dense.units) if dense.bias is None else ops.convert_to_numpy(dense.bias)
    return ops.convert_to_numpy(dense.kernel).astype("float64"), bias.astype("float64")


def score(model, pixels, stats, batch_size=256):
    """(B,) out-of-domain scores of `pixels` (B, H, W, C) in [0, 255] by `stats.method`; compare them
    with `stats.threshold`."""
    return scores(stats, *features(model, pixels, [*stats.blocks, *[POOLED] * stats.pooled], batch_size))


def check(model, pixels, stats, batch_size=256):
    """The `Verdict` on `pixels` (B, H, W, C) in [0, 255]: score, percentile and flag of each image.
    `stats` needs a threshold (`with_threshold`)."""
    if stats.threshold is None:
        raise ValueError("these statistics have no threshold; set one with keras_vit.ood.with_threshold")
    values = score(model, pixels, stats, batch_size)
    return Verdict(values, stats.percentile(values), values > stats.threshold, len(stats.reference))


def feature_width(model, blocks):
    """D of the features on `blocks`: the encoder's width, or what the classifier takes."""
    return model.hidden_dim if blocks or model.representation_size is None else model.representation_size

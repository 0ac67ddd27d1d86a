"""The tf.data pipeline of NaFlex patch sequences (`keras_vit.naflex`), the same on every Keras backend:
(image uint8 (H, W, C), label int) examples of any source and any sizes become batches
({"patches" (B, L, P * P * C), "patch_coord" (B, L, 2), "patch_valid" (B, L)}, one-hot labels).

In training, each image draws its token budget L from `seq_lens`, and the images of one budget are
batched together, `tokens_per_batch // L` at a time (timm's `NaFlexMapDatasetWrapper` varies the
budget per batch the same way): the tokens per batch stay about constant, and only one batch shape
per budget is ever compiled. Each image is first scaled to its size at the largest budget and
cached, then scaled to its own batch's budget. Evaluation batches hold every image at `max_seq_len`.
"""

import numpy as np

from keras_vit import naflex


def batch_sizes(budgets, tokens_per_batch, multiple=1):
    """{budget L: batch size}: `tokens_per_batch // L`, rounded down to a multiple of `multiple`
    (the replicas a batch is split over), at least `multiple`."""
    return {b: max(multiple, tokens_per_batch // b // multiple * multiple) for b in budgets}


def steps_per_epoch(num_images, sizes):
    """About how many batches one pass over `num_images` images makes, each image drawing its budget
    uniformly from `sizes` ({budget: batch size})."""
    return max(1, int(num_images * np.mean([1 / s for s in sizes.values()])))


def pipeline(ds, info, patch_size, mean, std, max_seq_len, batch_size, training, seq_lens=None, recipe=None,
             seed=0, multiple=1):
    """Batches of (patch sequences, one-hot labels), see the module doc.

    `batch_size` images of `max_seq_len` tokens make the tokens per batch; `seq_lens` (training) are
    the budgets drawn from, `max_seq_len` alone by default. With `training`, the examples are
    shuffled, each image draws its budget (seeded), and the recipe's --flip and --translate apply
    to each image; the last incomplete batch of each budget is dropped.
    """
    import keras
    import tensorflow as tf

    budgets = seq_lens if training and seq_lens else (max_seq_len,)
    largest, autotune = max(budgets), tf.data.AUTOTUNE

    def at_largest(image, label):  # uint8 (H, W, C) -> float32 at its size for the largest budget
        image = tf.cast(image[..., : info.num_channels], tf.float32)
        grid = tf.numpy_function(lambda h, w: np.asarray(naflex.budget_grid(int(h), int(w), patch_size, largest),
                                                         np.int32), [tf.shape(image)[0], tf.shape(image)[1]],
                                 tf.int32, stateful=False)
        size = grid * patch_size
        image = tf.clip_by_value(tf.image.resize(image, size, method="bicubic", antialias=True), 0.0, 255.0)
        return image, tf.one_hot(label, info.num_classes)

    def sequence(budget):
        return lambda image, label: (naflex.patch_sequence(image, patch_size, budget, mean, std), label)

    if not training:  # from the image itself, as `keras_vit.naflex.patch_sequences` serves it
        ds = ds.map(lambda image, label: sequence(max_seq_len)(image[..., : info.num_channels],
                                                               tf.one_hot(label, info.num_classes)),
                    num_parallel_calls=autotune, deterministic=True)
        return ds.cache().batch(batch_size).prefetch(autotune)
    ds = ds.map(at_largest, num_parallel_calls=autotune, deterministic=True).cache()
    ds = ds.shuffle(min(info.splits.get("train", 50_000), 50_000), seed=seed, reshuffle_each_iteration=True)
    ds = _augment(ds, recipe, seed, keras)
    sizes = batch_sizes(budgets, batch_size * max_seq_len, multiple)
    table = tf.constant([sizes[b] for b in budgets], tf.int64)
    picks = tf.data.Dataset.random(seed=seed + 5, rerandomize_each_iteration=True).map(
        lambda r: tf.cast(r % len(budgets), tf.int32))  # each image's budget, drawn uniformly

    def at_budget(example, pick):  # the sequence at the image's budget, padded to it: (L_pick, ...)
        branches = [lambda b=b: sequence(b)(*example) for b in budgets]
        return tf.switch_case(pick, branches), tf.cast(pick, tf.int64)

    ds = tf.data.Dataset.zip((ds, picks)).map(at_budget, num_parallel_calls=autotune, deterministic=True)
    ds = ds.group_by_window(key_func=lambda example, pick: pick, window_size_func=lambda pick: table[pick],
                            reduce_func=lambda pick, window: window.map(lambda example, _: example).batch(
                                table[pick], drop_remainder=True))
    return ds.prefetch(autotune)


def _augment(ds, recipe, seed, keras):
    """--flip and --translate on each image, by Keras' preprocessing layers."""
    if recipe is None or not (recipe.flip or recipe.translate):
        return ds
    layers = []
    if recipe.translate:
        layers.append(keras.layers.RandomTranslation(recipe.translate, recipe.translate, fill_mode="constant",
                                                     interpolation="nearest", seed=seed))
    if recipe.flip:
        layers.append(keras.layers.RandomFlip("horizontal", seed=seed + 1))

    def augment(image, label):
        for layer in layers:
            image = layer(image, training=True)
        return image, label

    return ds.map(augment)  # sequential: the layers' seed generators are stateful (see pipeline.py)

"""The tf.data input pipeline, the same on every Keras backend: (image uint8 (h, w, c), label int)
examples of any source become batches (images (B, H, W, C) float32, prepared and normalized by the
model's `keras_vit.Preprocessing`; labels (B, num_classes) one-hot float32), with augmentation from
Keras preprocessing layers when training.

TensorFlow is imported inside `pipeline`, as in every module of `training.datasets`: it is slow to
import and prints its logs, and `training.datasets.shapes` alone (the data-scale experiment's)
needs none of it.
"""

import keras


def check_image_size(image_size, patch_size):
    """The model needs square images whose side is a multiple of the patch size."""
    if image_size % patch_size:
        lower, upper = image_size - image_size % patch_size, image_size - image_size % patch_size + patch_size
        raise ValueError(
            f"image_size={image_size} is not a multiple of patch_size={patch_size}; "
            f"allowed nearby sizes: {[s for s in (lower, upper) if s > 0]}"
        )


def augmenter(recipe, image_size, seed):
    """The recipe's Keras augmentation layers, applied to float batches in [0, 255]."""
    layers = []
    if recipe.translate:
        # Random crop of a zero-padded image, as a translation by up to `translate` of the size.
        layers.append(keras.layers.RandomTranslation(recipe.translate, recipe.translate, fill_mode="constant",
                                                     interpolation="nearest", seed=seed))
    if recipe.flip:
        layers.append(keras.layers.RandomFlip("horizontal", seed=seed + 1))
    if recipe.randaugment_layers:
        layers.append(keras.layers.RandAugment(value_range=(0, 255), num_ops=recipe.randaugment_layers,
                                               factor=recipe.randaugment_magnitude, seed=seed + 2))
    return layers


def mixer(recipe, seed):
    """MixUp or CutMix on (images, one-hot labels) batches, or None."""
    if recipe.mixup:
        return keras.layers.MixUp(alpha=recipe.mixup, seed=seed + 3)
    if recipe.cutmix:
        return keras.layers.CutMix(factor=recipe.cutmix, seed=seed + 4)
    return None


def pipeline(ds, info, preprocessing, batch_size, training, recipe=None, seed=0, cache=True, drop_remainder=None,
             normalize=True):
    """Batches of (images (B, H, W, C) float32, labels (B, num_classes) one-hot): each image prepared
    by `preprocessing` (a `keras_vit.Preprocessing`, the model's), augmented when `training`, and
    normalized by it (with `normalize=False`, left in [0, 255]).

    Deterministic for a given seed: file order, shuffle and every augmentation layer are seeded.
    """
    import tensorflow as tf

    autotune = tf.data.AUTOTUNE
    height, width = preprocessing.image_size
    shape = (height, width, preprocessing.channels)

    def prepare(image, label):
        # The demo's Pillow code, through numpy_function: the same pixels for the same image. An
        # image already of the model's shape and channels is left as it is, as `prepare` leaves it.
        if tuple(image.shape) != shape:
            image = tf.numpy_function(preprocessing.prepare_array, [image], tf.uint8, stateful=False)
            image.set_shape(shape)
        return tf.cast(image, tf.float32), tf.one_hot(label, info.num_classes)

    ds = ds.map(prepare, num_parallel_calls=autotune, deterministic=True)
    if cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(min(info.splits.get("train", 50_000), 50_000), seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=training if drop_remainder is None else drop_remainder)
    if training and recipe is not None:
        layers, mix = augmenter(recipe, height, seed), mixer(recipe, seed)

        def augment(images, labels):
            for layer in layers:
                images = layer(images, training=True)
            if mix is not None:
                out = mix({"images": images, "labels": labels}, training=True)
                images, labels = out["images"], out["labels"]
            return images, labels

        # Sequential on purpose: the layers' seed generators are stateful, so parallel calls would
        # draw their random numbers in a varying order and break determinism.
        ds = ds.map(augment)
    if normalize:
        ds = ds.map(lambda x, y: (preprocessing.normalize(x, tf), y), num_parallel_calls=autotune, deterministic=True)
    return ds.prefetch(autotune)

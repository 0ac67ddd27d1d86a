"""Datasets and the tf.data input pipeline, the same on every Keras backend.

Sources (see `load`):
  - any tfds dataset by name ("cifar10", "imagenette", "imagenet2012" with `manual_dir`...), with
    tfds split syntax ("train", "test", "train[:90%]");
  - "fashion_mnist", read through tfds from the local IDX files (`training.fashion_mnist`);
  - "shapes", the seed's synthetic squares, discs, triangles and crosses (`training.shapes`);
  - a local folder with one sub-folder of images per class ("/data/pets", or "folder:/data/pets").

Every source yields (image uint8 (H, W, C), label int) examples; `pipeline` turns them into
batches (images (B, S, S, C) float32, normalized as the model expects; labels (B, num_classes)
one-hot float32), with augmentation from Keras preprocessing layers when training.
"""

import dataclasses
import difflib
import os

import keras
import numpy as np
import tensorflow as tf

from training import shapes
from training.folders import load_folder

AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class Info:
    """What the model needs to know about a dataset."""

    name: str
    num_classes: int
    class_names: tuple
    num_channels: int
    splits: dict  # split name -> number of examples


def load(name, split, data_dir=None, manual_dir=None, seed=0, strict=False):
    """Returns (tf.data.Dataset of (image uint8 (H, W, C), label int64), Info).

    Raises ValueError naming close matches for an unknown dataset and the available splits for a
    missing one; FileNotFoundError saying how to get data that is not on this machine. A folder is
    scanned first (`training.folders`): unreadable images are skipped, or refused with `strict`.
    """
    if name == "shapes" or name.startswith("shapes:"):
        return shapes.load(name, split)
    if name.startswith("folder:") or os.path.isdir(name):
        return load_folder(name.removeprefix("folder:"), split, seed=seed, strict=strict)
    return _load_tfds(name, split, data_dir, manual_dir)


def _builder(name, data_dir):
    import tensorflow_datasets as tfds  # imported here: slow, and only needed for tfds sources

    if name in ("fashion_mnist", "fashion_mnist_local"):
        from training.fashion_mnist import FashionMnistLocal

        return FashionMnistLocal(data_dir=data_dir)
    available = tfds.list_builders(with_community_datasets=False)
    base = name.split("/")[0].split(":")[0]
    if base not in available:
        close = difflib.get_close_matches(base, available, n=8, cutoff=0.6)
        raise ValueError(
            f"Unknown dataset {name!r}. Close tfds names: {close or 'none'}; also 'fashion_mnist', "
            "'shapes' or a folder of class sub-folders. All tfds names: tfds.list_builders()."
        )
    return tfds.builder(name, data_dir=data_dir)


def _load_tfds(name, split, data_dir, manual_dir):
    import tensorflow_datasets as tfds

    builder = _builder(name, data_dir)
    try:
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
    except FileNotFoundError:
        raise
    except Exception as err:  # tfds raises many kinds for missing data; say how to get it
        raise FileNotFoundError(
            f"tfds could not download or prepare {name!r}: {err}. Prepare it "
            "where it can be downloaded and pass --data-dir, or put the manual files in --manual-dir."
        ) from err
    splits = {k: v.num_examples for k, v in builder.info.splits.items()}
    base_split = split.split("[")[0]
    if base_split not in splits:
        raise ValueError(f"Dataset {name!r} has no split {split!r}; available splits: {sorted(splits)}")
    image_key, label_key = builder.info.supervised_keys
    label = builder.info.features[label_key]
    ds = builder.as_dataset(split=split, shuffle_files=False)
    ds = ds.map(lambda ex: (ex[image_key], ex[label_key]), num_parallel_calls=AUTOTUNE)
    channels = builder.info.features[image_key].shape[-1]
    return ds, Info(name, label.num_classes, tuple(label.names), channels, splits)


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


def pipeline(ds, info, image_size, mean, std, batch_size, training, recipe=None, seed=0,
             cache=True, drop_remainder=None):
    """Batches of (images (B, S, S, C) normalized float32, labels (B, num_classes) one-hot).

    Deterministic for a given seed: file order, shuffle and every augmentation layer are seeded.
    """
    def resize(image, label):
        image = tf.cast(image, tf.float32)
        if image.shape[-1] != info.num_channels:
            image = image[..., : info.num_channels]
        # Resize the shorter side then center-crop, so aspect ratio is kept.
        image = keras.layers.Resizing(image_size, image_size, crop_to_aspect_ratio=True)(image) \
            if tuple(image.shape[:2]) != (image_size, image_size) else image
        return image, tf.one_hot(label, info.num_classes)

    ds = ds.map(resize, num_parallel_calls=AUTOTUNE, deterministic=True)
    if cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(min(info.splits.get("train", 50_000), 50_000), seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=training if drop_remainder is None else drop_remainder)
    if training and recipe is not None:
        layers, mix = augmenter(recipe, image_size, seed), mixer(recipe, seed)

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
    mean = tf.constant(np.asarray(mean, "float32") * 255.0)
    std = tf.constant(np.asarray(std, "float32") * 255.0)
    ds = ds.map(lambda x, y: ((x - mean) / std, y), num_parallel_calls=AUTOTUNE, deterministic=True)
    return ds.prefetch(AUTOTUNE)

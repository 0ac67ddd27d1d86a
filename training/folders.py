"""A local folder of class sub-folders as a dataset: root/CLASS/*.{jpg,jpeg,png,bmp,gif}."""

import os

import numpy as np

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


def list_images(root):
    """Returns (paths, labels, class_names), classes in sorted order as Keras does."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"Dataset folder {root!r} does not exist")
    class_names = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    paths, labels = [], []
    for label, name in enumerate(class_names):
        for file in sorted(os.listdir(os.path.join(root, name))):
            if file.lower().endswith(EXTENSIONS):
                paths.append(os.path.join(root, name, file))
                labels.append(label)
    if not paths:
        raise ValueError(f"Folder {root!r} has no images in class sub-folders (root/CLASS/*{EXTENSIONS})")
    return paths, np.asarray(labels, np.int64), tuple(class_names)


def load_folder(root, split, seed=0, validation_fraction=0.1, num_channels=3):
    """Splits "train", "validation" (a seeded `validation_fraction` of the images) or "all"."""
    import tensorflow as tf

    from training.data import Info

    paths, labels, class_names = list_images(root)
    order = np.random.default_rng(seed).permutation(len(paths))
    n_val = int(round(len(paths) * validation_fraction))
    picks = {"validation": order[:n_val], "train": order[n_val:], "all": order}
    if split not in picks:
        raise ValueError(f"Folder dataset {root!r} has no split {split!r}; available splits: {sorted(picks)}")
    idx = np.sort(picks[split])
    ds = tf.data.Dataset.from_tensor_slices((np.asarray(paths)[idx], labels[idx]))

    def decode(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=num_channels, expand_animations=False)
        return image, label

    splits = {k: len(v) for k, v in picks.items()}
    return ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE), Info(root, len(class_names), class_names,
                                                                      num_channels, splits)

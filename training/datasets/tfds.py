"""Any tfds dataset by name, and Fashion-MNIST through tfds from local files.

TensorFlow and tensorflow_datasets are imported inside the functions: they are slow to import, and
only these sources need tensorflow_datasets.
"""

import difflib

from training.datasets.info import Info


def builder(name, data_dir):
    """The tfds builder of `name`; `fashion_mnist` reads the local IDX files (`fashion_mnist.py`)."""
    import tensorflow_datasets as tfds

    if name in ("fashion_mnist", "fashion_mnist_local"):
        from training.datasets.fashion_mnist import FashionMnistLocal

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


def load_tfds(name, split, data_dir, manual_dir):
    """(tf.data.Dataset of (image uint8 (H, W, C), label int64), Info) of a tfds dataset's split."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    source = builder(name, data_dir)
    try:
        source.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
    except FileNotFoundError:
        raise
    except Exception as err:  # tfds raises many kinds for missing data; say how to get it
        raise FileNotFoundError(
            f"tfds could not download or prepare {name!r}: {err}. Prepare it "
            "where it can be downloaded and pass --data-dir, or put the manual files in --manual-dir."
        ) from err
    splits = {k: v.num_examples for k, v in source.info.splits.items()}
    base_split = split.split("[")[0]
    if base_split not in splits:
        raise ValueError(f"Dataset {name!r} has no split {split!r}; available splits: {sorted(splits)}")
    image_key, label_key = source.info.supervised_keys
    label = source.info.features[label_key]
    ds = source.as_dataset(split=split, shuffle_files=False)
    ds = ds.map(lambda ex: (ex[image_key], ex[label_key]), num_parallel_calls=tf.data.AUTOTUNE)
    channels = source.info.features[image_key].shape[-1]
    return ds, Info(name, label.num_classes, tuple(label.names), channels, splits)

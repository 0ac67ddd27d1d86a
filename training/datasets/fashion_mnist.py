"""Fashion-MNIST for tfds from local IDX files, with no download.

The Debian package `dataset-fashion-mnist` installs the original IDX files under
/usr/share/datasets/fashion-mnist, but its .gz files are recompressed, so tfds's registered
checksums for `fashion_mnist` do not match them. This builder reuses tfds's own Fashion-MNIST
features and example generator and only changes where the files come from, so the dataset then
flows through the same `tfds` pipeline as every other one.
"""

import os

import tensorflow_datasets as tfds
from tensorflow_datasets.image_classification import mnist

SEARCH_DIRS = ("/usr/share/datasets/fashion-mnist",)
ENV_VAR = "FASHION_MNIST_DIR"
FILES = {
    "train_data": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_data": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
HOW_TO_GET = (
    "Fashion-MNIST was not found. Install it with `apt-get install dataset-fashion-mnist` "
    f"(it goes to {SEARCH_DIRS[0]}), or put the four IDX files "
    f"({', '.join(v + '[.gz]' for v in FILES.values())}) in a folder and set {ENV_VAR}=that folder."
)


def find_files():
    """Paths of the four IDX files (plain or .gz), from $FASHION_MNIST_DIR or the Debian package."""
    dirs = ([os.environ[ENV_VAR]] if os.environ.get(ENV_VAR) else []) + list(SEARCH_DIRS)
    for folder in dirs:
        found = {}
        for key, stem in FILES.items():
            for name in (stem, stem + ".gz"):
                if os.path.isfile(os.path.join(folder, name)):
                    found[key] = os.path.join(folder, name)
                    break
        if len(found) == len(FILES):
            return found
    raise FileNotFoundError(HOW_TO_GET + f" Searched: {dirs}")


class FashionMnistLocal(mnist.FashionMNIST):
    """tfds `fashion_mnist` (same features, splits and class names), read from local IDX files."""

    def _split_generators(self, dl_manager):
        files = find_files()
        # tfds's extractor handles both plain and gzip files and caches the result.
        gz = {k: v for k, v in files.items() if v.endswith(".gz")}
        files.update(dl_manager.extract(gz) if gz else {})
        return [
            tfds.core.SplitGenerator(
                name=split,
                gen_kwargs=dict(
                    num_examples=count,
                    data_path=os.fspath(files[f"{prefix}_data"]),
                    label_path=os.fspath(files[f"{prefix}_labels"]),
                ),
            )
            for split, prefix, count in (("train", "train", 60_000), ("test", "test", 10_000))
        ]


def read_idx(path):
    """An IDX file (plain or .gz) as a uint8 array: (N, 28, 28) images or (N,) labels."""
    import gzip

    import numpy as np

    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]  # the magic number's last byte is the number of dimensions
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def write_test_sample(path, n=2000, seed=0):
    """Saves n seeded test images (n, 28, 28, 1) uint8 with their labels, for the shipped-checkpoint
    test: `python -c "from training.datasets.fashion_mnist import write_test_sample as w; w('sample.npz')"`."""
    import numpy as np

    files = find_files()
    images, labels = read_idx(files["test_data"]), read_idx(files["test_labels"])
    idx = np.sort(np.random.default_rng(seed).choice(len(labels), n, replace=False))
    np.savez_compressed(path, images=images[idx, :, :, None], labels=labels[idx].astype(np.int64), index=idx)

"""Reading Keras `.weights.h5` files (what `keras.Model.save_weights` and keras-hub presets write)
with h5py, every dataset's shape and dtype checked before any data is read.

Names are the datasets' paths ("layers/dense/vars/0"). Only plain datasets reached by hard links
count: an external or soft link, a virtual dataset or one stored in external files is refused (each
could make h5py read outside the file), and so is a dtype that is not numeric (objects, strings).
h5py reads the header of a dataset without its data, so a file that declares huge arrays costs
nothing until the caller, having compared the shapes with its model, asks for the tensors.
"""

import h5py
import numpy as np

from keras_vit.io import arrays


def headers(path):
    """({name: shape}, {}) of every dataset, from the file's headers alone."""
    with _open(path) as f:
        return {name: d.shape for name, d in _datasets(f, path)}, {}


def read(path, names=None):
    """{name: array} of the datasets `names` (default: all); the others' data are never read."""
    with _open(path) as f:
        found = dict(_datasets(f, path))
        missing = sorted(set(names or ()) - set(found))
        if missing:
            raise ValueError(f"{path} has no {missing}")
        return {name: arrays.decoded(np.asarray(found[name][()])) for name in names or found}


def _open(path):
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise ValueError(f"{path} is not an HDF5 file ({e})") from e


def _datasets(group, path, prefix=""):
    """(name, dataset) of every dataset under `group`, after the checks of the module doc."""
    for key in group:
        link, name = group.get(key, getlink=True), prefix + key
        if not isinstance(link, h5py.HardLink):
            raise ValueError(f"{path}: {name} is a {type(link).__name__}; keras_vit reads only the file's own datasets")
        item = group[key]
        if isinstance(item, h5py.Group):
            yield from _datasets(item, path, name + "/")
            continue
        if item.is_virtual or item.external:
            raise ValueError(f"{path}: {name} stores its data outside the file; "
                             "keras_vit reads only the file's own data")
        arrays.checked_dtype(item.dtype, f"{path}: {name}")
        yield name, item

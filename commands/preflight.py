"""Checks that the command-line tools run after parsing their flags and before any deep-learning
library loads: installed extras, the Keras backend, checkpoint paths and handles, dataset folders.

Nothing here imports Keras, TensorFlow, JAX or torch, so `--help`, a missing extra or a mistyped path
answers in well under a second (loading TensorFlow alone takes several), in one line, with exit
status 2 as argparse uses for a bad flag.
"""

import importlib.util
import json
import os
import sys
import zipfile

from commands import cli

# The extra of the Keras backends (`pip install -e ".[jax]"`); TensorFlow also comes with "train".
BACKEND_EXTRA = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}
# The modules of the `train` extra that training and evaluation import (tf.data, tfds, the plots).
TRAIN_MODULES = ("tensorflow", "tensorflow_datasets", "matplotlib")


def missing(modules):
    """The names in `modules` that cannot be imported here (found without importing them)."""
    absent = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken install, or a module hidden by an import hook
            found = False
        if not found:
            absent.append(name)
    return absent


def keras_backend(environ=os.environ):
    """The backend Keras will load, read as Keras reads it (KERAS_BACKEND, else the "backend" of
    $KERAS_HOME/keras.json, else "tensorflow"), without importing Keras: the import fails when that
    backend is not installed."""
    if environ.get("KERAS_BACKEND"):
        return environ["KERAS_BACKEND"]
    home = environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            return json.load(f).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


def require(prog, modules=(), extra="train", backend=True):
    """Exits with status 2 and one line naming the `pip install` that adds what is missing: any of
    `modules` (from `extra`) and, with `backend`, the Keras backend."""
    absent = missing(modules)
    extras = [extra] if absent else []
    name = keras_backend() if backend else None
    note = ""
    if name in BACKEND_EXTRA and name not in modules and missing([name]):
        absent.append(name)
        extras.append(BACKEND_EXTRA[name])
        note = " (the Keras backend: install it, or set KERAS_BACKEND to an installed one)"
    if not absent:
        return
    print(f"{prog}: error: {', '.join(absent)} not installed{note}; run pip install -e \".[{','.join(extras)}]\" "
          "in the repository's root", file=sys.stderr)
    sys.exit(2)


def standalone(module):
    """`keras_vit.<module>` loaded from its file, outside the package: hub/handles.py and catalog.py
    import only the standard library, but importing them as keras_vit.hub.handles first runs
    keras_vit/__init__.py, which loads Keras and its backend."""
    if f"keras_vit.{module}" in sys.modules:
        return sys.modules[f"keras_vit.{module}"]
    package = importlib.util.find_spec("keras_vit")
    path = os.path.join(package.submodule_search_locations[0], *module.split(".")) + ".py"
    spec = importlib.util.spec_from_file_location(f"_keras_vit_{module.replace('.', '_')}_standalone", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def check_weights(source, flag="--weights"):
    """Raises if `source` can be neither a handle (hf://, gs://, https://), a catalog name, nor an
    existing checkpoint: a missing path, a malformed handle, or a .keras/.npz file that is not a zip
    archive. Reads no more than a zip's directory; the loader checks the rest."""
    if source is None:
        return
    hub, catalog = standalone("hub.handles"), standalone("catalog")
    if hub.is_handle(source):
        hub.parse(source)  # ValueError saying what is wrong with a malformed handle
        return
    if catalog.lookup(source):
        return
    if not os.path.exists(source):
        close = catalog.closest(source)
        hint = f"; catalog names like it: {close}" if close else ""
        raise FileNotFoundError(f"{flag} {source!r}: no such file or folder, and not a handle (hf://, gs://, https://) "
                                f"or a name of keras_vit.list_pretrained(){hint}")
    if source.endswith((".keras", ".npz")) and not (os.path.isfile(source) and zipfile.is_zipfile(source)):
        raise ValueError(f"{flag} {source!r} is not a {os.path.splitext(source)[1]} file: a .keras or .npz file "
                         "is a zip archive, and this is not one")


def is_folder(name):
    """Whether `name` means a folder dataset: "folder:..." or an existing folder, as
    `training.datasets.load` reads it."""
    return name.startswith("folder:") or os.path.isdir(name)


def check_dataset(name):
    """Raises FileNotFoundError for a dataset given as a path ("folder:...", or one that starts with
    /, . or ~) that is not a folder; tfds names and "shapes" are checked when they load."""
    path = name.removeprefix("folder:")
    if (name.startswith("folder:") or name.startswith(("/", ".", "~"))) and not os.path.isdir(path):
        raise FileNotFoundError(f"--dataset {name!r}: no such folder; a folder dataset is a folder of class "
                                "sub-folders of images")


def start(prog, weights, dataset, weights_flag="weights", verbose=False):
    """The start of a tool that loads a checkpoint and a dataset: the train extra, `weights` and
    `dataset` are checked (one-line errors, exit status 2), then TensorFlow loads with its logs
    hidden unless `verbose`."""
    with cli.one_line_errors(prog):
        require(prog, TRAIN_MODULES)
        check_weights(weights, flag=weights_flag)
        check_dataset(dataset)
    cli.quiet_logs(verbose)
    cli.import_tensorflow(verbose)

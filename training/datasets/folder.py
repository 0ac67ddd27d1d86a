"""A local folder of class sub-folders as a dataset: root/CLASS/*.{jpg,jpeg,png,bmp,gif,webp,tif,tiff}.

Before training, `scan` checks every image once with Pillow (`verify`, then a full decode through
`keras_vit.io.images.open_image`, the hardened loader the demo uses too), in parallel threads, and
remembers the result per file (path, size, mtime) in a JSON cache, so that a second run only stats
the files.
Unreadable files are listed by name and skipped with a warning, or refused with `strict=True`.
The pipeline decodes with the same Pillow code, so grayscale, RGBA (composited onto white),
palette, 16-bit and CMYK images all become the model's channels, and what passed the scan decodes
the same way during training: nothing fails halfway through an epoch.
"""

import concurrent.futures
import hashlib
import json
import os
import sys

import numpy as np
from PIL import Image

from keras_vit.io.images import open_image
from training.datasets.info import Info

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
SPLITS = ("train", "validation", "all")
SHOWN = 10  # unreadable files named in the warning; the rest are counted
_SCANNED = {}  # (root, strict) -> list_images result, so that a run's several loads scan and warn once


def cache_dir():
    """Where scan results are kept: $KERAS_VIT_CACHE or ~/.cache/keras_vit, under folder-scans/."""
    base = os.environ.get("KERAS_VIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "keras_vit")
    return os.path.join(base, "folder-scans")


def check_image(path):
    """None if Pillow reads `path` completely, else the reason, e.g. "UnidentifiedImageError: ..."."""
    try:
        with Image.open(path) as im:
            im.verify()  # structure and checksums, without decoding
        open_image(path)  # `verify` leaves the pixels unread; decoding them finds truncated data
        return None
    except Exception as e:  # noqa: BLE001 -- untrusted files fail in many ways; each is a skip
        return f"{type(e).__name__}: {' '.join(str(e).split())}"[:200]


def scan(paths, root):
    """{path: None or the reason it is unreadable} for `paths`, checked in parallel threads (Pillow
    decodes without holding the GIL), with results cached per (path, size, mtime)."""
    key = hashlib.sha1(os.path.abspath(root).encode()).hexdigest()[:16]
    cache_file = os.path.join(cache_dir(), f"{key}.json")
    try:
        with open(cache_file) as f:
            cached = json.load(f)
    except (OSError, ValueError):
        cached = {}
    stamps = {p: (lambda s: [s.st_size, s.st_mtime_ns])(os.stat(p)) for p in paths}
    results = {p: cached[p][2] for p in paths if p in cached and cached[p][:2] == stamps[p]}
    todo = [p for p in paths if p not in results]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, 2 * (os.cpu_count() or 1))) as pool:
        results.update(zip(todo, pool.map(check_image, todo)))
    try:
        os.makedirs(os.path.dirname(cache_file), exist_ok=True)
        with open(cache_file, "w") as f:
            json.dump({p: [*stamps[p], results[p]] for p in paths}, f)
    except OSError:  # a read-only home: scan again next time
        pass
    return results


def list_images(root, strict=False):
    """Returns (paths, labels, class_names) of the readable images, classes in sorted order as Keras
    does. Files without an image extension and unreadable images are reported on stderr and left
    out; with `strict`, unreadable images raise ValueError naming them."""
    memo = (os.path.abspath(root), strict)
    if memo in _SCANNED:
        return _SCANNED[memo]
    if not os.path.isdir(root):
        raise FileNotFoundError(f"Dataset folder {root!r} does not exist")
    class_names = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    files = [(os.path.join(root, name, f), label) for label, name in enumerate(class_names)
             for f in sorted(os.listdir(os.path.join(root, name)))]
    other = [p for p, _ in files if not p.lower().endswith(EXTENSIONS) and os.path.isfile(p)]
    files = [(p, label) for p, label in files if p.lower().endswith(EXTENSIONS)]
    bad = {p: why for p, why in scan([p for p, _ in files], root).items() if why}
    _report(root, bad, other, strict)
    files = [(p, label) for p, label in files if p not in bad]
    if not files:
        raise ValueError(f"Folder {root!r} has no readable images in class sub-folders (root/CLASS/*{EXTENSIONS})")
    paths, labels = zip(*files)
    _SCANNED[memo] = list(paths), np.asarray(labels, np.int64), tuple(class_names)
    return _SCANNED[memo]


def _report(root, bad, other, strict):
    """Names the unreadable images (and counts the files that are not images) on stderr."""
    names = [f"{os.path.relpath(p, root)} ({why})" for p, why in sorted(bad.items())]
    listed = "; ".join(names[:SHOWN]) + (f"; and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
    if bad and strict:
        raise ValueError(f"{len(bad)} unreadable image(s) in {root}: {listed}. Remove them, or leave out "
                         "--strict-data to skip them")
    if bad:
        print(f"training: warning: skipping {len(bad)} unreadable image(s) in {root}: {listed}", file=sys.stderr)
    if other:
        shown = ", ".join(os.path.relpath(p, root) for p in other[:SHOWN])
        print(f"training: note: ignoring {len(other)} file(s) without an image extension {EXTENSIONS}: {shown}"
              + (", ..." if len(other) > SHOWN else ""), file=sys.stderr)


def decode(path, num_channels):
    """(H, W, C) uint8 pixels of an image file, through the same Pillow code as the scan."""
    im = open_image(path.decode() if isinstance(path, bytes) else path)
    return np.asarray(im.convert("L" if num_channels == 1 else "RGB"), "uint8").reshape(*im.size[::-1], num_channels)


def load_folder(root, split, seed=0, validation_fraction=0.1, num_channels=3, strict=False):
    """Splits "train", "validation" (a seeded `validation_fraction` of the images) or "all"."""
    import tensorflow as tf

    if split not in SPLITS:
        raise ValueError(f"Folder dataset {root!r} has no split {split!r}; available splits: {sorted(SPLITS)}")
    paths, labels, class_names = list_images(root, strict)
    order = np.random.default_rng(seed).permutation(len(paths))
    n_val = int(round(len(paths) * validation_fraction))
    picks = {"validation": order[:n_val], "train": order[n_val:], "all": order}
    idx = np.sort(picks[split])
    ds = tf.data.Dataset.from_tensor_slices((np.asarray(paths)[idx], labels[idx]))

    def load(path, label):
        image = tf.numpy_function(lambda p: decode(p, num_channels), [path], tf.uint8, stateful=False)
        image.set_shape([None, None, num_channels])
        return image, label

    splits = {k: len(v) for k, v in picks.items()}
    # ignore_errors: a file changed or removed after the scan is dropped, not a crash mid-epoch.
    ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).ignore_errors(log_warning=True)
    return ds, Info(root, len(class_names), class_names, num_channels, splits)

"""A few held-out images per class, kept beside the checkpoint so that the demo can offer images like
the training data: `<out>/examples/<class name, made file-safe>/<n>.png`, the layout that
`python -m apps.demo --examples DIR` reads (a folder of class sub-folders).

The images come from the validation split, else the test split, so none was trained on; they are
stored as the dataset holds them (grayscale or RGB), shrunk to at most `MAX_SIDE` pixels a side.
"""

import os
import re
import shutil

import numpy as np


PER_CLASS = 3
MAX_SIDE = 512  # a folder dataset's photos can be large; the demo resizes to the model anyway
SCANNED = 20_000  # examples read at most, so that a rare class cannot make the search read a whole split


def safe_name(name):
    """A folder name for a class name: each character other than a letter, digit, space, ".", "_"
    or "-" becomes "_" ("T-shirt/top" -> "T-shirt_top"), and leading or trailing dots and spaces go."""
    return re.sub(r"[^\w .-]", "_", str(name)).strip(" .") or "class"


def folder_names(class_names):
    """`safe_name` of each class, with "_2", "_3"... added where two names would share a folder."""
    names, seen = [], set()
    for name in class_names:
        base, candidate, n = safe_name(name), safe_name(name), 1
        while candidate.lower() in seen:  # case-insensitive file systems
            n += 1
            candidate = f"{base}_{n}"
        seen.add(candidate.lower())
        names.append(candidate)
    return names


def pick(examples, num_classes, per_class=PER_CLASS, limit=SCANNED):
    """{label: [image (H, W, C) uint8, ...]} with up to `per_class` images of each class, in the
    order of `examples` (an iterable of (image, label)); stops when every class has them."""
    picked = {label: [] for label in range(num_classes)}
    for i, (image, label) in enumerate(examples):
        if i >= limit or all(len(v) >= per_class for v in picked.values()):
            break
        label = int(label)
        if label in picked and len(picked[label]) < per_class:
            picked[label].append(np.asarray(image))
    return picked


def save(picked, class_names, folder):
    """Writes `picked` (see `pick`) as `folder/<class folder>/<n>.png`, replacing `folder` in one
    rename once every file is written. Returns the number of images."""
    from PIL import Image

    partial = folder.rstrip(os.sep) + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    count = 0
    for name, label in zip(folder_names(class_names), range(len(class_names))):
        if not picked.get(label):
            continue
        os.makedirs(os.path.join(partial, name))
        for n, image in enumerate(picked[label]):
            im = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
            im.thumbnail((MAX_SIDE, MAX_SIDE))
            im.save(os.path.join(partial, name, f"{n}.png"))
            count += 1
    shutil.rmtree(folder, ignore_errors=True)
    if count:
        os.replace(partial, folder)
    return count


def write(raw, info, out_dir, per_class=PER_CLASS):
    """Keeps `per_class` images of each class of `raw`, a held-out split's examples (the run's
    validation split, else its test split; None: none), in `out_dir/examples`. Returns the number
    written."""
    if raw is None:
        return 0
    picked = pick(raw.as_numpy_iterator(), info.num_classes, per_class)
    return save(picked, info.class_names, os.path.join(out_dir, "examples"))

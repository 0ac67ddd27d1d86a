"""What several studies share: the shipped checkpoint and the Fashion-MNIST images it was trained on,
a model trained by the training CLI, and how a study publishes its tables."""

import os
import subprocess
import time

# The shipped Fashion-MNIST model (28 x 28 grayscale, patch 4), which most studies measure; the
# studies run from the repository's root (`python -m experiments.NAME`).
CHECKPOINT = "checkpoints/fashion-mnist-vit/model.keras"


def fashion_mnist():
    """(train images (60000, 28, 28), labels, test images (10000, 28, 28), labels), uint8, from the
    Debian package dataset-fashion-mnist (or $FASHION_MNIST_DIR)."""
    from training.datasets.fashion_mnist import find_files, read_idx

    files = find_files()
    return tuple(read_idx(files[k]) for k in ("train_data", "train_labels", "test_data", "test_labels"))


def publish(text, result, out=None, docs=None, markers=None):
    """Prints a study's tables `text`; writes its JSON `result` to `out` and `text` into the page
    `docs` between its (begin, end) `markers`, when given."""
    import json

    from benchmarks.cpu import replace_block

    print(text)
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    if docs:
        replace_block(docs, *markers, text)


def train(command, out):
    """Runs `command`, a `python -m training.train` command line (a list) that writes its run to
    `out`, in a process of its own; (the run's model, loaded by `keras_vit.load`, seconds taken).
    Raises RuntimeError with the end of its output if it fails."""
    import keras_vit

    start = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    seconds = time.time() - start
    return keras_vit.load(os.path.join(out, "model.keras")), seconds

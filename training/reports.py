"""What a finished run leaves behind: metrics.json, a training-curve PNG, a confusion-matrix PNG."""

import json
import os

import keras
import numpy as np

from keras_vit.explain.autodiff import model_function
from keras_vit.distribution import replicated


def predict(model, dataset):
    """(labels (N,), predicted classes (N,)) over a batched dataset of (images or patch sequences,
    one-hot labels).

    Each batch goes through `keras_vit.explain.autodiff.model_function`: on JAX one compiled program per
    batch shape (eager JAX dispatches every operation on its own, several times slower, and a
    model sharded over several devices can abort that way), with the logits replicated over a
    distribution so that every process reads them all. A distributed `predict_on_batch` would
    split the batch between the processes, and no process could read the whole result.
    """
    run = model_function(_logits, model)
    labels, preds = [], []
    for images, onehot in dataset:
        preds.append(keras.ops.convert_to_numpy(run(keras.tree.map_structure(np.asarray, images))).argmax(-1))
        labels.append(np.asarray(onehot).argmax(-1))
    return np.concatenate(labels), np.concatenate(preds)


def _logits(model, images):
    return replicated(model(images, training=False))


def confusion(labels, preds, num_classes):
    """(num_classes, num_classes) counts, rows true classes, columns predictions."""
    matrix = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(matrix, (labels, preds), 1)
    return matrix


def write(model, test, info, recipe, out_dir, train_seconds, history=None, trainable=None,
          step_seconds=None, kept=None):
    """Evaluates `model` on `test`, writes metrics.json and the two PNGs; returns the metrics.

    `trainable`: the number of weights that trained (the trained model's, which `model`, reloaded
    from its file, may not keep); `step_seconds`: the median time of a training step; `kept`: which
    epoch `model` is (`training.best_epoch.kept`)."""
    labels, preds = predict(model, test)
    matrix = confusion(labels, preds, info.num_classes)
    metrics = {
        "dataset": info.name,
        "test_split": recipe.test_split,
        "test_examples": int(len(labels)),
        "test_accuracy": float((labels == preds).mean()),
        "epochs": recipe.epochs,
        "kept": kept,
        "train_seconds_this_process": round(train_seconds, 1),
        "backend": keras.backend.backend(),
        "parameters": int(model.count_params()),
        "trainable_parameters": trainable,
        "lora_rank": recipe.lora_rank,
        "step_seconds": step_seconds,
        "image_size": list(model.image_size),
        "class_names": list(info.class_names),
        "confusion_matrix": matrix.tolist(),
    }
    write_json(out_dir, metrics)
    log = os.path.join(out_dir, "log.csv")
    if os.path.exists(log):
        plot_curves(log, os.path.join(out_dir, "curves.png"), metrics["test_accuracy"])
    plot_confusion(matrix, info.class_names, os.path.join(out_dir, "confusion.png"))
    return metrics


def write_json(out_dir, metrics):
    """Writes `metrics` as the run's summary, `out_dir/metrics.json`."""
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)


def _read_log(path):
    """log.csv as {column: array}; a resumed run may have repeated epochs, the last one wins."""
    rows = {}
    with open(path) as f:
        header = f.readline().strip().split(",")
        for line in f:
            values = line.strip().split(",")
            if len(values) == len(header) and values[0] != header[0]:
                rows[int(values[0])] = [float(v) if v not in ("", "NA") else np.nan for v in values]
    table = np.array([rows[k] for k in sorted(rows)]).reshape(-1, len(header))
    return {name: table[:, i] for i, name in enumerate(header)}


def plot_curves(log_path, png_path, test_accuracy=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = _read_log(log_path)
    epochs = log["epoch"] + 1
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    shown = lambda key: key in log and np.isfinite(log[key]).any()  # noqa: E731  (no NA-only columns)
    for key in ("loss", "val_loss"):
        if shown(key):
            ax1.plot(epochs, log[key], marker=".", label=key)
    for key in ("accuracy", "val_accuracy"):
        if shown(key):
            ax2.plot(epochs, log[key], marker=".", label=key)
    if test_accuracy is not None:
        ax2.axhline(test_accuracy, color="k", ls="--", lw=1, label=f"test {test_accuracy:.4f}")
    ax1.set(xlabel="epoch", title="loss")
    ax2.set(xlabel="epoch", title="accuracy")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def plot_confusion(matrix, class_names, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(class_names)
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * n, 1.0 + 0.5 * n))
    ax.imshow(matrix, cmap="Blues")
    for i in range(n):
        for j in range(n):
            ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7,
                    color="white" if matrix[i, j] > matrix.max() / 2 else "black")
    ax.set_xticks(range(n), class_names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(n), class_names, fontsize=8)
    ax.set(xlabel="predicted", ylabel="true")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)

"""Accuracy of Keras' own `model.quantize` modes on the shipped Fashion-MNIST checkpoint.

    KERAS_BACKEND=tensorflow python -m experiments.quantize_accuracy

Scores the 10,000 test images (from the Debian package dataset-fashion-mnist) with the float32
model and with a copy quantized by `ViT.quantize` in each of int8, int4 and float8: top-1 accuracy,
its change from float32 in points, and the top-1 agreement with float32. Prints one JSON line.
"""

import argparse
import json

import keras
import numpy as np

from benchmarks.cpu import cpu_info
from experiments.common import CHECKPOINT
from training.datasets.fashion_mnist import find_files, read_idx

MODES = ("int8", "int4", "float8")


def predictions(model, pixels):
    return np.asarray(model.predict(model.normalize(pixels), batch_size=500, verbose=0)).argmax(-1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=CHECKPOINT)
    args = parser.parse_args(argv)
    files = find_files()
    pixels = read_idx(files["test_data"])[..., None]  # (N, 28, 28) -> (N, 28, 28, 1) uint8
    labels = read_idx(files["test_labels"])
    ref = predictions(keras.saving.load_model(args.checkpoint, safe_mode=True, compile=False), pixels)
    result = {"backend": keras.backend.backend(), "cpu": cpu_info(), "images": int(len(labels)),
              "float32": {"accuracy": float((ref == labels).mean())}}
    for mode in MODES:
        model = keras.saving.load_model(args.checkpoint, safe_mode=True, compile=False)
        model.quantize(mode)
        out = predictions(model, pixels)
        accuracy = float((out == labels).mean())
        result[mode] = {"accuracy": accuracy, "points": round(100 * (accuracy - result["float32"]["accuracy"]), 2),
                        "agreement": float((out == ref).mean())}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

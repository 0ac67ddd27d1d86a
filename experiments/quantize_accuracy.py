"""Accuracy of Keras' own `model.quantize` modes, and of the `mixed_bfloat16` policy, on the shipped
Fashion-MNIST checkpoint.

    KERAS_BACKEND=tensorflow python -m experiments.quantize_accuracy
    KERAS_BACKEND=jax python -m experiments.quantize_accuracy --modes mixed_bfloat16

Scores the 10,000 test images (from the Debian package dataset-fashion-mnist) with the float32
model and with a copy quantized by `ViT.quantize` in each of int8, int4 and float8, or built under
the mixed_bfloat16 policy with the same weights: top-1 accuracy, its change from float32 in points,
and the top-1 agreement with float32. Prints one JSON line.
"""

import argparse
import json

import keras
import numpy as np

import keras_vit
from benchmarks.cpu import cpu_info
from experiments.common import CHECKPOINT
from training.datasets.fashion_mnist import find_files, read_idx

MODES = ("int8", "int4", "float8", "mixed_bfloat16")


def predictions(model, pixels):
    return np.asarray(model.predict(model.normalize(pixels), batch_size=500, verbose=0)).argmax(-1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=CHECKPOINT)
    parser.add_argument("--modes", default=",".join(MODES[:3]),
                        help=f"comma-separated, of {', '.join(MODES)} (default: the three quantization modes)")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes {args.modes!r}: give some of {', '.join(MODES)}, comma-separated")
    files = find_files()
    pixels = read_idx(files["test_data"])[..., None]  # (N, 28, 28) -> (N, 28, 28, 1) uint8
    labels = read_idx(files["test_labels"])
    ref = predictions(keras_vit.load(args.checkpoint), pixels)
    result = {"backend": keras.backend.backend(), "cpu": cpu_info(), "images": int(len(labels)),
              "float32": {"accuracy": float((ref == labels).mean())}}
    for mode in modes:
        model = keras_vit.load(args.checkpoint)
        if mode == "mixed_bfloat16":  # the same weights, computed in bf16
            weights, model = model.get_weights(), keras_vit.ViT.from_config({**model.get_config(), "dtype": mode})
            model.set_weights(weights)
        else:
            model.quantize(mode)
        out = predictions(model, pixels)
        accuracy = float((out == labels).mean())
        result[mode] = {"accuracy": accuracy, "points": round(100 * (accuracy - result["float32"]["accuracy"]), 2),
                        "agreement": float((out == ref).mean())}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Accuracy of the serving paths on the shipped Fashion-MNIST checkpoint's test set.

    KERAS_BACKEND=tensorflow python -m experiments.serving_accuracy

Exports checkpoints/fashion-mnist-vit/model.keras to OpenVINO IR and scores the 10,000 test
images (from the Debian package dataset-fashion-mnist) with: the Keras model (float32), OpenVINO
f32, OpenVINO bf16 (INFERENCE_PRECISION_HINT=bf16) and OpenVINO int8 (NNCF, calibrated on 300
training images). For each path: top-1 accuracy, its difference from Keras float32 in points, and
the largest error of the log-probabilities against Keras (the logits' error up to a per-image
constant, since the artifact ends in a softmax). Prints one JSON line.
"""

import argparse
import json
import os
import tempfile

import keras
import numpy as np

import keras_vit
from benchmarks.cpu import cpu_info
from experiments.common import CHECKPOINT
from keras_vit import serving
from keras_vit.export import ServingModel
from training.datasets.fashion_mnist import find_files, read_idx


def batched(fn, pixels, batch=250):
    return np.concatenate([fn(pixels[i : i + batch]) for i in range(0, len(pixels), batch)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=CHECKPOINT)
    args = parser.parse_args(argv)
    files = find_files()
    test = read_idx(files["test_data"])[..., None]  # (N, 28, 28) -> (N, 28, 28, 1) uint8
    labels = read_idx(files["test_labels"])
    calib = read_idx(files["train_data"])[:300, ..., None]
    model = keras.saving.load_model(args.checkpoint, safe_mode=True)
    serving_model = ServingModel(model)
    keras_probs = batched(lambda p: keras.ops.convert_to_numpy(serving_model(p)), test)
    with tempfile.TemporaryDirectory() as tmp:
        ir = keras_vit.export(model, os.path.join(tmp, "model.xml"), format="openvino")
        int8 = serving.quantize_int8(ir, os.path.join(tmp, "int8.xml"), calib)
        paths = {"openvino-f32": serving.load(ir, "openvino"), "openvino-bf16": serving.load(ir, "openvino", "bf16"),
                 "openvino-int8": serving.load(int8, "openvino")}
        results = {"keras-f32": _score(keras_probs, keras_probs, labels)}
        results.update({name: _score(batched(fn, test), keras_probs, labels) for name, fn in paths.items()})
    print(json.dumps({"cpu": cpu_info()["model"], "checkpoint": os.path.relpath(args.checkpoint), "results": results}))


def _score(probs, reference, labels):
    top1 = float(np.mean(probs.argmax(-1) == labels))
    top1_ref = float(np.mean(reference.argmax(-1) == labels))
    log_err = np.abs(np.log(np.maximum(probs, 1e-30)) - np.log(np.maximum(reference, 1e-30)))
    return {"top1": round(100 * top1, 2), "points_vs_f32": round(100 * (top1 - top1_ref), 2),
            "max_logprob_error": float(log_err.max()), "mean_logprob_error": float(log_err.mean()),
            "max_prob_error": float(np.abs(probs - reference).max())}


if __name__ == "__main__":
    main()

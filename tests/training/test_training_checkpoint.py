"""The shipped Fashion-MNIST checkpoint reaches its recorded accuracy on a committed test sample."""

import json
import os

import numpy as np

import keras
import keras_vit  # noqa: F401  (registers the ViT class for safe-mode loading)
from tests import ROOT

CKPT = os.path.join(ROOT, "checkpoints", "fashion-mnist-vit")


def test_shipped_checkpoint_matches_its_metrics():
    with open(os.path.join(CKPT, "metrics.json")) as f:
        recorded = json.load(f)["test_accuracy"]
    assert os.path.getsize(os.path.join(CKPT, "model.keras")) < 20 * 2**20
    model = keras.saving.load_model(os.path.join(CKPT, "model.keras"), safe_mode=True, compile=False)
    assert model.image_size == (28, 28) and len(model.class_names) == 10 and model.class_names[0] == "T-shirt/top"
    # 2,000 seeded test images (training.datasets.fashion_mnist.write_test_sample), uint8 (N, 28, 28, 1).
    sample = np.load(os.path.join(CKPT, "test_sample.npz"), allow_pickle=False)
    assert len(sample["labels"]) >= 500
    preds = []
    for start in range(0, len(sample["labels"]), 500):
        logits = model(model.normalize(sample["images"][start : start + 500]), training=False)
        preds.append(keras.ops.convert_to_numpy(logits).argmax(-1))
    accuracy = float((np.concatenate(preds) == sample["labels"]).mean())
    assert abs(accuracy - recorded) <= 0.015, (accuracy, recorded)

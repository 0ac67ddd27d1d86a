"""benchmarks.ood on a tiny model, and the shipped checkpoint's out-of-domain statistics against the
figures that docs/app.md shows."""

import os

import keras
import numpy as np
import pytest

from benchmarks import ood as bench
from conftest import randomize, tiny_vit
from keras_vit import ood

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CKPT = os.path.join(ROOT, "checkpoints", "fashion-mnist-vit", "model.keras")


def test_auroc_counts_the_pairs_in_order():
    assert bench.auroc([0.1, 0.2], [0.3, 0.4]) == 1.0 and bench.auroc([0.3, 0.4], [0.1, 0.2]) == 0.0
    assert bench.auroc([0.1, 0.3], [0.2, 0.4]) == 0.75


def test_out_of_domain_sets_are_prepared_as_the_demo_prepares_uploads(monkeypatch):
    monkeypatch.setattr(bench, "CROPS_PER_PHOTO", 2)
    monkeypatch.setattr(bench, "NOISE_IMAGES", 3)
    model = tiny_vit(image_size=28, num_channels=1, num_classes=10)
    sets = bench.out_of_domain_sets(model)
    photos = len(bench.SKIMAGE_PHOTOS) + 2  # and scikit-learn's two
    sizes = {name: len(pixels) for name, pixels in sets.items()}
    assert sizes == {"digits (scikit-learn, upscaled)": 1797, "photos (whole)": photos, "photo crops": 2 * photos,
                     "photo crops, no Fashion-MNIST-style preprocessing": 2 * photos, "noise (uniform, Gaussian)": 6}
    for pixels in sets.values():
        assert pixels.shape[1:] == (28, 28, 1) and pixels.dtype == np.uint8
    # The Fashion-MNIST-style preprocessing makes the background black, as in the training images.
    assert np.median(sets["photo crops"][:, 0]) < np.median(sets["photo crops, no Fashion-MNIST-style preprocessing"][:, 0])


def test_measure_reports_every_score_set_and_the_false_alarms():
    model = randomize(tiny_vit(image_size=28, num_channels=1, num_classes=10), scale=0.1)
    rng = np.random.default_rng(0)
    inside = rng.integers(0, 60, (40, 28, 28, 1)).astype("uint8")
    stats = ood.fit(model, inside[:20], labels=np.arange(20) % 10)
    stats = ood.with_threshold(stats, ood.score(model, inside[20:], stats), 0.1)
    sets = {"bright": rng.integers(200, 256, (10, 28, 28, 1)).astype("uint8")}
    results, flagged, false_alarm = bench.measure(model, stats, inside[20:], sets)
    assert list(results) == ["maximum softmax (1 - MSP)", "energy", "Mahalanobis, last block",
                             "Mahalanobis, all blocks (stored)"]
    assert results["Mahalanobis, all blocks (stored)"]["bright"] == 1.0 and flagged == {"bright": 1.0}
    assert false_alarm == pytest.approx(0.1)
    text = bench.markdown(results, flagged, false_alarm, stats, {"bright": 10}, 20)
    assert "| Mahalanobis, all blocks (stored) | 1.000 | 1.000 |" in text and "**10.0%**" in text


def test_the_shipped_checkpoint_has_statistics_and_docs_show_the_committed_run():
    model = keras.saving.load_model(CKPT, safe_mode=True, compile=False)
    stats = ood.load_for(CKPT, model)
    assert stats.method == "mahalanobis" and stats.means.shape == (6, 10, 64) and stats.threshold > 0
    with open(os.path.join(ROOT, "benchmarks", "results", "ood.md")) as f:
        table = [line for line in f.read().splitlines() if line.startswith("|") or "false alarms" in line]
    with open(os.path.join(ROOT, "docs", "app.md")) as f:
        page = f.read()
    assert len(table) >= 7 and all(line in page for line in table)
    assert f"Threshold {stats.threshold:.1f}" in page

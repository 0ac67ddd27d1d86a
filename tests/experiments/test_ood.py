"""experiments.ood: its shifts, its measures on a tiny model, its command line, and the committed run
against docs/app.md and the shipped checkpoint's ood.npz."""

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from experiments.ood import __main__ as study
from experiments.ood import shifts
from tests import ROOT
from tests.conftest import randomize, tiny_vit
from keras_vit import ood

CKPT = os.path.join(ROOT, "checkpoints", "fashion-mnist-vit", "model.keras")
RESULT = os.path.join(ROOT, "experiments", "results", "ood.json")
PAGE = os.path.join(ROOT, "docs", "app.md")


def test_auroc_and_fpr_at_95_count_the_pairs_in_order():
    assert shifts.auroc([0.1, 0.2], [0.3, 0.4]) == 1.0 and shifts.auroc([0.3, 0.4], [0.1, 0.2]) == 0.0
    assert shifts.auroc([0.1, 0.3], [0.2, 0.4]) == 0.75
    inside = np.arange(100.0)  # the 95th percentile is 94.05
    assert shifts.fpr_at_95(inside, [94.0, 95.0, 200.0, 3.0]) == 0.5


@pytest.mark.parametrize("channels", [1, 3])
def test_shifts_are_prepared_for_the_model_as_the_demo_prepares_uploads(monkeypatch, channels):
    monkeypatch.setattr(shifts, "CROPS_PER_PHOTO", 2)
    monkeypatch.setattr(shifts, "NOISE_IMAGES", 3)
    model = tiny_vit(image_size=28, num_channels=channels, num_classes=10)
    rng = np.random.default_rng(0)
    test = rng.integers(0, 120, (30, 28, 28)).astype("uint8")
    near, far = shifts.near_shifts(model, test, rng), shifts.far_shifts(model, rng)
    photos = len(shifts.SKIMAGE_PHOTOS) + 2  # and scikit-learn's two
    assert {k: len(v) for k, v in far.items()} == {
        "digits (scikit-learn, upscaled)": 1797, "photos (whole)": photos, "photo crops, flipped and recoloured":
        2 * photos, "the same crops, no Fashion-MNIST-style preprocessing": 2 * photos, "noise (uniform, Gaussian)": 6,
        "flat images (every grey level)": 256}
    assert {k: len(v) for k, v in near.items()} == dict.fromkeys(near, 30) and len(near) == 4
    for pixels in [*near.values(), *far.values()]:
        assert pixels.shape[1:] == (28, 28, channels) and pixels.dtype == np.uint8
    assert sorted(map(bytes, near["inverted"][..., 0])) == sorted(map(bytes, 255 - test))
    assert np.unique(far["flat images (every grey level)"].reshape(256, -1), axis=1).shape[1] == 1
    if channels == 1:  # the Fashion-MNIST-style preprocessing makes the background black, as in training
        crops = far["photo crops, flipped and recoloured"][:, 0]
        assert np.median(crops) < np.median(far["the same crops, no Fashion-MNIST-style preprocessing"][:, 0])


def test_measure_reports_every_variant_on_near_and_far_shifts():
    model = randomize(tiny_vit(image_size=28, num_channels=1, num_classes=10), scale=0.1)
    rng = np.random.default_rng(0)
    inside = rng.integers(0, 60, (90, 28, 28, 1)).astype("uint8")
    near = {"dim": rng.integers(60, 100, (10, 28, 28, 1)).astype("uint8")}
    far = {"bright": rng.integers(200, 256, (10, 28, 28, 1)).astype("uint8")}
    rows = study.measure(model, inside[:60], np.arange(60) % 10, inside[60:80], inside[80:], near, far)
    assert [(r["method"], r["blocks"]) for r in rows] == list(study.VARIANTS)
    for row in rows:
        assert set(row["sets"]) == {"dim", "bright"} and row["sets"]["bright"]["kind"] == "far"
        assert all(0 <= row[k] <= 1 for k in ("near_auroc", "near_fpr95", "far_auroc", "far_fpr95", "false_alarm"))
        assert 0 <= row["rocket_percentile"] <= 100 and isinstance(row["rocket_flagged"], bool)
    default = next(r for r in rows if (r["method"], r["blocks"]) == (ood.DEFAULT_METHOD, ood.DEFAULT_BLOCKS))
    assert default["far_auroc"] == 1.0 and default["far_fpr95"] == 0.0 and default["sets"]["bright"]["flagged"] == 1.0


def committed():
    with open(RESULT) as f:
        return json.load(f)


def test_the_docs_show_the_committed_run_and_its_choice_is_the_librarys_default():
    result = committed()
    with open(PAGE) as f:
        page = f.read()
    assert study.table(result) in page
    top = study.best(result["shipped"]["rows"])
    assert (top["method"], top["blocks"]) == (ood.DEFAULT_METHOD, ood.DEFAULT_BLOCKS)
    assert {r["method"] for r in result["shipped"]["rows"]} == set(ood.METHODS)
    assert (result["folder"]["classes"] == 8
            and "held-out classes (Shirt, Ankle boot)" in result["folder"]["rows"][0]["sets"])
    assert result["cpu"]["model"] in page


def test_the_shipped_checkpoint_stores_the_default_score_and_flags_the_rocket():
    model = keras.saving.load_model(CKPT, safe_mode=True, compile=False)
    stats = ood.load_for(CKPT, model)
    assert (stats.method, stats.blocks, stats.pooled) == (ood.DEFAULT_METHOD, tuple(range(6)), True)
    assert len(stats.reference) == 5000 and stats.false_alarm == pytest.approx(0.05, abs=0.001)
    verdict = ood.check(model, shifts.rocket(model), stats)
    assert verdict.unusual[0] and verdict.percentile[0] > 95, verdict


@pytest.mark.slow
def test_the_command_line_writes_the_record_and_the_page(tmp_path):
    page = tmp_path / "app.md"
    shutil.copy(PAGE, page)
    cmd = [sys.executable, "-m", "experiments.ood", "--max-images", "120", "--test-images", "300",
           "--folder-per-class", "20", "--folder-epochs", "1", "--out", str(tmp_path / "ood.json"), "--docs", str(page)]
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "KERAS_VIT_CACHE": str(tmp_path / "cache")}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "ood.json").read_text())
    assert [(r["method"], r["blocks"]) for r in result["folder"]["rows"]] == list(study.VARIANTS)
    assert result["folder"]["classes"] == 8 and result["folder"]["epochs"] == 1
    text = page.read_text()
    assert study.table(result) in text and text.count(study.BEGIN) == 1 and study.table(result) in run.stdout
    with pytest.raises(SystemExit):
        study.main(["--max-images", "0"])


def test_the_sample_size_study_draws_balanced_disjoint_sets_and_its_minimums_are_the_training_ones():
    from experiments.ood import sample_size
    from training import ood_stats

    labels = np.repeat(np.arange(4), 30)
    rng = np.random.default_rng(0)
    fit = sample_size.balanced(labels, 10, rng)
    held = sample_size.balanced(labels, 20, rng, exclude=fit)
    assert sorted(np.bincount(labels[fit]).tolist()) == [2, 2, 3, 3] and np.bincount(labels[held]).tolist() == [5] * 4
    assert not set(fit) & set(held) and len(set(fit)) == 10
    # The committed run: the docs' table is what it renders, and the training minimums are what it shows.
    with open(os.path.join(ROOT, "experiments", "results", "ood_sample_size.json")) as f:
        result = json.load(f)
    with open(PAGE) as f:
        page = f.read()
    assert sample_size.table(result) in page
    assert sample_size.minimums(result["rows"]) == (ood_stats.MIN_FIT_IMAGES, ood_stats.MIN_HELD_OUT_IMAGES)
    rows = [dict(r) for r in result["rows"]]
    for r in rows:  # a threshold that misses the aim at every size has no minimum
        r["false_alarm_hi"] = 0.5
    with pytest.raises(ValueError):
        sample_size.minimums(rows)

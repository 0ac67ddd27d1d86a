"""experiments.ood.far_shift: its rules on made-up scores, its pseudo-outliers, and the committed run
against docs/app.md."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from experiments.ood import far_shift
from tests import ROOT

pytestmark = pytest.mark.one_backend  # NumPy and the committed record only


def test_a_rule_takes_the_larger_percentile_among_held_out_images():
    held = np.arange(100.0)
    x = {"on": np.array([50.0, 99.5]), "off": np.array([97.0, 0.0])}
    score = {"a": {"held": {"on": held, "off": held}, "x": x}}
    both = far_shift.rule_scores(score, [("a", "on"), ("a", "off")], ["x"])["x"]
    assert both.tolist() == [0.97, 1.0]  # the "off" percentile of the first, the "on" one of the second
    assert far_shift.rule_scores(score, [("a", "on")], ["x"])["x"].tolist() == [0.5, 1.0]


def test_pseudo_outliers_change_each_training_image_once():
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (28, 28)).astype("uint8")) for _ in range(40)]
    out = far_shift.pseudo_outliers(images, np.random.default_rng(1))
    assert len(out) == 40 and all(o.shape == (28, 28) and o.dtype == np.uint8 for o in out)
    changed = [not np.array_equal(o, np.asarray(i)) for o, i in zip(out, images)]
    assert all(changed)
    shuffled = [o for o, i in zip(out, images) if sorted(o.ravel()) == sorted(np.asarray(i).ravel())]
    assert shuffled  # the re-textured ones keep every pixel value, in other places


def test_the_committed_run_is_the_docs_table():
    with open(os.path.join(ROOT, "experiments", "results", "ood_far_shift.json")) as f:
        result = json.load(f)
    page = open(os.path.join(ROOT, "docs", "app.md")).read()
    assert far_shift.table(result) in page
    rules = {r["rule"]: r for r in result["rows"]}
    assert list(rules) == list(far_shift.RULES)
    assert rules["Mahalanobis, on or off"]["far_auroc"] > rules["Mahalanobis, on (the demo today)"]["far_auroc"]

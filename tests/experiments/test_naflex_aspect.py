"""experiments.naflex_aspect and its dataset: the canvases, the committed run against
docs/naflex.md, and the study's command on a short run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tests import ROOT

from experiments import naflex_aspect as study
from training import datasets
from training.datasets import aspect

pytestmark = pytest.mark.one_backend  # tf.data and the study's own processes: the same on every backend


def test_the_docs_tables_are_the_committed_run():
    result = json.loads((ROOT / "experiments" / "results" / "naflex_aspect.json").read_text())
    assert study.tables(result) in (ROOT / "docs" / "naflex.md").read_text()
    assert set(result["ways"]) == set(study.WAYS) and result["ways"]["buckets"]["distinct_shapes"] == 5


def test_each_garment_lies_unresized_on_a_canvas_from_1_3_to_3_1_drawn_the_same_every_time():
    canvases, info = datasets.load(aspect.NAME, "test[:64]")
    garments, _ = datasets.load("fashion_mnist", "test[:64]")
    first = list(canvases.as_numpy_iterator())
    again = list(datasets.load(aspect.NAME, "test[:64]")[0].as_numpy_iterator())
    assert info.num_classes == 10 and info.num_channels == 1
    wide = 0
    for (canvas, label), (same, _), (garment, garment_label) in zip(first, again, garments.as_numpy_iterator()):
        h, w, c = canvas.shape
        assert c == 1 and min(h, w) == 28 and 28 <= max(h, w) <= 84 and label == garment_label
        np.testing.assert_array_equal(canvas, same)
        assert int(canvas.sum()) == int(garment.sum())  # the garment whole, the rest black
        wide += w > h
    assert 10 < wide < 54  # tall and wide canvases alike
    with pytest.raises(ValueError, match="no split 'validation'"):
        datasets.load(aspect.NAME, "validation")


@pytest.mark.slow  # four small models, a few steps each, through the study's command
def test_the_study_runs_its_command_and_writes_its_tables(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"before\n{study.MARKERS[0]}\nTABLE-BEFORE-THE-RUN\n{study.MARKERS[1]}\nafter\n")
    out = tmp_path / "aspect.json"
    done = subprocess.run([sys.executable, "-m", "experiments.naflex_aspect", "--steps", "4", "--images", "512",
                           "--out", str(out), "--docs", str(page)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["images"] == 512 and set(result["budgets"]) == {"naflex", "resize"}
    assert [result["ways"][w]["distinct_shapes"] for w in ("resize", "pad", "naflex")] == [1, 1, 1]
    assert all(0.0 <= r["test_accuracy"] <= 1.0 and r["images_per_s"] > 0 for r in result["ways"].values())
    text = page.read_text()
    assert study.tables(result) in text and "TABLE-BEFORE-THE-RUN" not in text and "--images 512" in text

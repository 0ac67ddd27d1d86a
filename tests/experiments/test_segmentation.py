"""experiments.segmentation: the study's command line on a small run, and the committed run against
docs/backbone.md."""

import json
import subprocess
import sys

import pytest

from tests import ROOT

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once


@pytest.mark.slow  # trains both methods for one epoch through the study's command line
def test_the_segmentation_study_trains_both_methods_and_writes_its_tables(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- segmentation -->\nTABLE-BEFORE-THE-RUN\n<!-- /segmentation -->\nafter\n")
    out = tmp_path / "segmentation.json"
    done = subprocess.run([sys.executable, "-m", "experiments.segmentation", "--train", "64", "--test", "16",
                           "--epochs", "1", "--repeats", "1", "--batch-size", "16", "--out", str(out),
                           "--docs", str(page)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    frozen, full = result["methods"]
    assert frozen["trainable"] == (64 + 1) * 5  # the linear head alone: D = 64 of the shipped model, 5 labels
    assert full["trainable"] > 200_000
    assert all(0 <= m[f"miou_{s}"] <= 1 for m in result["methods"] for s in (32, 48))
    assert [r["size"] for r in result["speed"]] == [28, 56, 112]
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "TABLE-BEFORE-THE-RUN" not in text
    assert f"| full fine-tuning | {full['learning_rate']:g} | {full['trainable']:,} | {full['miou_32']:.3f} |" in text


def test_the_docs_segmentation_tables_are_the_committed_run():
    from experiments import segmentation

    result = json.loads((ROOT / "experiments" / "results" / "segmentation.json").read_text())
    assert segmentation.table(result) in (ROOT / "docs" / "backbone.md").read_text()

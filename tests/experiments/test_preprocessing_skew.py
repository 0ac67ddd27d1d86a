"""experiments.preprocessing_skew: its command on a small run, and the committed runs against
docs/preprocessing.md (before the preprocessing record and after it)."""

import json
import subprocess
import sys

import pytest
from tests import ROOT

from experiments import preprocessing_skew as study

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once


def test_the_docs_tables_are_the_committed_runs_and_after_them_the_paths_agree():
    page = (ROOT / "docs" / "preprocessing.md").read_text()
    runs = {}
    for name in ("preprocessing_skew-before", "preprocessing_skew"):
        runs[name] = json.loads((ROOT / "experiments" / "results" / f"{name}.json").read_text())
        assert study.table(runs[name]) in page
    after = [*runs["preprocessing_skew"]["shipped"].values(), runs["preprocessing_skew"]["folder"]["figures"]]
    assert all(r["identical_inputs"] == 1.0 and r["top_class_differs"] == 0.0 for r in after)
    assert all(r["accuracy_training_path"] == r["accuracy_demo_path"] for r in after)


@pytest.mark.slow  # trains the folder model for one epoch through the training CLI
def test_the_study_runs_its_command_and_writes_its_table(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"before\n{study.BEGIN}\nTABLE-BEFORE-THE-RUN\n{study.END}\nafter\n")
    out = tmp_path / "skew.json"
    done = subprocess.run([sys.executable, "-m", "experiments.preprocessing_skew", "--images", "20",
                           "--train-per-class", "4", "--held-per-class", "2", "--epochs", "1", "--out", str(out),
                           "--docs", str(page)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["images"] for r in result["shipped"].values()] == [20] * 4 and result["folder"]["classes"] == 9
    assert all(r["identical_inputs"] == 1.0 for r in [*result["shipped"].values(), result["folder"]["figures"]])
    assert study.table(result) in page.read_text() and "TABLE-BEFORE-THE-RUN" not in page.read_text()

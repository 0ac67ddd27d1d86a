"""Slow end-to-end tests of the training CLI, each in its own process with an explicit backend."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(out, backend, *args):
    """The command line and environment of a short run of the `shapes` recipe."""
    cmd = [sys.executable, "-m", "training.train", "--recipe", "shapes", "--out", str(out), "--verbose", "2", *args]
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return cmd, env


def read_log(out):
    with open(os.path.join(out, "log.csv")) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_short_training_run(tmp_path, backend):
    cmd, env = cli(tmp_path, backend, "--epochs", "3", "--steps-per-epoch", "25", "--dataset", "shapes:800")
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, timeout=900)
    rows = read_log(tmp_path)
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"]) - 0.05  # the loss falls
    with open(tmp_path / "metrics.json") as f:
        metrics = json.load(f)
    assert metrics["backend"] == backend and metrics["test_examples"] == 1000
    assert metrics["test_accuracy"] > 0.3  # better than chance (0.25) after 75 steps
    for name in ("model.keras", "curves.png", "confusion.png", "recipe.json"):
        assert (tmp_path / name).stat().st_size > 0
    with open(tmp_path / "recipe.json") as f:  # --malloc auto restarted the CLI with tcmalloc (.ci/run installs it)
        assert json.load(f)["malloc"] == "tcmalloc"


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_epoch(tmp_path):
    cmd, env = cli(tmp_path, "tensorflow", "--epochs", "4", "--steps-per-epoch", "60", "--dataset", "shapes:800")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    # Wait until two epochs are logged, then kill during the third.
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(tmp_path / "log.csv") and len(read_log(tmp_path)) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stdout.read()[-2000:]
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(read_log(tmp_path))
    assert 2 <= done < 4 and not (tmp_path / "metrics.json").exists()

    result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    epochs = [int(r["epoch"]) for r in read_log(tmp_path)]
    # Resumed: the second process starts at the first unfinished epoch, never at epoch 0 again.
    assert epochs == list(range(4)), epochs
    assert f"Epoch {done + 1}/4" in result.stdout and "Epoch 1/4" not in result.stdout
    assert (tmp_path / "metrics.json").exists()

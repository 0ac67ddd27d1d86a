"""Slow end-to-end tests of the training CLI, each in its own process with an explicit backend."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from tests import ROOT



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


@pytest.mark.slow
def test_lora_fine_tune_through_the_cli(tmp_path):
    """--lora-rank 4 from the shipped Fashion-MNIST model to digits: only the factors and the new head
    train, model.keras keeps the base weights, and lora.safetensors on the base gives model.keras."""
    shipped = os.path.join(ROOT, "checkpoints", "fashion-mnist-vit", "model.keras")
    cmd = [sys.executable, "-m", "training.train", "--recipe", "fine_tune", "--weights", shipped, "--dataset", "digits",
           "--image-size", "28", "--epochs", "2", "--steps-per-epoch", "15", "--batch-size", "64",
           "--learning-rate", "0.1", "--lora-rank", "4", "--out", str(tmp_path), "--verbose", "0"]
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(tmp_path / "metrics.json") as f:
        metrics = json.load(f)
    # Counted from the shipped config: rank 4 on query and value of 6 blocks at D=64, 4 heads of 16.
    # Keras' EinsumDense LoRA keeps the kernel's (64, 4, 16) leading axes in A (64, 4, 4) and gives B
    # (4, 16); plus the new head (64 x 10 + 10).
    factors = 6 * 2 * (64 * 4 * 4 + 4 * 16)
    assert metrics["lora_rank"] == 4 and metrics["trainable_parameters"] == factors + 64 * 10 + 10
    assert metrics["step_seconds"] > 0 and metrics["test_examples"] == 500
    assert metrics["test_accuracy"] > 0.3  # chance is 0.1

    script = f"""
import keras, numpy as np
import keras_vit  # registers ViT for load_model
base = keras.saving.load_model({shipped!r}, safe_mode=True, compile=False)
tuned = keras.saving.load_model({str(tmp_path / "model.keras")!r}, safe_mode=True, compile=False)
# model.keras holds W + (alpha / r) A B in query and value: every other weight but the head's is the base's.
frozen = {{v.path: np.asarray(v) for v in base.weights
          if "head" not in v.path and not any(f"/{{n}}/kernel" in v.path for n in ("query", "value"))}}
kept = {{v.path: np.asarray(v) for v in tuned.weights if v.path in frozen}}
assert kept.keys() == frozen.keys() and len(frozen) > 50
assert all(np.array_equal(kept[k], frozen[k]) for k in frozen), "a frozen weight changed"
adapted = keras.saving.load_model({shipped!r}, safe_mode=True, compile=False)
adapted.enable_lora(4)
adapted.load_lora_weights({str(tmp_path / "lora.safetensors")!r})
x = np.random.default_rng(0).normal(size=(4, 28, 28, 1)).astype("float32")
np.testing.assert_allclose(np.asarray(adapted(x)), np.asarray(tuned(x)), atol=1e-5)
print("ok")
"""
    check = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    assert check.returncode == 0 and check.stdout.strip().endswith("ok"), check.stderr[-3000:]

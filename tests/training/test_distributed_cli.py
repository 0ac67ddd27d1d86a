"""`python -m training.train` itself under a JAX distribution on 127.0.0.1: a fresh single-host
model-parallel run, and runs resumed on another topology (2 processes onto 1 process with 2
devices; a 1x2 mesh onto 2x1). Each must exit 0 and leave the files of a finished run:
model.keras that loads, ood.npz and, with a test split, metrics.json."""

import json
import subprocess
import sys

import pytest
from tests import ROOT
from tests.training.test_distribute_equivalence import free_port, worker_env

TRAIN = [sys.executable, "-m", "training.train", "--recipe", "shapes", "--dataset", "shapes:1024",
         "--image-size", "32", "--val-split", "none", "--test-split", "test", "--verbose", "0"]
pytestmark = pytest.mark.slow


def train(out, *argv, processes=1, devices=None, timeout=600):
    """Runs the CLI in `processes` processes (on a coordinator at 127.0.0.1); returns their
    (exit status, stdout + stderr)."""
    multi = ["--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", str(processes)] if processes > 1 else []
    procs = []
    for i in range(processes):
        ids = ["--process-id", str(i)] if processes > 1 else []
        procs.append(subprocess.Popen([*TRAIN, "--out", str(out), *argv, *multi, *ids], env=worker_env("jax", devices),
                                      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        return [(p.wait(timeout=timeout), p.stdout.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def check_finished(out, epochs):
    """The files of a finished run: a model.keras that loads, ood.npz, metrics.json and the log."""
    import keras

    keras.saving.load_model(out / "model.keras", safe_mode=True)
    assert (out / "ood.npz").stat().st_size > 0
    with open(out / "metrics.json") as f:
        assert 0 <= json.load(f)["test_accuracy"] <= 1
    assert len((out / "log.csv").read_text().splitlines()) == 1 + epochs


def test_a_fresh_single_host_model_parallel_run_finishes(tmp_path):
    """Once aborted by XLA after model.keras ("Termination timeout for all gather"): the
    out-of-domain statistics ran op by op on the sharded model."""
    out = tmp_path / "run"
    [(status, log)] = train(out, "--epochs", "1", "--distribution", "model_parallel", "--mesh", "1x2", devices=2)
    assert status == 0, log[-3000:]
    assert "Traceback" not in log and "test accuracy" in log, log[-3000:]
    check_finished(out, 1)


@pytest.mark.parametrize("case", ["2 processes onto 1 process x 2 devices", "mesh 1x2 onto 2x1"])
def test_the_cli_resumes_an_orbax_run_on_another_topology(tmp_path, case):
    out = tmp_path / "run"
    first = ["--epochs", "1", "--distribution", "model_parallel", "--mesh", "1x2", "--checkpoint-format", "orbax"]
    if case.startswith("2 processes"):
        results = train(out, *first, processes=2)
    else:
        results = train(out, *first, devices=2)
    assert all(status == 0 for status, _ in results), "\n".join(log[-2000:] for _, log in results)
    mesh = "1x2" if case.startswith("2 processes") else "2x1"
    [(status, log)] = train(out, "--epochs", "2", "--distribution", "model_parallel", "--mesh", mesh,
                            "--checkpoint-format", "orbax", devices=2)
    assert status == 0, log[-3000:]
    assert "resuming at epoch 2 of 2" in log and "Traceback" not in log, log[-3000:]
    check_finished(out, 2)
    if case.startswith("2 processes"):  # the run folder itself exports (its best epoch, run/model)
        export = subprocess.run([sys.executable, "-m", "training.export_checkpoint", str(out), "--to",
                                 str(tmp_path / "exported.keras")], env=worker_env("jax"), cwd=ROOT,
                                capture_output=True, text=True, timeout=300)
        assert export.returncode == 0 and f"from {out / 'model'}" in export.stdout, export.stderr[-3000:]
        import keras

        keras.saving.load_model(tmp_path / "exported.keras", safe_mode=True)

"""The training CLIs with the demo install (keras, jax, gradio; no TensorFlow, no torch): --help works,
a missing extra is one line naming the `pip install`, and bad paths are reported before any
deep-learning library loads. The install is simulated by tests/fixtures/hide_modules, which hides
packages from the subprocess as if they were not installed."""

import os
import subprocess
import sys

import pytest

from commands import preflight
from tests import ROOT

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once

HIDE = ROOT / "tests" / "fixtures" / "hide_modules"
DEMO_INSTALL_LACKS = "tensorflow,tensorflow_datasets,tensorboard,torch,torchvision"
CLIS = ("training.train", "training.evaluate", "experiments.data_scale", "training.ood_stats")


def run(tmp_path, *args, hide=DEMO_INSTALL_LACKS, backend=None):
    """Runs `python -m ARGS` with `hide` hidden; returns (process, libraries it loaded)."""
    log = tmp_path / "loaded.txt"
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(PYTHONPATH=os.pathsep.join([str(HIDE), str(ROOT)]), KERAS_VIT_HIDE=hide, KERAS_VIT_IMPORT_LOG=str(log),
               KERAS_HOME=str(tmp_path / "keras-home"))  # no keras.json: Keras's default backend, tensorflow
    if backend:
        env["KERAS_BACKEND"] = backend
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    return proc, log.read_text().split(",") if log.exists() and log.read_text() else []


def test_the_hiding_works(tmp_path):
    assert run(tmp_path, "calendar", "2026", hide="")[0].returncode == 0
    proc, _ = run(tmp_path, "calendar", "2026", hide="calendar")
    assert proc.returncode != 0 and "No module named 'calendar'" in proc.stderr


@pytest.mark.parametrize("module", CLIS)
def test_help_loads_no_deep_learning_library(tmp_path, module):
    # Every such library hidden: --help must not even try one.
    proc, loaded = run(tmp_path, module, "--help", hide="keras,jax,tensorflow,torch,tensorflow_datasets")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
    assert f"usage: python -m {module}" in proc.stdout and loaded == []


@pytest.mark.parametrize("module, args", [
    ("training.train", ["--recipe", "shapes", "--out", "{out}"]),
    ("training.evaluate", ["model.keras", "--dataset", "shapes"]),
    ("training.ood_stats", ["model.keras", "--dataset", "shapes"]),
])
def test_a_missing_extra_is_one_line_naming_the_install(tmp_path, module, args):
    out = tmp_path / "run"
    proc, loaded = run(tmp_path, module, *[a.format(out=out) for a in args])
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr == (f"python -m {module}: error: tensorflow, tensorflow_datasets not installed; run "
                           'pip install -e ".[train]" in the repository\'s root\n')
    assert loaded == [] and not out.exists()


def test_a_missing_backend_names_its_extra(tmp_path):
    proc, _ = run(tmp_path, "experiments.data_scale", "--seeds", "0")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "tensorflow not installed (the Keras backend: install it, or set KERAS_BACKEND" in proc.stderr
    assert 'pip install -e ".[tensorflow]"' in proc.stderr
    proc, _ = run(tmp_path, "experiments.data_scale", "--seeds", "0", backend="torch")
    assert 'torch not installed (the Keras backend' in proc.stderr and 'pip install -e ".[torch]"' in proc.stderr


@pytest.mark.parametrize("module, args, message", [
    ("training.train", ["--weights", "missing.keras", "--out", "{out}"],
     "--weights 'missing.keras': no such file or folder, and not a handle"),
    ("training.train", ["--weights", "hf://org/repo@bad revision", "--out", "{out}"], "is not a valid revision"),
    ("training.train", ["--weights", "vit_base_patch16_224.augreg2_in21k_ft_in1", "--out", "{out}"],
     "catalog names like it: ['vit_base_patch16_224.augreg2_in21k_ft_in1k'"),
    ("training.evaluate", ["missing.npz", "--dataset", "shapes"], "weights 'missing.npz': no such file or folder"),
    ("training.evaluate", ["{garbage}", "--dataset", "shapes"], "is not a .keras file"),
    ("training.evaluate", ["checkpoints/fashion-mnist-vit/model.keras", "--dataset", "folder:/no/such/folder"],
     "--dataset 'folder:/no/such/folder': no such folder"),
])
def test_bad_paths_are_reported_before_any_library_loads(tmp_path, module, args, message):
    garbage = tmp_path / "garbage.keras"
    garbage.write_bytes(b"not a zip archive")
    out = tmp_path / "run"
    proc, loaded = run(tmp_path, module, *[a.format(out=out, garbage=garbage) for a in args], hide="")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"python -m {module}: error:")
    assert loaded == [] and not out.exists()


def test_keras_backend_is_read_as_keras_reads_it(tmp_path):
    assert preflight.keras_backend({"KERAS_BACKEND": "jax"}) == "jax"
    assert preflight.keras_backend({"KERAS_HOME": str(tmp_path)}) == "tensorflow"
    (tmp_path / "keras.json").write_text('{"backend": "torch"}')
    assert preflight.keras_backend({"KERAS_HOME": str(tmp_path)}) == "torch"
    assert preflight.missing(["json", "no_such_module_here"]) == ["no_such_module_here"]


@pytest.mark.parametrize("args, message", [
    (["--lora-rank", "4"], "lora_rank=4 needs --weights: LoRA fine-tunes a trained model"),
    (["--weights", "checkpoints/fashion-mnist-vit/model.keras", "--lora-rank", "0"],
     "lora_rank=0 is not allowed; use a positive integer"),
])
def test_a_bad_lora_rank_is_refused_before_any_library_loads(tmp_path, args, message):
    out = tmp_path / "run"
    proc, loaded = run(tmp_path, "training.train", "--recipe", "fine_tune", *args, "--out", str(out), hide="")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr[-2000:]
    assert loaded == [] and not out.exists()


@pytest.mark.parametrize("module, args, message", [
    ("training.train", ["--recipe", "shapes", "--ood-method", "odin"],
     "Unknown out-of-domain method 'odin'; available: ['msp', 'energy', 'mahalanobis', 'rmds', 'vim', 'knn']"),
    ("training.train", ["--recipe", "shapes", "--ood-method", "vim", "--ood-blocks", "all"],
     "method 'vim' reads the classifier's weights, so it scores the pooled features only"),
    ("training.train", ["--recipe", "shapes", "--ood-blocks", "last"], "blocks 'last' is not allowed; use one of"),
    ("training.ood_stats", ["checkpoints/fashion-mnist-vit/model.keras", "--dataset", "shapes", "--method", "odin"],
     "Unknown out-of-domain method 'odin'"),
])
def test_a_bad_out_of_domain_choice_is_refused_before_any_library_loads(tmp_path, module, args, message):
    out = tmp_path / "run"
    extra = ["--out", str(out)] if module == "training.train" else []
    proc, loaded = run(tmp_path, module, *args, *extra, hide="")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"python -m {module}: error:")
    assert loaded == [] and not out.exists()

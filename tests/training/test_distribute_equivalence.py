"""Distributed training equals one-device training: same seed, same global batch, same steps.

Each path runs `tests/training/distribute_worker.py` in subprocesses with its own environment (backend,
forced host devices), so the pytest process' own backend does not matter. One-device reference
runs are made once per backend. Tolerances: losses and weights to 1e-5.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from tests import ROOT
from tests.conftest import to_numpy

import keras_vit

WORKER = [sys.executable, "-m", "tests.training.distribute_worker"]
TOLERANCE = 1e-5
pytestmark = pytest.mark.slow


def worker_env(backend, devices=None):
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def run_worker(tmp_path, name, backend, *argv, devices=None, timeout=240):
    out = tmp_path / f"{name}.npz"
    cmd = [*WORKER, "--out", str(out), *argv]
    proc = subprocess.run(cmd, env=worker_env(backend, devices), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load(out)


def load(path):
    data = np.load(path, allow_pickle=False)
    weights = {k[2:]: data[k] for k in data.files if k.startswith("w:")}
    return dict(losses=data["losses"], weights=weights, info=json.loads(str(data["info"])))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One-device runs, made at most once per backend."""
    runs = {}

    def get(backend):
        if backend not in runs:
            runs[backend] = run_worker(tmp_path_factory.mktemp("ref"), "ref", backend)
        return runs[backend]

    return get


def assert_same_training(run, ref):
    loss_diff = np.abs(run["losses"] - ref["losses"]).max()
    weight_diff = max(np.abs(run["weights"][k] - ref["weights"][k]).max() for k in ref["weights"])
    print(f"max |loss diff| = {loss_diff:.2e}, max |weight diff| = {weight_diff:.2e}")
    assert run["weights"].keys() == ref["weights"].keys()
    assert loss_diff <= TOLERANCE and weight_diff <= TOLERANCE, (loss_diff, weight_diff)
    # The steps really moved the weights, so equal weights are not just equal initial values.
    assert ref["info"]["moved"] > 100 * TOLERANCE and run["info"]["moved"] > 100 * TOLERANCE


def test_tf_mirrored_on_two_logical_cpus_matches_one_device(tmp_path, reference):
    run = run_worker(tmp_path, "mirrored", "tensorflow", "--distribution", "mirrored", "--devices", "CPU:0,CPU:1")
    assert run["info"]["num_replicas"] == 2
    assert_same_training(run, reference("tensorflow"))


def test_jax_data_parallel_on_eight_devices_matches_one_device(tmp_path, reference):
    run = run_worker(tmp_path, "dp", "jax", "--distribution", "data_parallel", devices=8)
    assert run["info"]["num_replicas"] == 8
    assert_same_training(run, reference("jax"))


def test_jax_model_parallel_shards_blocks_matches_one_device_and_restores_on_one(tmp_path, reference):
    checkpoint = tmp_path / "mp.weights.h5"
    argv = ("--distribution", "model_parallel", "--mesh", "2x4", "--checkpoint", str(checkpoint))
    run = run_worker(tmp_path, "mp", "jax", *argv, devices=8)
    assert run["info"]["num_replicas"] == 2
    sharding = run["info"]["sharding"]
    block = "vit/encoder/block_1/"
    # Per-device shards: heads 4 -> 1 and MLP width 96 -> 24 on each of the 4 model-axis devices.
    assert sharding[block + "attn/query/kernel"] == ["P(None, 'model', None)", [48, 1, 12]]
    assert sharding[block + "attn/value/kernel"][1] == [48, 1, 12]
    assert sharding[block + "attn/attention_output/kernel"][1] == [1, 12, 48]
    assert sharding[block + "fc1/kernel"][1] == [48, 24]
    assert sharding[block + "fc2/kernel"][1] == [24, 48]
    assert sharding["vit/position_embedding/embedding"][1] == [1, 65, 48]  # replicated
    momentum = [v for k, v in sharding.items() if "block_1_fc1_kernel" in k]
    assert momentum and all(v[1] == [48, 24] for v in momentum)  # optimizer state sharded alike
    assert_same_training(run, reference("jax"))

    # A checkpoint written on 8 devices loads into a one-device model in this process.
    model = keras_vit.ViT(image_size=32, patch_size=4, hidden_dim=48, num_layers=2, num_heads=4, mlp_dim=96,
                          num_classes=5)
    model.load_weights(checkpoint)
    for v in model.weights:
        np.testing.assert_array_equal(to_numpy(v.value), run["weights"][v.path])


def run_processes(cmds, tmp_path, timeout):
    """Runs the JAX processes of one job together and asserts that all of them exit 0; kills the
    rest on failure. Logs go to files: a full pipe of one process would stall all in a collective."""
    procs = []
    try:
        for i, cmd in enumerate(cmds):
            with open(tmp_path / f"process{i}.log", "w") as log:
                procs.append(subprocess.Popen(cmd, env=worker_env("jax"), cwd=ROOT, stdout=log, stderr=log))
        for p in procs:
            p.wait(timeout=timeout)
        logs = [(tmp_path / f"process{i}.log").read_text()[-3000:] for i in range(len(cmds))]
        assert [p.returncode for p in procs] == [0] * len(cmds), "\n".join(logs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", [("data_parallel",), ("model_parallel", "--mesh", "1x2")], ids=lambda m: m[0])
def test_jax_two_processes_on_localhost_match_one_device(tmp_path, reference, mode):
    """data_parallel: each process feeds half of every batch. model_parallel 1x2: the model axis
    spans the two processes, so both feed the whole batch and each holds half of every block."""
    coordinator = f"127.0.0.1:{free_port()}"
    checkpoint = tmp_path / "mh.weights.h5"
    cmds = []
    for i in range(2):
        argv = ["--distribution", *mode, "--coordinator", coordinator, "--num-processes", "2"]
        argv += ["--process-id", str(i), "--out", str(tmp_path / f"mh{i}.npz"), "--checkpoint", str(checkpoint)]
        cmds.append([*WORKER, *argv])
    run_processes(cmds, tmp_path, timeout=420)
    assert not (tmp_path / "mh1.npz").exists()  # only the chief writes
    run = load(tmp_path / "mh0.npz")
    assert (run["info"]["num_processes"], run["info"]["num_replicas"]) == (2, 2 if mode[0] == "data_parallel" else 1)
    if mode[0] == "model_parallel":
        spec, shard = run["info"]["sharding"]["vit/encoder/block_0/fc1/kernel"]
        assert "model" in spec and tuple(shard) == (48, 48), (spec, shard)  # fc1 (48, 96) split by columns
    assert_same_training(run, reference("jax"))
    # The chief's checkpoint holds the whole model, gathered from both processes under
    # model_parallel (keras_vit.distribution.host_copy), and loads on one device.
    model = keras_vit.ViT(image_size=32, patch_size=4, hidden_dim=48, num_layers=2, num_heads=4, mlp_dim=96,
                          num_classes=5)
    model.load_weights(checkpoint)
    for w in model.weights:
        np.testing.assert_array_equal(to_numpy(w.value), run["weights"][w.path], err_msg=w.path)


def test_tpu_without_hardware_fails_with_a_clear_message():
    code = (
        "import argparse\nfrom training import distribute\n"
        "p = argparse.ArgumentParser(); distribute.add_arguments(p)\n"
        "try:\n    distribute.from_args(p.parse_args(['--distribution', 'tpu', '--tpu', 'local']))\n"
        "except ValueError as e:\n"
        "    print('ERROR', e, '| chained:', e.__cause__ is not None or not e.__suppress_context__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=worker_env("tensorflow"), capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert "ERROR --tpu='local': no TPU could be reached" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "Cloud TPU VM" in proc.stdout and "| chained: False" in proc.stdout


def test_training_cli_runs_data_parallel_on_eight_devices(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "training.train", "--recipe", "shapes", "--dataset", "shapes:256", "--epochs", "1",
           "--steps-per-epoch", "2", "--out", str(out), "--verbose", "2", "--distribution", "data_parallel"]
    proc = subprocess.run(cmd, env=worker_env("jax", devices=8), cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (out / "model.keras").exists() and (out / "metrics.json").exists()


@pytest.mark.parametrize("mode", [("data_parallel",), ("model_parallel", "--mesh", "1x2")], ids=lambda m: m[0])
def test_training_cli_on_two_processes_writes_one_checkpoint_that_loads_on_one_device(tmp_path, mode):
    """The CLI under multi-host JAX: 2 processes of one CPU device each, the same command with
    --process-id 0 and 1. Only the chief writes into --out; its `.keras` loads on one device and
    gives the accuracy the chief recorded. Under model_parallel 1x2 every block is split between
    the two processes, so each checkpoint is gathered from both; the run is then resumed for a
    third epoch from its backup, which loads the gathered weights back into the split model."""
    out = tmp_path / "run"

    def train(epochs):
        coordinator = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "training.train", "--recipe", "shapes", "--dataset", "shapes:256",
               "--epochs", str(epochs), "--steps-per-epoch", "3", "--batch-size", "16", "--out", str(out),
               "--verbose", "2", "--distribution", *mode, "--coordinator", coordinator, "--num-processes", "2"]
        run_processes([cmd + ["--process-id", str(i)] for i in range(2)], tmp_path, timeout=480)

    train(2)
    written = sorted(p.name for p in out.iterdir())
    for name in ("model.keras", "metrics.json", "log.csv", "recipe.json", "curves.png", "confusion.png"):
        assert name in written, written
    assert len((out / "log.csv").read_text().strip().splitlines()) == 3  # header + 2 epochs, chief only
    metrics = json.loads((out / "metrics.json").read_text())
    # Restores on another topology: this pytest process, one device.
    script = (
        "import json, sys, keras, numpy as np, keras_vit\n"
        "from training import datasets\n"
        "m = keras.saving.load_model(sys.argv[1], safe_mode=True)\n"
        "ds, info = datasets.load('shapes:256', 'test', None, None, 0)\n"
        "ds = datasets.pipeline(ds, info, m.preprocessing, 50, False)\n"
        "hits = n = 0\n"
        "for x, y in ds.as_numpy_iterator():\n"
        "    p = keras.ops.convert_to_numpy(m.predict(x, verbose=0)).argmax(-1)\n"
        "    hits += int((p == y.argmax(-1)).sum()); n += len(y)\n"
        "print(json.dumps({'accuracy': hits / n, 'n': n, 'devices': len(__import__('jax').devices())}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(out / "model.keras")], env=worker_env("jax"), cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = json.loads(proc.stdout.strip().splitlines()[-1])
    assert single["devices"] == 1 and single["n"] == metrics["test_examples"]
    assert single["accuracy"] == pytest.approx(metrics["test_accuracy"], abs=1e-6)
    if mode[0] == "model_parallel":
        train(3)  # the same command with one more epoch: resumes at epoch 3, does not restart
        epochs = [line.split(",")[0] for line in (out / "log.csv").read_text().strip().splitlines()[1:]]
        assert epochs == ["0", "1", "2"], epochs

"""Faults injected into `python -m training.train --checkpoint-format orbax` end to end: a kill -9
of one of two processes in the middle of a save, a full disk, a damaged chunk in the newest step,
a coordinator port already taken, and `--overwrite` between formats. Each stops in one line (or
is resumed) without losing the last committed checkpoint; docs/distributed.md tabulates them."""

import os
import shutil
import socket
import subprocess
import sys

import pytest
from tests import ROOT
from tests.training.test_distribute_equivalence import free_port, worker_env

TRAIN = [sys.executable, "-m", "training.train", "--recipe", "shapes", "--dataset", "shapes:256", "--image-size", "32",
         "--val-split", "none", "--test-split", "none", "--verbose", "0"]
# The real CLI, with process KILL_PROCESS killed by SIGKILL as soon as its backup save of epoch
# KILL_EPOCH (from 0) has started in the background.
KILL_DURING_SAVE = """
import os, runpy, signal, sys
import jax
from training import checkpointing
start_save = checkpointing.OrbaxBackup.on_epoch_end
def on_epoch_end(self, epoch, logs=None):
    start_save(self, epoch, logs)
    if epoch == int(os.environ["KILL_EPOCH"]) and jax.process_index() == int(os.environ["KILL_PROCESS"]):
        os.kill(os.getpid(), signal.SIGKILL)
checkpointing.OrbaxBackup.on_epoch_end = on_epoch_end
sys.argv = ["training.train", *sys.argv[1:]]
runpy.run_module("training.train", run_name="__main__", alter_sys=True)
"""
pytestmark = pytest.mark.slow


def train(out, *argv, devices=None, timeout=600):
    """(exit status, the output less the libraries' start-up lines) of one CLI run."""
    proc = subprocess.run([*TRAIN, "--out", str(out), *argv], env=worker_env("jax", devices), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, lines(proc.stdout + proc.stderr)


def lines(text):
    return "\n".join(line for line in text.splitlines() if not line.startswith(("I0000", "WARNING: All log")))


def steps(folder):
    return sorted(os.listdir(folder))


def rows(out):
    return len((out / "log.csv").read_text().splitlines()) - 1


def test_a_kill_of_one_process_during_a_save_loses_only_that_save(tmp_path):
    out = tmp_path / "run"
    argv = ["--out", str(out), "--epochs", "3", "--distribution", "data_parallel", "--checkpoint-format", "orbax",
            "--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", "2"]
    env = {**worker_env("jax"), "KILL_EPOCH": "1", "KILL_PROCESS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", KILL_DURING_SAVE, *TRAIN[3:], *argv, "--process-id", str(i)],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    try:
        assert procs[1].wait(timeout=600) == -9, lines(procs[1].stdout.read())[-3000:]
        try:  # process 0 waits for its peer at the next collective; a cluster's scheduler ends it
            procs[0].wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert "1" not in steps(out / "backup") and "0" in steps(out / "backup"), steps(out / "backup")
    status, log = train(out, "--epochs", "3", "--distribution", "data_parallel", "--checkpoint-format", "orbax",
                        devices=2)
    assert status == 0, log[-3000:]
    assert "resuming at epoch 2 of 3" in log and "Traceback" not in log, log[-3000:]
    assert steps(out / "backup") == ["1", "2"] and rows(out) == 3
    import keras

    keras.saving.load_model(out / "model.keras", safe_mode=True)


FILL_THE_DISK = """set -e
mount -t tmpfs -o size=40m tmpfs "$DISK"
$TRAIN --out "$DISK/run" --epochs 1 > "$LOGS/first.log" 2>&1
avail=$(df -k --output=avail "$DISK" | tail -1)
fallocate -l $(( (avail - 200) * 1024 )) "$DISK/filler"
set +e
$TRAIN --out "$DISK/run" --epochs 2 > "$LOGS/full.log" 2>&1
echo $? > "$LOGS/full.status"
ls -a "$DISK/run/backup" > "$LOGS/after.ls"
rm "$DISK/filler"
$TRAIN --out "$DISK/run" --epochs 2 > "$LOGS/freed.log" 2>&1
echo $? > "$LOGS/freed.status"
ls -a "$DISK/run/backup" > "$LOGS/freed.ls"
"""


def test_a_full_disk_stops_the_run_in_one_line_and_the_same_command_resumes_once_space_is_freed(tmp_path):
    # A 40 MiB tmpfs as --out, in a mount namespace of its own (unshare -rm needs no root).
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("this host allows no mount namespace (unshare -rm), so no small disk can be mounted")
    disk, logs = tmp_path / "disk", tmp_path / "logs"
    disk.mkdir()
    logs.mkdir()
    env = {**worker_env("jax"), "DISK": str(disk), "LOGS": str(logs),
           "TRAIN": " ".join([*TRAIN, "--checkpoint-format", "orbax"])}
    proc = subprocess.run(["unshare", "-rm", "bash", "-c", FILL_THE_DISK], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:] + lines((logs / "first.log").read_text())[-3000:]
    full = lines((logs / "full.log").read_text())
    assert (logs / "full.status").read_text().strip() == "2", full[-3000:]
    assert "Traceback" not in full and "ERROR:" not in full, full[-3000:]
    [error] = [line for line in full.splitlines() if "error:" in line]
    assert f"no space left on the disk mounted at {disk}, while writing {disk}/run/" in error, error
    assert "0" in (logs / "after.ls").read_text().split() and "1" not in (logs / "after.ls").read_text().split()
    freed = lines((logs / "freed.log").read_text())
    assert (logs / "freed.status").read_text().strip() == "0", freed[-3000:]
    assert "resuming at epoch 2 of 2" in freed, freed[-3000:]  # from the step saved before the disk filled
    assert {"0", "1"} <= set((logs / "freed.ls").read_text().split())


def test_a_damaged_newest_step_is_named_and_resuming_from_the_one_before_takes_its_removal(tmp_path):
    """The resume does not fall back to an older step by itself: the newest step is what the run
    last committed, and training on from an older one repeats epochs; the error says how."""
    from training import checkpoint_files

    out = tmp_path / "run"
    orbax = ["--checkpoint-format", "orbax"]
    status, log = train(out, "--epochs", "2", *orbax)
    assert status == 0, log[-3000:]
    chunks = checkpoint_files.chunk_files(str(out / "backup" / "1" / "pytree"))
    path, offset, length = next(chunks[k] for k in sorted(chunks) if k.startswith("trainable_variables."))
    with open(path, "r+b") as f:
        f.seek(offset + length // 2)
        f.write(b"\xff" * min(16, length // 2))
    status, log = train(out, "--epochs", "3", *orbax)
    assert status == 2 and "Traceback" not in log, log[-3000:]
    [error] = [line for line in log.splitlines() if "error:" in line]
    assert f"{path} is damaged, so nothing was restored" in error, error
    assert f"remove {out / 'backup' / '1'} to resume after epoch 1, or start again with --overwrite" in error, error
    shutil.rmtree(out / "backup" / "1")
    status, log = train(out, "--epochs", "3", *orbax)
    assert status == 0 and "resuming at epoch 2 of 3" in log, log[-3000:]
    assert rows(out) == 3 and steps(out / "backup") == ["1", "2"]


def test_a_coordinator_port_already_taken_is_one_line_and_no_hang(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, log = train(tmp_path / "run", "--epochs", "1", "--distribution", "data_parallel", "--coordinator",
                            f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "0", timeout=120)
    assert status == 2 and "Traceback" not in log, log[-3000:]
    [error] = [line for line in log.splitlines() if "error:" in line]
    assert f"port {port} is already in use" in error, error
    assert not (tmp_path / "run").exists()


def test_overwrite_between_formats_leaves_no_stale_steps(tmp_path):
    out = tmp_path / "run"
    for fmt, extra in (("orbax", []), ("keras", ["--overwrite"]), ("orbax", ["--overwrite"])):
        status, log = train(out, "--epochs", "1", "--checkpoint-format", fmt, *extra)
        assert status == 0 and "Traceback" not in log, log[-3000:]
        if fmt == "keras":  # the Orbax run's shards are gone, the Keras backup is the only one
            assert not (out / "model").exists() and not any(name.isdigit() for name in steps(out / "backup"))
    assert steps(out / "model") == ["0"] and steps(out / "backup") == ["0"] and rows(out) == 1
    import json

    assert json.loads((out / "recipe.json").read_text())["checkpoint_format"] == "orbax"

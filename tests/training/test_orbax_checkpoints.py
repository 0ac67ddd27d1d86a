"""Sharded, asynchronous Orbax checkpoints of `training.checkpointing`, across JAX processes.

Two source runs of tests/training/orbax_worker.py are killed while the backup of their second epoch is
being written in the background: 2 processes on 127.0.0.1 with a 1x2 mesh, and 1 process with
8 forced host devices on a 2x4 mesh. Each trained its second epoch in full before the kill, so
its record of that epoch is the uninterrupted run. Resumes on other topologies must restore the
first epoch's state exactly (relative 1e-6) and train the second epoch to the same losses and
weights (1e-5, the tolerance of docs/distributed.md). The sources' checkpoints then go through
`training.export_checkpoint` and are damaged on purpose.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from tests import ROOT
from tests.conftest import images, to_numpy
from tests.training.test_distribute_equivalence import free_port, worker_env

import keras
import keras_vit

WORKER = [sys.executable, "-m", "tests.training.orbax_worker"]
TOLERANCE = 1e-5  # docs/distributed.md
pytestmark = pytest.mark.slow


def start(folder, argv, processes=1, devices=None):
    """Starts the processes of one worker job (all with `argv`); logs go to files in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    multi = ["--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", str(processes)] if processes > 1 else []
    procs = []
    for i in range(processes):
        ids = ["--process-id", str(i)] if processes > 1 else []
        with open(folder / f"process{i}.log", "w") as log:
            cmd = [*WORKER, "--out", str(folder / "out"), *argv, *multi, *ids]
            procs.append(subprocess.Popen(cmd, env=worker_env("jax", devices), cwd=ROOT, stdout=log, stderr=log))
    return folder, procs


def finish(jobs, timeout=480):
    """Waits for every job; returns {folder name: exit statuses}. Kills all on a timeout."""
    try:
        return {folder.name: [p.wait(timeout=timeout) for p in procs] for folder, procs in jobs}
    finally:
        for _, procs in jobs:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def logs(folder):
    return "\n".join(p.read_text()[-2500:] for p in sorted(folder.glob("process*.log")))


def record(folder, name):
    data = np.load(folder / "out" / name, allow_pickle=False)
    return {k[2:]: data[k] for k in data.files if k.startswith("v:")}, dict(data)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("orbax_sources")
    jobs = [start(root / "mesh1x2", ["--distribution", "model_parallel", "--mesh", "1x2", "--backup",
                                     str(root / "mesh1x2" / "backup"), "--kill-in-save", "1"], processes=2),
            start(root / "devices8", ["--distribution", "model_parallel", "--mesh", "2x4", "--backup",
                                      str(root / "devices8" / "backup"), "--kill-in-save", "1"], devices=8)]
    codes = finish(jobs)
    for folder, _ in jobs:
        assert (folder / "out" / "killed.json").exists(), (f"{folder.name} was not killed in its save: {codes}\n"
                                                           + logs(folder))
    assert all(c != 0 for c in sum(codes.values(), [])), codes  # SIGKILLed, or lost their peer
    return root


def test_a_save_cut_short_by_a_kill_is_never_restored(sources):
    from training import checkpointing

    for name in ("mesh1x2", "devices8"):
        killed = json.loads((sources / name / "out" / "killed.json").read_text())
        backup = sources / name / "backup"
        # At the kill, epoch 1's save had started (its temporary folder) and was not committed.
        assert killed["epoch"] == 1 and "0" in killed["backup"] and "1" not in killed["backup"], killed
        assert any(n.startswith("1.orbax-checkpoint-tmp") for n in killed["backup"]), killed
        assert sorted(os.listdir(backup)) == ["0", "1.orbax-checkpoint-tmp"], os.listdir(backup)
        assert checkpointing.latest_step(str(backup)) == str(backup / "0")


RESUMES = {  # name: (source, argv, processes, forced devices)
    "2 processes 1x2 -> 1 process 2 devices": ("mesh1x2", ["--mesh", "1x2"], 1, 2),
    "1x2 -> 2x1": ("mesh1x2", ["--mesh", "2x1"], 2, None),
    "8 devices 2x4 -> 2 processes 1x2": ("devices8", ["--mesh", "1x2"], 2, None),
}


@pytest.fixture(scope="module")
def resumed(sources, tmp_path_factory):
    """Each resume of RESUMES, from its own copy of the source's backup, all at once."""
    root = tmp_path_factory.mktemp("orbax_resumed")
    jobs = []
    for i, (source, argv, processes, devices) in enumerate(RESUMES.values()):
        backup = root / f"resume{i}" / "backup"
        shutil.copytree(sources / source / "backup", backup)
        jobs.append(start(root / f"resume{i}", ["--distribution", "model_parallel", *argv, "--backup", str(backup)],
                          processes, devices))
    codes = finish(jobs)
    for folder, _ in jobs:
        assert codes[folder.name] == [0] * len(codes[folder.name]), logs(folder)
    return root


@pytest.mark.parametrize("case", list(RESUMES))
def test_a_resume_on_another_topology_restores_the_state_and_trains_on_equally(sources, resumed, case):
    source, _, processes, devices = RESUMES[case]
    folder = resumed / f"resume{list(RESUMES).index(case)}"
    info = json.loads((folder / "out" / "run.json").read_text())
    assert (info["num_processes"], info["devices"], info["initial_epoch"]) == (processes, 2, 1), info
    saved, _ = record(sources / source, "epoch_0.npz")
    restored, meta = record(folder, "restored.npz")
    assert int(meta["epoch"]) == 1 and restored.keys() == saved.keys()
    assert any("momentum" in k for k in saved) and any("iteration" in k for k in saved)  # the optimizer too
    for path, value in saved.items():
        np.testing.assert_allclose(restored[path], value, rtol=1e-6, atol=0, err_msg=path)
    # The second epoch: the same losses and weights as the source's uninterrupted one.
    (reference, ref_meta), (run, run_meta) = record(sources / source, "epoch_1.npz"), record(folder, "epoch_1.npz")
    loss_diff = np.abs(run_meta["losses"] - ref_meta["losses"]).max()
    weights = [k for k in reference if k.startswith("vit/")]
    weight_diff = max(np.abs(run[k] - reference[k]).max() for k in weights)
    moved = max(np.abs(reference[k] - saved[k]).max() for k in weights)
    print(f"{case}: max |loss diff| {loss_diff:.1e}, max |weight diff| {weight_diff:.1e}")
    assert (loss_diff <= TOLERANCE and weight_diff <= TOLERANCE
            and moved > 100 * TOLERANCE), (loss_diff, weight_diff, moved)


# One process runs the export CLI's main() on each case and records its exit status and stderr.


def damaged_copies(backup, folder):
    """Two copies of a 2-process Orbax backup: one lacking a data file written by process 1, and
    one with bytes overwritten inside a weight's chunk in such a file. Returns {how: (copy, file)}."""
    from training import checkpoint_files

    cases = {}
    for how in ("missing", "corrupt"):
        copy = folder / how
        shutil.copytree(backup, copy)
        chunks = checkpoint_files.chunk_files(str(copy / "0" / "pytree"))
        key = next(k for k, (path, _, _) in sorted(chunks.items())
                   if k.startswith("trainable_variables.") and "ocdbt.process_1" in path)
        path, offset, length = chunks[key]
        if how == "missing":
            os.remove(path)
        else:
            with open(path, "r+b") as f:
                f.seek(offset + length // 2)
                f.write(b"\xff" * min(16, length // 2))
        cases[how] = (copy, path)
    return cases


def test_export_writes_one_file_refuses_what_does_not_fit_and_names_a_damaged_file(sources, tmp_path):
    backup = sources / "mesh1x2" / "backup"
    damaged = damaged_copies(backup, tmp_path)
    argvs = [[str(backup), "--to", str(tmp_path / "model.keras")],
             [str(backup), "--to", str(tmp_path / "model.safetensors")],
             [str(backup), "--to", str(tmp_path / "refused.keras"), "--max-memory", "0.0001"],
             [str(damaged["missing"][0]), "--to", str(tmp_path / "missing.keras")],
             [str(damaged["corrupt"][0]), "--to", str(tmp_path / "corrupt.keras")]]
    results = []
    for argv in argvs:  # one command per process, as a user runs it
        proc = subprocess.run([sys.executable, "-m", "training.export_checkpoint", *argv], env=worker_env("jax"),
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        # The tool's own lines (the libraries' start-up notes, if any, are not its output).
        results.append([proc.returncode, "".join(line + "\n" for line in proc.stderr.splitlines()
                                                  if line.startswith("python -m training.export_checkpoint"))])
    (keras_code, _), (st_code, _), refused, missing, corrupt = results
    assert keras_code == 0 and st_code == 0
    # The single files hold the first epoch's weights, gathered from both processes' shards.
    saved, _ = record(sources / "mesh1x2", "epoch_0.npz")
    model = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    for w in model.weights:
        np.testing.assert_array_equal(to_numpy(w.value), saved[w.path], err_msg=w.path)
    timm_layout = keras_vit.load(str(tmp_path / "model.safetensors"))
    x = images((2, 32, 32, 3))
    np.testing.assert_allclose(to_numpy(timm_layout(x)), to_numpy(model(x)), atol=1e-5)
    # What cannot be held is refused in one line that gives the size; nothing is written.
    assert refused[0] == 3 and len(refused[1].strip().splitlines()) == 1, refused
    assert "needs about" in refused[1] and "GiB" in refused[1] and not (tmp_path / "refused.keras").exists()
    # A missing or damaged data file is named, and nothing is restored or written.
    for (code, err), how, phrase in ((missing, "missing", "is missing"), (corrupt, "corrupt", "is damaged")):
        assert code == 2 and f"{damaged[how][1]} {phrase}" in err and "othing was restored" in err, err
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / f"{how}.keras").exists()

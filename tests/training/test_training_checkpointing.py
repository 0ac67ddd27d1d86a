"""Fast checks of `training.checkpointing` and `training.export_checkpoint` in one process.

The multi-process runs (a kill during a save, resumes on other topologies, the conversion of a
2-process checkpoint, damaged files) are in test_orbax_checkpoints.py (slow)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from tests import ROOT
from tests.conftest import to_numpy

import keras_vit
from training import checkpoint_formats, checkpointing, distribute, export_checkpoint, runs

JAX_ONLY = pytest.mark.skipif(keras.backend.backend() != "jax", reason="Orbax checkpoints hold JAX arrays: the "
                              "orbax format is refused on other backends (test_orbax_is_refused_off_jax)")


def test_the_default_format_is_orbax_for_multi_process_jax_runs_only():
    two_processes = distribute.Distribution("data_parallel", 2, True, 0, 2)
    assert checkpoint_formats.resolve(None, distribute.Distribution()) == "keras"
    expected = "orbax" if keras.backend.backend() == "jax" else "keras"
    assert checkpoint_formats.resolve(None, two_processes) == expected
    assert checkpoint_formats.resolve("keras", two_processes) == "keras"
    with pytest.raises(ValueError, match=r"--checkpoint-format='h5' is not allowed; use one of \('keras', 'orbax'\)"):
        checkpoint_formats.resolve("h5", two_processes)


def test_each_format_owns_its_files_and_a_replaced_run_leaves_none_of_them(tmp_path):
    dist = distribute.Distribution()
    keras_files = checkpoint_formats.for_run("keras", str(tmp_path), dist)
    assert isinstance(keras_files, checkpoint_formats.KerasCheckpoints) and keras_files.name == "keras"
    assert set(checkpoint_formats.OrbaxCheckpoints.files) >= {"model", "backup", "model.keras"}
    for kind in checkpoint_formats.FORMATS.values():
        assert set(kind.files) <= set(runs.RUN_FILES), kind.name
    # An Orbax run's folder replaced by --overwrite: every checkpoint file of either format goes.
    for name in checkpoint_formats.FILES:
        (tmp_path / name).mkdir() if "." not in name else (tmp_path / name).write_text("x")
    (tmp_path / "recipe.json").write_text(json.dumps({"epochs": 1}))
    (tmp_path / "mine.txt").write_text("not the run's")
    plan = runs.plan(str(tmp_path), {"epochs": 1}, overwrite=True)
    runs.commit(plan, {"epochs": 1})
    assert sorted(os.listdir(tmp_path)) == ["mine.txt", "recipe.json"]


def test_the_checkpoints_of_other_processes_go_to_one_folder_that_a_rerun_finds_again(tmp_path):
    out = str(tmp_path / "run")
    chief, other = distribute.Distribution(), distribute.Distribution("data_parallel", 2, False, 1, 2)
    assert chief.checkpoint_dir(out) == out and chief.checkpoint_path(out + "/model.keras") == out + "/model.keras"
    scratch = other.checkpoint_dir(out)
    assert not scratch.startswith(out) and scratch == other.checkpoint_dir(out) and scratch.endswith("_process1")
    assert other.checkpoint_path(os.path.join(out, "backup")) == os.path.join(scratch, "backup")
    assert distribute.Distribution("data_parallel", 2, False, 1, 2).checkpoint_dir(str(tmp_path / "b")) != scratch


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="checks the refusal on the other backends")
def test_orbax_is_refused_off_jax():
    with pytest.raises(ValueError, match="--checkpoint-format=orbax runs on KERAS_BACKEND=jax"):
        checkpoint_formats.resolve("orbax", distribute.Distribution())


@JAX_ONLY
def test_orbax_without_orbax_checkpoint_installed_is_refused_in_one_line(monkeypatch):
    # As if orbax-checkpoint were not installed, also when an earlier test of this process imported it.
    monkeypatch.setitem(sys.modules, "orbax", None)
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)
    with pytest.raises(ValueError, match=r"--checkpoint-format=orbax needs orbax-checkpoint, which is not installed; "
                                         r"run pip install -e \"\.\[train\]\""):
        checkpoint_formats.resolve("orbax", distribute.Distribution())


def test_export_checks_its_arguments_before_importing_keras(tmp_path):
    script = (
        "import sys\nfrom training import export_checkpoint\n"
        "for argv in (['missing', '--to', 'm.keras'], [sys.argv[1], '--to', 'm.h5'], "
        "[sys.argv[1], '--to', 'no/m.keras']):\n"
        "    try:\n        export_checkpoint.main(argv)\n    except SystemExit as e:\n        print('exit', e.code)\n"
        "print('heavy', sorted(m for m in ('keras', 'jax', 'orbax', 'tensorflow') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.split("\n")[:4] == ["exit 2", "exit 2", "exit 2", "heavy []"], proc.stdout + proc.stderr
    errors = proc.stderr.strip().splitlines()
    assert "missing is not a folder" in errors[0] and "--to='m.h5' is not allowed; use a path ending in .keras or " \
        ".safetensors" in errors[1] and "the folder" in errors[2] and "does not exist" in errors[2], errors


def test_export_takes_a_run_folder_and_chooses_its_model_or_backup(tmp_path):
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "backup").mkdir()
    (run / "recipe.json").write_text(json.dumps({"checkpoint_format": "orbax"}))
    assert export_checkpoint.checkpoint_folder(str(run)) == str(run / "model")
    assert export_checkpoint.checkpoint_folder(str(run), backup=True) == str(run / "backup")
    assert export_checkpoint.checkpoint_folder(str(run / "model")) == str(run / "model")  # a checkpoint folder as is
    with pytest.raises(ValueError, match="--backup takes a run folder"):
        export_checkpoint.checkpoint_folder(str(run / "model"), backup=True)
    keras_run = tmp_path / "keras_run"
    keras_run.mkdir()
    (keras_run / "recipe.json").write_text(json.dumps({"checkpoint_format": "keras"}))
    with pytest.raises(ValueError, match="is a run with --checkpoint-format keras: its model.keras is already one"):
        export_checkpoint.checkpoint_folder(str(keras_run))


def small_model(name="vit", num_layers=2):
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=num_layers, num_heads=2, mlp_dim=32,
                          num_classes=3, name=name)
    model.compile(keras.optimizers.AdamW(1e-2, name="adamw"),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@JAX_ONLY
def test_orbax_backup_resumes_whole_and_refuses_another_model_or_a_missing_file(tmp_path, monkeypatch):
    x, y = np.random.default_rng(0).normal(size=(8, 16, 16, 3)).astype("float32"), np.arange(8) % 3
    monkeypatch.chdir(tmp_path)  # a relative folder, as `--out runs/NAME` gives (Orbax itself refuses one)
    first = small_model()
    first.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[checkpointing.OrbaxBackup("b")])
    again = small_model()  # a new process would build the same names; this one reuses them explicitly
    history = again.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[checkpointing.OrbaxBackup("b")])
    assert history.history == {}  # epoch 0 was restored, nothing was left to train
    for a, b in zip(first.variables + first.optimizer.variables, again.variables + again.optimizer.variables):
        np.testing.assert_array_equal(to_numpy(a.value), to_numpy(b.value), err_msg=a.path)
    step = checkpointing.latest_step(str(tmp_path / "b"))
    # Keras' own load_weights would skip every variable of a model named otherwise; restore refuses.
    other = small_model(name="vit_other")
    other.optimizer.build(other.trainable_variables)
    with pytest.raises(checkpointing.CheckpointError, match=r"has no array for \d+ variables of the model, e\.g\. "
                       r"\['trainable_variables/vit_other/"):
        checkpointing.restore(other, step)
    fewer = small_model(num_layers=1)  # every variable is in the checkpoint, but block_1 would be left over
    fewer.optimizer.build(fewer.trainable_variables)
    with pytest.raises(checkpointing.CheckpointError, match=r"holds \d+ arrays that no variable of the model "
                       r"takes, e\.g\. \['[a-z_/]*block_1"):
        checkpointing.restore(fewer, step)
    # Every chunk carries a CRC-32C checksum (Orbax alone writes none), so damage inside a chunk is
    # found; a damaged or missing data file is named, and no variable is assigned.
    import tensorstore as ts

    from training import checkpoint_files

    store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{step}/pytree/"}).result()
    meta = json.loads(store.read(b"trainable_variables.vit.encoder.block_0.fc1.kernel/zarr.json").result().value)
    assert {"name": "crc32c"} in meta["codecs"][0]["configuration"]["codecs"], meta["codecs"]
    chunks = checkpoint_files.chunk_files(os.path.join(step, "pytree"))
    path, offset, length = chunks[next(k for k in sorted(chunks) if k.startswith("trainable_variables."))]
    with open(path, "r+b") as f:
        f.seek(offset + length // 2)
        f.write(b"\xff" * min(16, length // 2))
    for v in again.trainable_variables:
        v.assign(np.zeros(v.shape))
    with pytest.raises(checkpointing.CheckpointError, match=f"{path} is damaged, so nothing was restored .*"
                       "Digest mismatch"):
        checkpointing.restore(again, step)
    os.remove(path)
    with pytest.raises(checkpointing.CheckpointError, match=f"{path} is missing; it holds part of "):
        checkpointing.restore(again, step)
    assert all(not to_numpy(v.value).any() for v in again.trainable_variables)


@JAX_ONLY
def test_export_refuses_before_reading_when_the_model_does_not_fit(tmp_path):
    model = small_model()
    model.fit(np.zeros((4, 16, 16, 3), "float32"), np.zeros(4), epochs=1, verbose=0,
              callbacks=[checkpointing.OrbaxBackup(str(tmp_path / "b"))])
    needed, weights = export_checkpoint.needed_bytes(checkpointing.latest_step(str(tmp_path / "b")))
    assert (weights == sum(v.value.size * 4 for v in model.weights)
            and needed == export_checkpoint.MEMORY_FACTOR * weights)
    gib = export_checkpoint.GIB
    with pytest.raises(MemoryError, match=rf"needs about {needed / gib:.3g} GiB in one process "
                       rf"\({export_checkpoint.MEMORY_FACTOR} x {weights / gib:.3g} GiB of weights\); "
                       rf"{1000 / gib:.3g} GiB is available"):
        export_checkpoint.export(str(tmp_path / "b"), str(tmp_path / "m.keras"), max_memory=1000)
    assert not (tmp_path / "m.keras").exists()


def test_a_full_disk_is_named_by_its_mount_point_and_the_file_or_else_the_folder_written_in(tmp_path, capsys):
    from commands import cli

    named = OSError(28, "No space left on device", str(tmp_path / "log.csv"))
    assert cli.disk_full(named) and f"while writing {tmp_path}/log.csv." in cli.full_disk_message(named)
    tensorstore = ValueError(f'Failed writing: "{tmp_path}/backup/1/d/x" [os_error_code=\'28\']')
    assert cli.disk_full(tensorstore) and f"while writing {tmp_path}/backup/1/d/x." in cli.full_disk_message(
        tensorstore)
    unnamed = OSError(28, "No space left on device")  # a write() to an open file names none
    assert "mounted at /" in cli.full_disk_message(unnamed, tmp_path / "run")
    assert f", while writing {tmp_path}/run/." in cli.full_disk_message(unnamed, tmp_path / "run")
    assert cli.full_disk_message(unnamed).startswith("no space left on the disk ([Errno 28] No space left")
    assert not cli.disk_full(OSError(13, "Permission denied")) and not cli.disk_full(ValueError("28"))
    with pytest.raises(SystemExit) as stop, cli.one_line_errors("train", writing_to=tmp_path / "run"):
        raise unnamed
    [line] = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and line.startswith("train: error: no space left on the disk mounted at ")
    assert f"while writing {tmp_path}/run/. The epochs saved before are kept" in line

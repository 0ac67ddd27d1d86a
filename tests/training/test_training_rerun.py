"""Re-runs into an existing --out (training.runs): refused, resumed, restarted or overwritten; and a
folder that a failure or a kill at any write leaves consistent: recipe.json and model.keras describe
the same model, and a failed start leaves nothing new."""

import json
import os
import signal
import subprocess
import sys
import zipfile

import pytest

import keras
from tests import ROOT
from tests.conftest import tiny_vit
from keras_vit import ood
from training import checkpointing, recipes, runs, train

MODEL_FIELDS = ("hidden_dim", "num_layers", "num_heads", "mlp_dim", "pooling", "image_size")
TINY_FIELDS = dict(dataset="shapes:64", steps_per_epoch=2, batch_size=16, hidden_dim=48, num_heads=3, mlp_dim=96,
                   jit_compile=False)
TINY = ["--recipe", "shapes", "--dataset", "shapes:64", "--steps-per-epoch", "2", "--batch-size", "16",
        "--hidden-dim", "48", "--num-heads", "3", "--mlp-dim", "96", "--no-jit-compile"]


def fake_run(out, done=2, model=False, **fields):
    """A run folder as training leaves it after `done` epochs of the tiny shapes recipe with `fields`."""
    recipe = recipes.get("shapes", **{**TINY_FIELDS, **fields})
    out.mkdir(parents=True, exist_ok=True)
    runs.write_json(str(out / "recipe.json"), {**runs.configuration(recipe), "backend": "jax"})
    (out / "backup").mkdir()
    (out / "backup" / "training_metadata.json").write_text(json.dumps({"epoch": done, "batch": 0}))
    (out / "log.csv").write_text("epoch,loss\n" + "".join(f"{e},1.0\n" for e in range(done)))
    if model:
        config = {k: getattr(recipe, k) for k in MODEL_FIELDS}
        tiny_vit(**{**config, "image_size": recipe.image_size, "num_classes": 4}).save(str(out / "model.keras"))
    return recipe


def snapshot(folder):
    """{relative path: (size, mtime)} of every file under `folder`."""
    return {os.path.relpath(os.path.join(d, f), folder): (os.path.getsize(os.path.join(d, f)),
                                                         os.path.getmtime(os.path.join(d, f)))
            for d, _, files in os.walk(folder) for f in files}


def assert_consistent(out):
    """recipe.json parses, and model.keras, if there is one, is a whole file of the recipe's model."""
    with open(out / "recipe.json") as f:
        recipe = json.load(f)
    if (out / "model.keras").exists():
        with zipfile.ZipFile(out / "model.keras") as z:  # BadZipFile for a torn file
            config = json.loads(z.read("config.json"))["config"]
        for key in MODEL_FIELDS:
            if recipe[key] is not None:
                expected = [recipe[key]] * 2 if key == "image_size" else recipe[key]
                assert config[key] == expected, (key, config[key], recipe[key])


def refused(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    return err


def test_a_new_folder_is_planned_without_writing(tmp_path):
    plan = runs.plan(str(tmp_path / "run"), runs.configuration(recipes.get("shapes")))
    assert plan.action == "new" and plan.message() is None and not (tmp_path / "run").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a run")
    assert runs.plan(str(tmp_path / "mine"), {}).action == "new"


def test_a_rerun_that_changes_the_model_or_the_data_is_refused_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    fake_run(out, model=True, num_layers=2)
    before = snapshot(out)
    err = refused(capsys, [*TINY, "--out", str(out), "--num-layers", "3", "--dataset", "shapes:80"])
    assert "another configuration (dataset 'shapes:64' -> 'shapes:80'; num_layers 2 -> 3" in err
    assert "another --out" in err and "--overwrite" in err and err.startswith("python -m training.train: error:")
    assert snapshot(out) == before
    # Recipe fields beyond the model and the data are refused too: the record would mix two recipes.
    assert "(learning_rate 0.002 -> 0.1)" in refused(capsys, [*TINY, "--out", str(out), "--learning-rate", "0.1"])
    assert snapshot(out) == before


def test_more_epochs_resume_and_fewer_than_done_are_refused(tmp_path, capsys):
    out = tmp_path / "run"
    recipe = fake_run(out, done=2)
    plan = runs.plan(str(out), runs.configuration(recipe.__class__(**{**recipe.__dict__, "epochs": 5})))
    assert plan.action == "resume" and plan.message() == f"resuming at epoch 3 of 5 in {out}"
    finished = runs.plan(str(out), runs.configuration(recipe))
    assert finished.action == "resume" and "has finished its 2 epochs" in finished.message()
    err = refused(capsys, [*TINY, "--out", str(out), "--epochs", "1"])
    assert "--epochs 1: the run in" in err and "already finished 2 epochs" in err and "--overwrite" in err


def test_a_run_without_a_recipe_is_refused_unless_overwritten(tmp_path, capsys):
    out = tmp_path / "run"
    fake_run(out, model=True)
    (out / "recipe.json").unlink()
    assert ("but no recipe.json, so its configuration is unknown"
            in refused(capsys, ["--recipe", "shapes", "--out", str(out)]))
    assert runs.plan(str(out), {}, overwrite=True).action == "overwrite"
    (out / "recipe.json").write_text("{not json")
    fake = runs.configuration(recipes.get("shapes", **TINY_FIELDS))
    with pytest.raises(ValueError, match=r"recipe.json cannot be read .*pass --overwrite"):
        runs.plan(str(out), fake)
    out.with_name("file").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file"):
        runs.plan(str(out.with_name("file")), fake)


def test_a_run_that_finished_no_epoch_restarts_with_new_settings(tmp_path):
    out = tmp_path / "run"
    fake_run(out, done=0, num_layers=2)
    plan = runs.plan(str(out), runs.configuration(recipes.get("shapes", **TINY_FIELDS, num_layers=3)))
    assert plan.action == "restart" and "finished no epoch" in plan.message()


def test_an_overwrite_killed_between_writes_leaves_the_old_recipe_and_no_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "run"
    fake_run(out, model=True, num_layers=2)
    new = runs.configuration(recipes.get("shapes", **TINY_FIELDS, num_layers=1))
    plan = runs.plan(str(out), new, overwrite=True)

    def killed(fd):  # the new recipe's bytes are written, the rename has not happened
        raise KeyboardInterrupt

    monkeypatch.setattr(runs.os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        runs.commit(plan, new)
    assert sorted(p.name for p in out.iterdir()) == ["recipe.json", "recipe.json.partial"]
    assert json.loads((out / "recipe.json").read_text())["num_layers"] == 2  # the old run's, and no model
    assert_consistent(out)
    monkeypatch.undo()
    again = runs.plan(str(out), new)  # the old recipe has nothing trained: the new one starts
    assert again.action == "restart"
    runs.commit(again, new)
    assert sorted(p.name for p in out.iterdir()) == ["recipe.json"]
    assert json.loads((out / "recipe.json").read_text())["num_layers"] == 1


def test_a_kill_while_writing_recipe_json_keeps_the_old_file(tmp_path):
    """A real SIGKILL in another process, after the new recipe's bytes and before the rename."""
    out = tmp_path / "run"
    fake_run(out, done=0, num_layers=2)
    code = ("import os, signal, sys\nfrom training import recipes, runs\n"
            "new = runs.configuration(recipes.get('shapes', num_layers=5))\n"
            "plan = runs.plan(sys.argv[1], new)\n"
            "runs.os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
            "runs.commit(plan, new)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert json.loads((out / "recipe.json").read_text())["num_layers"] == 2
    assert json.loads((out / "recipe.json.partial").read_text())["num_layers"] == 5
    assert_consistent(out)


def test_undo_removes_what_a_failed_start_wrote(tmp_path):
    new = tmp_path / "new"
    plan = runs.plan(str(new), {"epochs": 2})
    runs.commit(plan, {"epochs": 2})
    (new / "log.csv").write_text("epoch,loss\n")
    runs.undo(plan)
    assert not new.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    plan = runs.plan(str(mine), {"epochs": 2})
    runs.commit(plan, {"epochs": 2})
    (mine / "tensorboard").mkdir()
    runs.undo(plan)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    resumed = tmp_path / "resumed"
    recipe = fake_run(resumed, done=2)
    plan = runs.plan(str(resumed), runs.configuration(recipe.__class__(**{**recipe.__dict__, "epochs": 4})))
    before = snapshot(resumed)
    runs.undo(plan)
    assert snapshot(resumed) == before


def test_the_model_checkpoint_keeps_the_last_whole_file_when_a_save_is_cut_short(tmp_path, monkeypatch):
    path = tmp_path / "model.keras"
    model = tiny_vit()
    callback = checkpointing.AtomicModelCheckpoint(str(path), monitor="loss", mode="min", save_best_only=True)
    callback.set_model(model)
    callback.on_epoch_end(0, {"loss": 1.0})
    first = path.read_bytes()
    save = type(model).save

    def torn(self, filepath, *args, **kwargs):  # half a zip written, then the process dies
        with open(filepath, "wb") as f:
            f.write(first[: len(first) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(type(model), "save", torn)
    with pytest.raises(KeyboardInterrupt):
        callback.on_epoch_end(1, {"loss": 0.5})
    assert path.read_bytes() == first and (tmp_path / "model.partial.keras").exists()
    monkeypatch.setattr(type(model), "save", save)
    callback.on_epoch_end(2, {"loss": 0.9})  # no better than 0.5: no save, and the torn file is not renamed
    assert path.read_bytes() == first
    callback.on_epoch_end(3, {"loss": 0.4})
    assert keras.saving.load_model(str(path), safe_mode=True).hidden_dim == model.hidden_dim
    assert not (tmp_path / "model.partial.keras").exists()


def test_missing_or_broken_weights_are_refused_before_anything_loads(tmp_path, capsys):
    out = tmp_path / "run"
    err = refused(capsys, ["--recipe", "shapes", "--weights", str(tmp_path / "nope.keras"), "--out", str(out)])
    assert "nope.keras': no such file or folder, and not a handle" in err
    (tmp_path / "garbage.keras").write_bytes(b"not a zip")
    assert "is not a .keras file" in refused(capsys, ["--recipe", "shapes",
                                                      "--weights", str(tmp_path / "garbage.keras"),
                                                      "--out", str(out)])
    assert "is not gs://bucket/path/to/object" in refused(capsys, ["--weights", "gs://bucket", "--out", str(out)])
    assert "--dataset '/no/such/folder': no such folder" in refused(capsys, ["--dataset", "/no/such/folder",
                                                                              "--out", str(out)])
    assert not out.exists()


def cli(out, *args, backend="jax"):
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, "-m", "training.train", *TINY, "--out", str(out), "--verbose", "2", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)


def log_epochs(out):
    return [int(line.split(",")[0]) for line in (out / "log.csv").read_text().splitlines()[1:]]


@pytest.mark.slow
def test_a_rerun_resumes_and_an_overwrite_replaces_the_run(tmp_path):
    out = tmp_path / "run"
    first = cli(out, "--epochs", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert log_epochs(out) == [0, 1] and "resuming" not in first.stdout
    assert_consistent(out)
    # Held-out examples for the demo: three test images per class, in file-safe class folders.
    assert sorted(p.name for p in (out / "examples").iterdir()) == ["cross", "disc", "square", "triangle"]
    assert sorted(p.name for p in (out / "examples" / "disc").iterdir()) == ["0.png", "1.png", "2.png"]
    # The out-of-domain statistics of the trained model, for the demo's warning.
    stats = ood.load_for(str(out / "model.keras"), keras.saving.load_model(str(out / "model.keras")))
    assert stats.method == ood.DEFAULT_METHOD and stats.width == 48
    # shapes:64 is below training.ood_stats' minimums: statistics without a threshold, and the reason.
    assert stats.false_alarm is None and stats.off.startswith("The out-of-domain check is off: "), stats.off
    assert (stats.blocks, stats.pooled) == ((0, 1), True)  # DEFAULT_BLOCKS: both blocks and the pooled features

    # A compatible change (more epochs, another out-of-domain score): resumes.
    more = cli(out, "--epochs", "3", "--test-split", "none", "--ood-method", "knn", "--ood-blocks", "pooled")
    assert more.returncode == 0, more.stderr[-3000:]
    assert f"resuming at epoch 3 of 3 in {out}" in more.stdout and "Epoch 3/3" in more.stdout
    assert "Epoch 1/3" not in more.stdout and log_epochs(out) == [0, 1, 2]
    assert json.loads((out / "recipe.json").read_text())["epochs"] == 3
    stats = ood.load_for(str(out / "model.keras"))
    assert (stats.method, stats.blocks, stats.pooled, stats.arrays["bank"].shape[-1]) == ("knn", (), True, 48)

    replaced = cli(out, "--epochs", "1", "--num-layers", "1", "--test-split", "none", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert "replacing the run" in replaced.stdout and log_epochs(out) == [0]
    assert not (out / "examples").exists()  # the old run's are gone; its metrics.json is the new run's summary
    summary = json.loads((out / "metrics.json").read_text())
    assert list(summary) == ["kept"] and (summary["kept"]["epoch"], summary["kept"]["epochs"]) == (1, 1), summary
    assert json.loads((out / "recipe.json").read_text())["num_layers"] == 1
    assert_consistent(out)


@pytest.mark.slow
def test_a_start_that_fails_in_its_first_epoch_leaves_no_folder(tmp_path):
    out = tmp_path / "run"
    failed = cli(out, "--epochs", "2", "--learning-rate", "1e30", "--clipnorm", "1e30")
    assert failed.returncode == 2 and "loss became" in failed.stderr, failed.stderr[-3000:]
    assert not out.exists()


@pytest.mark.slow
def test_a_kill_while_saving_the_checkpoint_leaves_the_last_whole_one_and_resumes(tmp_path):
    """SIGKILL in the middle of the second model.keras save (the file half written), through the CLI."""
    out = tmp_path / "run"
    code = ("import os, signal, sys, keras_vit\nfrom training import train\n"
            "save, calls = keras_vit.ViT.save, []\n"
            "def torn(self, path, *a, **k):\n"
            "    calls.append(path)\n"
            "    save(self, path, *a, **k)\n"
            "    if len(calls) == 2:\n"
            "        data = open(path, 'rb').read()\n"
            "        open(path, 'wb').write(data[: len(data) // 2])\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "keras_vit.ViT.save = torn\n"
            "train.main(sys.argv[1:])\n")
    args = [*TINY, "--out", str(out), "--epochs", "3", "--verbose", "2", "--test-split", "none"]
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    killed = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (out / "model.partial.keras").exists()  # the torn file, never renamed into place
    assert_consistent(out)
    keras.saving.load_model(str(out / "model.keras"), safe_mode=True)
    done = runs.finished_epochs(str(out))  # the epoch whose save was cut short is not among them
    assert 1 <= done < 3
    resumed = cli(out, "--epochs", "3", "--test-split", "none")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming at epoch {done + 1} of 3" in resumed.stdout and log_epochs(out) == [0, 1, 2]
    assert_consistent(out)
    assert not (out / "model.partial.keras").exists()
    assert keras.saving.load_model(str(out / "model.keras"), safe_mode=True).num_layers == 2


def test_a_resume_keeps_the_runs_checkpoint_format_and_refuses_another(tmp_path):
    recipe = fake_run(tmp_path / "run")
    stored = runs.read_recipe(str(tmp_path / "run"))
    runs.write_json(str(tmp_path / "run" / "recipe.json"), {**stored, "checkpoint_format": "orbax"})
    plan = runs.plan(str(tmp_path / "run"), runs.configuration(recipe))
    assert plan.action == "resume"
    assert runs.checkpoint_format(plan, None) == "orbax" and runs.checkpoint_format(plan, "orbax") == "orbax"
    with pytest.raises(ValueError, match="holds a run with --checkpoint-format orbax; resuming it with "
                                         "--checkpoint-format keras would start again from nothing"):
        runs.checkpoint_format(plan, "keras")
    overwrite = runs.plan(str(tmp_path / "run"), runs.configuration(recipe), overwrite=True)
    assert runs.checkpoint_format(overwrite, "keras") == "keras"  # a new run takes the format asked for


def test_an_overwrite_removes_an_orbax_runs_model_steps(tmp_path):
    """The best epoch of an orbax run lives in model/; loading takes its newest step, so a replaced
    run must not leave one there."""
    recipe = fake_run(tmp_path / "run")
    (tmp_path / "run" / "model" / "3").mkdir(parents=True)
    (tmp_path / "run" / "lora.safetensors").write_bytes(b"x")
    plan = runs.plan(str(tmp_path / "run"), runs.configuration(recipe, None), overwrite=True)
    runs.commit(plan, runs.configuration(recipe))
    assert sorted(os.listdir(tmp_path / "run")) == ["recipe.json"]


def test_an_orbax_run_counts_its_committed_backup_steps_not_the_rows_of_log_csv(tmp_path):
    """The row of an epoch whose save failed (a full disk, a kill) is in log.csv but not committed."""
    out = tmp_path / "run"
    (out / "backup" / "0").mkdir(parents=True)
    (out / "backup" / "1.orbax-checkpoint-tmp").mkdir()
    (out / "log.csv").write_text("epoch,loss\n0,1.0\n1,0.9\n")
    assert runs.finished_epochs(str(out)) == 1
    (out / "backup" / "1.orbax-checkpoint-tmp").rename(out / "backup" / "1")
    assert runs.finished_epochs(str(out)) == 2


def test_a_full_disk_is_one_line_naming_the_disk_and_other_errors_keep_their_traceback(tmp_path, capsys):
    import errno

    from commands import cli

    written = tmp_path / "run" / "model.keras"
    tensorstore = ValueError(f'RESOURCE_EXHAUSTED: Error writing "x/c" in OCDBT database at local file "{written}": '
                             "Failed to write 10 bytes: No space left on device [os_error_code='28']")
    for error in (OSError(errno.ENOSPC, "No space left on device", str(written)), tensorstore):
        with pytest.raises(SystemExit) as stop, cli.one_line_errors("prog"):
            raise error
        assert stop.value.code == 2
        mount = str(tmp_path)
        while not os.path.ismount(mount):
            mount = os.path.dirname(mount)
        assert capsys.readouterr().err == (f"prog: error: no space left on the disk mounted at {mount}, while writing "
                                           f"{written}. The epochs saved before are kept: free space there and run "
                                           "the same command to resume\n")
    with pytest.raises(OSError, match="Input/output"), cli.one_line_errors("prog"):
        raise OSError(errno.EIO, "Input/output error")
    with pytest.raises(ValueError, match="bad flag"), cli.one_line_errors("prog", errors=(KeyError,)):
        raise ValueError("bad flag")

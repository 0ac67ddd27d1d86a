"""Each check and load once per run: `python -m training.train` (in this process) checks the weights,
the dataset, LoRA and the out-of-domain choice once, loads each split once and the weights once."""

import collections
import os

import pytest

import keras_vit
from commands import preflight
from tests.conftest import tiny_vit
from training import datasets, ood_stats, recipes, train

# Counts calls, the same on every backend; a training run of its own (tens of seconds): run once, with
# the slow tests.
pytestmark = [pytest.mark.one_backend, pytest.mark.slow]


def counted(monkeypatch, owner, name, calls):
    """Replaces `owner.name` with a wrapper that appends its first two arguments to
    `calls["module.name"]`."""
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        calls[f"{owner.__name__}.{name}"].append(args[:2])
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def test_a_fine_tuning_run_checks_and_loads_each_thing_once(tmp_path, monkeypatch):
    weights = tmp_path / "base.keras"
    tiny_vit(image_size=16, num_classes=4, hidden_dim=48, num_heads=3, mlp_dim=96).save(str(weights))
    calls = collections.defaultdict(list)
    for owner, name in [(datasets, "load"), (keras_vit, "load"), (preflight, "check_source"),
                        (preflight, "check_dataset"), (recipes, "check_lora"), (ood_stats, "choice")]:
        counted(monkeypatch, owner, name, calls)
    train.main(["--recipe", "shapes", "--dataset", "shapes:64", "--image-size", "16", "--epochs", "1",
                "--steps-per-epoch", "1", "--batch-size", "16", "--hidden-dim", "48", "--num-heads", "3",
                "--mlp-dim", "96", "--no-jit-compile", "--val-split", "train@1", "--test-split", "train@1",
                "--weights", str(weights), "--out", str(tmp_path / "run"), "--verbose", "0"])
    assert (tmp_path / "run" / "model.keras").is_file() and (tmp_path / "run" / "ood.npz").is_file()
    splits = collections.Counter(split for _, split in calls.pop("training.datasets.load"))
    # The held-out split (64 other shapes) serves validation, the test, the examples and the OOD threshold.
    assert splits == {"train": 1, "train@1": 1}, splits
    assert calls.pop("commands.preflight.check_source") == [(str(weights),)]
    # The weights, and at the end the best epoch's model.keras (training.checkpoint_formats).
    loaded = [os.path.relpath(source, tmp_path) for source, *_ in calls.pop("keras_vit.load")]
    assert loaded == ["base.keras", os.path.join("run", "model.keras")], loaded
    assert {name: len(c) for name, c in calls.items()} == {
        "commands.preflight.check_dataset": 1, "training.recipes.check_lora": 1, "training.ood_stats.choice": 1}

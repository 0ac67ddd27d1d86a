"""What a training run leaves for the demo: held-out examples per class (training.examples) and the
out-of-domain statistics (training.ood_stats)."""

import numpy as np
import pytest
from PIL import Image

from tests.conftest import tiny_vit
from keras_vit import ood
from training import examples, ood_stats


def test_class_names_become_distinct_file_safe_folders():
    names = examples.folder_names(["T-shirt/top", "Ankle boot", "a:b", "a?b", "..", "A?B", "naïve"])
    assert names == ["T-shirt_top", "Ankle boot", "a_b", "a_b_2", "class", "A_B_3", "naïve"]


def test_pick_takes_the_first_images_of_each_class_and_stops_early():
    seen = []

    def stream():
        for i in range(1000):
            seen.append(i)
            yield np.full((4, 4, 1), i, "uint8"), i % 3

    picked = examples.pick(stream(), 3, per_class=2)
    assert [[int(im[0, 0, 0]) for im in picked[c]] for c in range(3)] == [[0, 3], [1, 4], [2, 5]]
    assert len(seen) <= 7  # stopped once every class had two
    assert examples.pick([(np.zeros((2, 2, 1)), 7)], 3)[0] == []  # an unknown label is ignored


def test_a_run_keeps_held_out_images_per_class(tmp_path):
    raw, _ = _shapes("test", "shapes:64")
    info = type("Info", (), {"num_classes": 4, "class_names": ("square", "disc", "tri/angle", "cross")})
    assert examples.write(raw, info, str(tmp_path), per_class=2) == 8
    folders = sorted(p.name for p in (tmp_path / "examples").iterdir())
    assert folders == ["cross", "disc", "square", "tri_angle"]
    with Image.open(tmp_path / "examples" / "disc" / "1.png") as im:
        assert im.mode == "L" and im.size == (32, 32)  # the shapes are grayscale, 32 px
    (tmp_path / "examples" / "stale").mkdir()  # a second run replaces the whole folder
    examples.write(raw, info, str(tmp_path), per_class=1)
    assert sorted(p.name for p in (tmp_path / "examples").iterdir()) == folders
    assert [p.name for p in (tmp_path / "examples" / "disc").iterdir()] == ["0.png"]
    assert not list(tmp_path.glob("*.partial"))
    assert examples.write(None, info, str(tmp_path)) == 0  # a run with neither a validation nor a test split


def test_ood_statistics_are_written_beside_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(ood_stats, "STATS_IMAGES", 60)
    monkeypatch.setattr(ood_stats, "HELD_OUT_IMAGES", 40)
    monkeypatch.setattr(ood_stats, "MIN_FIT_IMAGES", 60)
    monkeypatch.setattr(ood_stats, "MIN_HELD_OUT_IMAGES", 40)
    model = tiny_vit(num_channels=1, num_classes=4)
    train = _shapes("train", "shapes:200")
    stats = ood_stats.write(model, *train, out_dir=str(tmp_path), false_alarm=0.1)
    loaded = ood.load_for(str(tmp_path / "model.keras"), model)
    # The default score on both blocks and the pooled features: three sets of 4 class means.
    assert loaded.arrays["means"].shape == (3, 4, 48) and loaded.threshold == stats.threshold
    assert loaded.false_alarm == stats.false_alarm and 0.0 < stats.false_alarm <= 0.1 and len(loaded.reference) == 40
    energy = ood_stats.write(model, *train, out_dir=str(tmp_path), choice=ood_stats.choice("energy", "pooled"))
    assert ood.load_for(str(tmp_path / "model.keras"), model).method == energy.method == "energy"
    with pytest.raises(ValueError, match="Unknown out-of-domain method 'odin'"):
        ood_stats.choice("odin")
    # The statistics' images and the threshold's are different images of the split.
    x, _ = ood_stats.pixels(*_shapes("train"), model, 60, 0, 2)
    held, _ = ood_stats.pixels(*_shapes("train"), model, 40, 1, 2)
    assert x.shape == (60, 32, 32, 1) and held.shape == (40, 32, 32, 1) and 0 <= x.min() and x.max() <= 255
    assert not any(np.array_equal(a, b) for a in held[:10] for b in x)


def test_a_run_with_too_few_images_stores_statistics_without_a_threshold_and_says_why(tmp_path):
    assert ood_stats.too_few(ood_stats.MIN_FIT_IMAGES, ood_stats.MIN_HELD_OUT_IMAGES) is None
    assert ood_stats.too_few(20, 21) == (
        "The out-of-domain check is off: this model's training run had too few images to learn what usual images "
        f"look like (20 for the statistics and 21 held out to set the threshold; it needs at least "
        f"{ood_stats.MIN_FIT_IMAGES} and {ood_stats.MIN_HELD_OUT_IMAGES}).")
    model = tiny_vit(num_channels=1, num_classes=4)
    # 200 training images: 100 for the statistics, the 100 after them held out, too few for a threshold.
    stats = ood_stats.write(model, *_shapes("train", "shapes:200"), out_dir=str(tmp_path))
    assert stats.threshold is None and stats.off == ood_stats.too_few(100, 100)
    loaded = ood.load_for(str(tmp_path / "model.keras"), model)
    assert loaded.threshold is None and loaded.off == stats.off and loaded.arrays["means"].shape == (3, 4, 48)


def _shapes(split, name="shapes:200"):
    """(raw examples, Info) of a split of the synthetic shapes."""
    from training import datasets

    return datasets.load(name, split)

"""Fast tests of the training data sources, pipeline, recipes and CLI parsing (any backend)."""

import os

import numpy as np
import pytest

import keras_vit
from training import datasets, recipes
from training.datasets import shapes

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once

GRAY32 = keras_vit.Preprocessing((32, 32), (0.5,), (0.5,), channels=1)  # what a 32 px grayscale model reads


def test_make_shapes_follows_the_seed_generator():
    X, y = shapes.make_shapes(50, np.random.default_rng(1000))
    assert X.shape == (50, 32, 32) and X.dtype == np.float32 and y.dtype == np.int64
    # Labels drawn first from the generator, as in the seed's script (its PyTorch version gives these).
    np.testing.assert_array_equal(y[:10], [0, 2, 3, 2, 3, 1, 0, 0, 2, 2])
    X2, _ = shapes.make_shapes(50, np.random.default_rng(1000))
    np.testing.assert_array_equal(X, X2)
    assert 0.0 < X.mean() < 1.0


def test_shapes_source_and_pipeline_are_deterministic():
    ds, info = datasets.load("shapes:64", "train")
    assert info.num_classes == 4 and info.class_names[1] == "disc" and info.splits["train"] == 64
    recipe = recipes.get("shapes", translate=0.1, flip=True, randaugment_layers=1)

    def first_batch(seed):
        batches = datasets.pipeline(ds, info, GRAY32, 16, True, recipe=recipe, seed=seed)
        images, labels = next(iter(batches))
        return np.asarray(images), np.asarray(labels)

    (a, la), (b, lb), (c, _) = first_batch(3), first_batch(3), first_batch(4)
    assert a.shape == (16, 32, 32, 1) and la.shape == (16, 4)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    assert not np.array_equal(a, c)
    assert -1.5 < a.mean() < 1.5  # normalized to about [-1, 1]


def test_mixup_mixes_labels():
    ds, info = datasets.load("shapes:64", "train")
    recipe = recipes.get("shapes", mixup=0.8)
    _, labels = next(iter(datasets.pipeline(ds, info, GRAY32, 32, True, recipe=recipe)))
    labels = np.asarray(labels)
    np.testing.assert_allclose(labels.sum(-1), 1.0, atol=1e-5)
    assert (labels.max(-1) < 0.999).any()


def test_folder_source(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, n in (("cat", 5), ("dog", 5)):
        os.makedirs(tmp_path / name)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8)).save(tmp_path / name / f"{i}.png")
    ds, info = datasets.load(str(tmp_path), "train", seed=0)
    assert info.class_names == ("cat", "dog") and info.splits == {"validation": 1, "train": 9, "all": 10}
    rgb16 = keras_vit.Preprocessing((16, 16), (0.5,) * 3, (0.5,) * 3)
    images, labels = next(iter(datasets.pipeline(ds, info, rgb16, 4, False)))
    assert images.shape == (4, 16, 16, 3) and labels.shape == (4, 2)
    with pytest.raises(ValueError, match=r"no split 'test'.*\['all', 'train', 'validation'\]"):
        datasets.load(str(tmp_path), "test")


def test_bad_dataset_name_lists_close_names():
    with pytest.raises(ValueError, match=r"Unknown dataset 'cifar1O'.*cifar10"):
        datasets.load("cifar1O", "train")


def test_missing_split_lists_splits():
    with pytest.raises(ValueError, match=r"no split 'validation'.*\['test', 'train'\]"):
        datasets.load("shapes", "validation")


def test_wrong_image_size_lists_allowed_sizes():
    with pytest.raises(ValueError, match=r"image_size=30 is not a multiple of patch_size=4.*\[28, 32\]"):
        datasets.check_image_size(30, 4)


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path, monkeypatch):
    from training.datasets import fashion_mnist

    monkeypatch.setattr(fashion_mnist, "SEARCH_DIRS", (str(tmp_path),))
    monkeypatch.setenv(fashion_mnist.ENV_VAR, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        fashion_mnist.find_files()


def test_recipes_and_cli_overrides():
    from training import train

    with pytest.raises(ValueError, match=r"Unknown recipe 'nope'.*fashion_mnist"):
        recipes.get("nope")
    with pytest.raises(ValueError, match=r"Unknown recipe fields \['lr'\]"):
        recipes.get("shapes", lr=1.0)
    args = train.build_parser().parse_args(
        ["--recipe", "fine_tune", "--learning-rate", "0.03", "--no-flip", "--val-split", "none", "--hidden-dim", "32"]
    )
    fields = {k: v for k, v in vars(args).items() if k in recipes.Recipe.__dataclass_fields__}
    recipe = recipes.get(args.recipe, **fields)
    assert (recipe.learning_rate, recipe.flip, recipe.val_split, recipe.hidden_dim) == (0.03, False, None, 32)
    assert recipe.optimizer == "sgd" and recipe.momentum == 0.9 and recipe.zero_head
    assert recipes.get("fashion_mnist").optimizer == "adamw" and recipes.get("fashion_mnist").clipnorm == 1.0

"""keras_vit.load, the one way from a source to a model: a .keras file (safe mode), with the options
that change a model, and the one-line refusals that name the source and what was tried. The other
formats, handles and catalog names load through the same function in the tests beside this one
(test_checkpoints_*.py, test_hub.py)."""

import keras
import numpy as np
import pytest
from tests.conftest import images, random_vit, to_numpy

import keras_vit


@pytest.fixture
def saved(tmp_path):
    model = random_vit(class_names=tuple("abcde"))
    path = tmp_path / "model.keras"
    model.save(path)
    return model, path


def test_a_keras_file_loads_whole_and_unchanged(saved):
    model, path = saved
    loaded = keras_vit.load(str(path))
    assert loaded.get_config() == model.get_config() and loaded.class_names == tuple("abcde")
    np.testing.assert_allclose(to_numpy(loaded(images())), to_numpy(model(images())), atol=1e-6)
    assert keras_vit.load_checkpoint is keras_vit.load  # the earlier name is the same function


def test_options_rebuild_a_keras_model_as_for_any_checkpoint(saved):
    model, path = saved
    bigger = keras_vit.load(path, image_size=48)
    np.testing.assert_allclose(to_numpy(bigger(images((2, 48, 48, 3)))),
                               to_numpy(keras_vit.resize(model, 48)(images((2, 48, 48, 3)))), atol=1e-5)
    new_task = keras_vit.load(path, num_classes=3, class_names=["x", "y", "z"])
    assert new_task.num_classes == 3 and new_task.class_names == ("x", "y", "z")
    assert not np.any(to_numpy(new_task.head.classifier.kernel))  # §3.2: a zero-initialized head
    fresh = keras_vit.load(path, new_head=True)  # the same classes, a new head
    assert fresh.num_classes == 5 and not np.any(to_numpy(fresh.head.classifier.kernel))
    kernels = [to_numpy(m.patch_embedding.weights[0]) for m in (fresh, model)]
    np.testing.assert_array_equal(*kernels)


def test_a_keras_file_refuses_what_only_weights_files_take_and_models_that_are_no_vit(tmp_path, saved):
    _, path = saved
    with pytest.raises(ValueError, match=r"model.keras is a .keras file.*\['num_heads'\] apply only"):
        keras_vit.load(path, num_heads=3)
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    other.save(tmp_path / "dense.keras")
    with pytest.raises(ValueError, match="dense.keras holds a Sequential, not a keras_vit.ViT"):
        keras_vit.load(tmp_path / "dense.keras")


@pytest.mark.parametrize("source, message", [
    ("missing.keras", r"cannot load 'missing.keras': no such file or folder, not a handle \(hf://, gs://, "
                      r"https://\) and not a name of keras_vit.list_pretrained\(\)"),
    ("vit_base_patch16_224.augreg_in21k_ft_1k", "did you mean 'vit_base_patch16_224.augreg_in21k_ft_in1k'"),
])
def test_a_source_that_is_nothing_is_one_line_naming_it_and_what_was_tried(source, message):
    with pytest.raises(ValueError, match=message) as error:
        keras_vit.load(source)
    assert "\n" not in str(error.value)


def test_a_file_of_no_format_names_every_kind_tried(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"cannot load .*notes.txt: no checkpoint file that keras_vit reads; tried "
                                         r"a .keras file, "
                                         r"an official .npz, .* or a Hugging Face folder"):
        keras_vit.load(tmp_path / "notes.txt")

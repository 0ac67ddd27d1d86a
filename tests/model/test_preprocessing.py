"""keras_vit.Preprocessing, the model's record of how its images are prepared: its checks, the
crops and channels of `prepare`, `normalize` in Keras and TensorFlow, and the record in the model's
config and in every file format's round trip; files saved before the record load with what they
were trained with."""

import json
import pathlib

import numpy as np
import pytest
from PIL import Image
from tests import ROOT
from tests.conftest import images, random_vit, to_numpy

import keras_vit
from keras_vit import Preprocessing

RECORD = dict(image_resize="bicubic", image_antialias=True, image_crop="none",
              image_mean=(0.4, 0.5, 0.6), image_std=(0.2, 0.3, 0.25))


def test_the_record_checks_its_values_and_round_trips_its_config():
    p = Preprocessing((32, 48), (0.5,) * 3, (0.25,) * 3, "lanczos", True, "pad", 3)
    assert Preprocessing.from_config(json.loads(json.dumps(p.get_config()))) == p
    with pytest.raises(ValueError, match=r"resize='cubic' is not allowed; use one of \('nearest', 'bilinear'"):
        Preprocessing((32, 32), (0.5,) * 3, (0.5,) * 3, resize="cubic")
    with pytest.raises(ValueError, match=r"crop='middle' is not allowed; use one of \('center', 'none', 'pad'\)"):
        Preprocessing((32, 32), (0.5,) * 3, (0.5,) * 3, crop="middle")
    with pytest.raises(ValueError, match="need 3 values each, std > 0"):
        Preprocessing((32, 32), (0.5,) * 3, (0.0,) * 3)


def test_prepare_crops_stretches_or_pads_and_converts_the_channels():
    wide = np.zeros((20, 40, 3), "uint8")
    wide[:, :10] = 255  # a white band on the left quarter
    image = Image.fromarray(wide)
    center = Preprocessing((10, 10), (0.5,) * 3, (0.5,) * 3, "nearest", crop="center").prepare(image)
    stretched = Preprocessing((10, 10), (0.5,) * 3, (0.5,) * 3, "nearest", crop="none").prepare(image)
    padded = Preprocessing((10, 10), (0.5,) * 3, (0.5,) * 3, "nearest", True, "pad").prepare(image)
    assert center.shape == stretched.shape == padded.shape == (10, 10, 3) and center.dtype == np.uint8
    assert center[:, :, 0].max() == 0  # the centered square misses the band
    assert (stretched[:, :2] == 255).all() and (stretched[:, 3:] == 0).all()  # a quarter of the width
    assert (padded[:2] == 0).all() and (padded[-3:] == 0).all() and (padded[3:7, :2] == 255).all()  # on black
    gray = Preprocessing((10, 10), (0.5,), (0.5,), channels=1).prepare(image)
    assert gray.shape == (10, 10, 1)
    assert (Preprocessing((20, 40), (0.5,) * 3, (0.5,) * 3).prepare(image) == wide).all()  # its size: as it is


def test_every_image_size_crops_to_the_target_even_where_the_scale_rounds_past_the_image():
    # 29 x 29 to 28 x 28: 28 * (29 / 28) is 29.000000000000004, a box that Pillow refused.
    for size, antialias in (((28, 28), True), ((28, 28), False), ((48, 64), True)):
        record = Preprocessing(size, (0.5,) * 3, (0.5,) * 3, "bicubic", antialias, "center")
        for w in range(1, 90, 7):
            for h in (*range(1, 90, 11), 29, 31, 57):
                pixels = record.prepare(Image.new("RGB", (w, h), (200, 100, 50)))
                assert pixels.shape == (*size, 3) and (pixels[size[0] // 2, size[1] // 2] == (200, 100, 50)).all()
        assert record.prepare(Image.new("RGB", (29, 29), (9, 9, 9))).shape == (*size, 3)


def test_antialias_filters_a_shrunk_image_and_point_sampling_does_not():
    stripes = np.tile(np.array([0, 255], "uint8"), (64, 32))[..., None].repeat(3, -1)  # 1-px columns
    sampled = Preprocessing((9, 9), (0.5,) * 3, (0.5,) * 3, "bilinear", False).prepare(Image.fromarray(stripes))
    filtered = Preprocessing((9, 9), (0.5,) * 3, (0.5,) * 3, "bilinear", True).prepare(Image.fromarray(stripes))
    assert np.ptp(filtered) <= 10  # about the average grey (the edges see one stripe more)
    assert np.ptp(sampled) > 200  # aliasing: each sample falls between two stripes at another place


def test_normalize_is_the_same_in_keras_numpy_and_tensorflow():
    import tensorflow as tf

    p = Preprocessing((4, 4), (0.4, 0.5, 0.6), (0.2, 0.3, 0.25))
    pixels = np.random.default_rng(0).integers(0, 256, (2, 4, 4, 3)).astype("uint8")
    offset, scale = np.float32([102.0, 127.5, 153.0]), np.float32(1 / (255 * np.array([0.2, 0.3, 0.25])))
    expected = (pixels.astype("float32") - offset) * scale  # (x / 255 - mean) / std, rounded alike everywhere
    np.testing.assert_array_equal(to_numpy(p.normalize(pixels)), expected)
    np.testing.assert_array_equal(p.normalize(tf.constant(pixels), tf).numpy(), expected)
    first = to_numpy(p.normalize(pixels.transpose(0, 3, 1, 2), channels_first=True)).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(first, expected)


def test_the_model_records_its_preprocessing_in_its_config():
    model = random_vit(**RECORD)
    p = model.preprocessing
    assert (p.resize, p.antialias, p.crop, p.image_size, p.mean, p.channels) == ("bicubic", True, "none", (32, 32),
                                                                                  (0.4, 0.5, 0.6), 3)
    again = keras_vit.ViT.from_config(json.loads(json.dumps(model.get_config())))
    assert again.preprocessing == p
    x = images() * 255
    np.testing.assert_array_equal(to_numpy(model.normalize(x)), to_numpy(p.normalize(x)))


@pytest.mark.parametrize("fmt", ["keras", "timm", "transformers", "keras_hub"])
def test_the_preprocessing_survives_every_file_format(tmp_path, fmt):
    model = random_vit(**RECORD, **({"pooling": "token"} if fmt != "timm" else {}))
    path = tmp_path / ("model.keras" if fmt == "keras" else "model.safetensors" if fmt == "timm" else "folder")
    model.save(path) if fmt == "keras" else keras_vit.save_checkpoint(model, path, format=fmt)
    assert keras_vit.load(path).preprocessing == model.preprocessing


def test_a_foreign_folder_states_its_preprocessing_where_its_library_looks(tmp_path):
    # What transformers' and keras-hub's own loaders read: preprocessor_config.json's "resample" and
    # the image converter's interpolation, antialias and crop; keras_vit reads them back without its
    # own copy of the arguments.
    model = random_vit(**RECORD)
    keras_vit.save_checkpoint(model, tmp_path / "hf", format="transformers")
    pre = json.loads((tmp_path / "hf" / "preprocessor_config.json").read_text())
    assert pre["resample"] == 3 and pre["image_mean"] == [0.4, 0.5, 0.6]  # PIL's BICUBIC
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["keras_vit"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    loaded = keras_vit.load(tmp_path / "hf").preprocessing
    assert (loaded.resize, loaded.antialias, loaded.crop, loaded.mean) == ("bicubic", True, "none", (0.4, 0.5, 0.6))
    keras_vit.save_checkpoint(model, tmp_path / "kh", format="keras_hub")
    converter = json.loads((tmp_path / "kh" / "preprocessor.json").read_text())["config"]["image_converter"]["config"]
    assert (converter["interpolation"], converter["antialias"], converter["crop_to_aspect_ratio"]) == (
        "bicubic", True, False)
    (tmp_path / "kh" / "metadata.json").write_text(json.dumps({"tasks": ["ImageClassifier"]}))
    loaded = keras_vit.load(tmp_path / "kh").preprocessing
    assert (loaded.resize, loaded.antialias, loaded.crop) == ("bicubic", True, "none")


# The ViTs among the files of earlier layouts (tests/model/test_saved_files.py).
FIXTURES = sorted(pathlib.Path(ROOT, "tests", "model", "fixtures").glob("pre_*_[!u]*.keras"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_files_saved_before_the_record_load_with_the_preprocessing_they_were_trained_with(path):
    # Before the record, training resized with keras.layers.Resizing: bilinear, no antialias,
    # the centered crop of the aspect ratio.
    p = keras_vit.load(path).preprocessing
    assert (p.resize, p.antialias, p.crop) == ("bilinear", False, "center")


def test_the_shipped_model_records_the_resize_its_demo_always_gave_photos():
    # Its training images were 28 x 28 already, so training never resized; the demo resized uploads
    # with Pillow's LANCZOS, which its out-of-domain statistics and the docs' figures measured.
    p = keras_vit.load(ROOT / "checkpoints" / "fashion-mnist-vit" / "model.keras").preprocessing
    assert (p.image_size, p.resize, p.antialias, p.crop, p.channels) == ((28, 28), "lanczos", True, "center", 1)

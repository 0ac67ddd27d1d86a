"""keras_vit.export: each artifact, run in its own runtime, matches the Keras model's probabilities;
the formats a backend cannot produce raise an error that names the backends that can."""

import keras
import numpy as np
import pytest
from tests.conftest import randomize, tiny_vit, to_numpy

import keras_vit
from keras_vit import naflex, serving
from keras_vit.export import DYNAMIC_FORMATS, FORMATS, SEQUENCE_FORMATS

BACKEND = keras.backend.backend()
SUFFIX = {"tf_saved_model": "", "onnx": ".onnx", "openvino": ".xml", "litert": ".tflite"}
# jax2onnx takes about half a minute even for the tiny model.
SLOW = {("jax", "onnx"), ("jax", "openvino")}


def _cases():
    for format in FORMATS:
        marks = [pytest.mark.slow] if (BACKEND, format) in SLOW else []
        yield pytest.param(format, marks=marks, id=format)


def _model():
    return randomize(tiny_vit(class_names=list("abcde"), image_mean=(0.4, 0.5, 0.6), image_std=(0.2, 0.3, 0.25)))


@pytest.mark.parametrize("format", list(_cases()))
def test_artifact_matches_the_keras_model(tmp_path, format):
    model = _model()
    path = str(tmp_path / f"model{SUFFIX[format]}")
    backends = FORMATS[format].backends
    if BACKEND not in backends:
        with pytest.raises(ValueError, match=f"format='{format}' cannot be exported on the {BACKEND} backend.*"
                                             + str(backends[0])):
            keras_vit.export(model, path, format=format)
        return
    keras_vit.export(model, path, format=format)
    pixels = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype="uint8")
    expected = to_numpy(keras.ops.softmax(model(model.normalize(pixels))))
    probs = serving.load(path, format)(pixels)  # f32; OpenVINO with INFERENCE_PRECISION_HINT=f32
    assert probs.shape == (3, 5)
    np.testing.assert_allclose(probs, expected, atol=1e-4)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    meta = serving.read_metadata(path, format)
    assert meta["class_names"] == list("abcde")
    assert meta["image_mean"] == pytest.approx([0.4, 0.5, 0.6]) and meta["image_std"] == pytest.approx([0.2, 0.3, 0.25])
    assert meta["image_size"] == [32, 32]


def test_bad_arguments_are_refused(tmp_path):
    model = _model()
    with pytest.raises(ValueError, match="format='keras' is not allowed"):
        keras_vit.export(model, tmp_path / "m", format="keras")
    with pytest.raises(ValueError, match="num_classes=0"):
        keras_vit.export(tiny_vit(num_classes=0), tmp_path / "m.onnx", format="onnx")
    with pytest.raises(ValueError, match="end the path in .xml"):
        keras_vit.export(model, tmp_path / "m.bin", format="openvino")
    with pytest.raises(ValueError, match="precision='bf16' is not allowed for format='onnx'"):
        serving.load(tmp_path / "m.onnx", "onnx", precision="bf16")


DYNAMIC_CASES = [f for f, backends in DYNAMIC_FORMATS.items() if BACKEND in backends]


@pytest.mark.parametrize("format", DYNAMIC_CASES)
def test_a_dynamic_model_exports_one_artifact_for_every_size(tmp_path, format):
    model = randomize(tiny_vit(dynamic_image_size=True, resample_method="bicubic"))
    path = str(tmp_path / f"model{SUFFIX[format]}")
    keras_vit.export(model, path, format=format)
    run = serving.load(path, format)
    for size in [(32, 32), (24, 40)]:  # the table's own size, and a smaller non-square one
        pixels = np.random.default_rng(0).integers(0, 256, (2, *size, 3), dtype="uint8")
        expected = to_numpy(keras.ops.softmax(model(model.normalize(pixels))))
        np.testing.assert_allclose(run(pixels), expected, atol=1e-4)
    meta = serving.read_metadata(path, format)
    assert meta["input_size"] == [None, None] and meta["patch_pixels"] == 4 and meta["image_size"] == [32, 32]


def test_a_fixed_size_is_asked_where_the_format_or_the_model_takes_one(tmp_path):
    dynamic = randomize(tiny_vit(dynamic_image_size=True))
    if BACKEND == "jax":  # jax2onnx: the sides cannot be declared multiples of the patch
        with pytest.raises(ValueError, match="format='onnx' with a free image size cannot be exported on the jax"):
            keras_vit.export(dynamic, tmp_path / "m.onnx", format="onnx")
    if BACKEND in FORMATS["litert"].backends:
        with pytest.raises(ValueError, match=r"format='litert' takes one fixed image size.*pass image_size=\(H, W\)"):
            keras_vit.export(dynamic, tmp_path / "m.tflite", format="litert")
    with pytest.raises(ValueError,
                       match=r"image_size=\(24, 40\) is not allowed: this model takes image_size=\(32, 32\)"):
        keras_vit.export(_model(), tmp_path / "m.onnx", format="onnx", image_size=(24, 40))
    with pytest.raises(ValueError, match="the nearest valid width is 28 or 32"):
        keras_vit.export(dynamic, tmp_path / "m.onnx", format="onnx", image_size=(24, 30))
    if BACKEND in FORMATS["onnx"].backends:
        path = keras_vit.export(dynamic, tmp_path / "fixed.onnx", format="onnx", image_size=(24, 40))
        pixels = np.random.default_rng(0).integers(0, 256, (2, 24, 40, 3), dtype="uint8")
        expected = to_numpy(keras.ops.softmax(dynamic(dynamic.normalize(pixels))))
        np.testing.assert_allclose(serving.load(path, "onnx")(pixels), expected, atol=1e-4)
        assert serving.read_metadata(path, "onnx")["input_size"] == [24, 40]


@pytest.mark.parametrize("format", list(FORMATS))
def test_a_patch_sequence_model_exports_one_artifact_for_every_length(tmp_path, format):
    model = randomize(tiny_vit(max_seq_len=48, class_names=list("abcde"), image_mean=(0.4, 0.5, 0.6),
                               image_std=(0.2, 0.3, 0.25)))
    path = str(tmp_path / f"model{SUFFIX[format]}")
    if BACKEND not in SEQUENCE_FORMATS.get(format, ()):
        with pytest.raises(ValueError, match=f"format='{format}'.*cannot be exported on the {BACKEND} backend"):
            keras_vit.export(model, path, format=format)
        return
    with pytest.raises(ValueError, match="image_size=32 is not allowed: this model takes patch sequences"):
        keras_vit.export(model, path, format=format, image_size=32)
    keras_vit.export(model, path, format=format)
    run = serving.load(path, format)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, shape).astype("float32") for shape in ((32, 32, 3), (20, 60, 3), (70, 12, 3))]
    for budget in (48, 20):  # the model's budget, and a shorter sequence through the same artifact
        raw = naflex.patch_sequences(images, 4, budget, normalize=False)
        assert raw["patches"].max() > 1.0  # pixels, not normalized
        inputs = naflex.patch_sequences(images, 4, budget, mean=model.image_mean, std=model.image_std)
        expected = to_numpy(keras.ops.softmax(model(inputs)))
        np.testing.assert_allclose(run(raw), expected, atol=1e-4)
    meta = serving.read_metadata(path, format)
    assert meta["max_seq_len"] == 48 and meta["patch_size"] == 4 and meta["input_size"] is None
    assert "patch sequences" in meta["input"] and meta["class_names"] == list("abcde")

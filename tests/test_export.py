"""keras_vit.export: each artifact, run in its own runtime, matches the Keras model's probabilities;
the formats a backend cannot produce raise an error that names the backends that can."""

import keras
import numpy as np
import pytest
from conftest import randomize, tiny_vit, to_numpy

import keras_vit
from keras_vit import serving
from keras_vit.export import FORMATS

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

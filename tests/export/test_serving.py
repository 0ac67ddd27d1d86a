"""Serving paths: int8 (NNCF) and bf16 OpenVINO runs of an exported model, and the benchmark's
serving step for keras_vit's and timm's graphs."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from tests import ROOT
from tests.conftest import TINY, randomize, tiny_vit, to_numpy

import keras_vit
from benchmarks import impls
from keras_vit import serving



@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(0)
    model = randomize(tiny_vit(), scale=0.1)
    path = str(tmp_path_factory.mktemp("ov") / "model.xml")
    keras_vit.export(model, path, format="openvino")
    return model, path


@pytest.mark.slow  # NNCF calibration, and on JAX the export goes through jax2onnx
def test_int8_and_bf16_stay_close_to_float32(exported, tmp_path):
    model, path = exported
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (8, 32, 32, 3), dtype="uint8")
    expected = to_numpy(keras.ops.softmax(model(model.normalize(pixels))))
    int8 = serving.quantize_int8(path, tmp_path / "int8.xml", rng.integers(0, 256, (16, 32, 32, 3), dtype="uint8"))
    for precision, fn in (("bf16", serving.load(path, "openvino", "bf16")), ("int8", serving.load(int8, "openvino"))):
        probs = fn(pixels)
        assert probs.shape == (8, 5), precision
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-3)
        assert np.abs(probs - expected).max() < 0.05, precision  # a tiny random model: loose, but not vacuous
    assert not np.allclose(serving.load(int8, "openvino")(pixels), expected, atol=1e-6)  # it did quantize


def test_benchmark_serving_step_returns_probabilities():
    spec = dict(impl="serving", source="keras_vit", runtime="onnxruntime", precision="f32",
                model={**TINY, "num_classes": 5}, batch=2)
    probs = impls.serving_step(spec)()
    assert probs.shape == (2, 5)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


TIMM_STEP = """
import json, sys
import numpy as np
from benchmarks import impls
spec = json.loads(sys.argv[1])
probs = impls.serving_step(spec)()
print(json.dumps({"shape": list(probs.shape), "sums": probs.sum(-1).tolist()}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_benchmark_serves_timms_graph(runtime):
    """In a torch process, as the benchmark's torch worker does: torch.onnx's exporter imports triton,
    which crashes a process that has loaded TensorFlow (as Keras' exporters do)."""
    spec = dict(impl="serving", source="timm", runtime=runtime, precision="f32", model={**TINY, "num_classes": 5},
                batch=2)
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    out = subprocess.run([sys.executable, "-c", TIMM_STEP, json.dumps(spec)], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip().splitlines()[-1]
    result = json.loads(out)
    assert result["shape"] == [2, 5]
    np.testing.assert_allclose(result["sums"], 1.0, atol=1e-5)

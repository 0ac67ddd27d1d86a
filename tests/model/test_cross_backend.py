"""A `.keras` file saved on one backend loads in safe mode on the others with equal outputs."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
from tests.conftest import images, randomize, tiny_vit, to_numpy

LOAD = """
import json, sys, numpy as np, keras
import keras_vit  # registers the keras_vit classes with Keras
model = keras.saving.load_model(sys.argv[1], safe_mode=True)
x = np.load(sys.argv[2])
print(json.dumps({"backend": keras.backend.backend(),
                  "out": np.asarray(keras.ops.convert_to_numpy(model(x))).tolist()}))
"""


def test_keras_file_loads_on_every_other_backend(tmp_path):
    here = keras.backend.backend()
    model = randomize(tiny_vit(pooling="gap", representation_size=8, image_size=(32, 24)), scale=0.1)
    x = images((2, 32, 24, 3))
    expected = to_numpy(model(x))
    model.save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", x)
    for backend in {"tensorflow", "jax", "torch"} - {here}:
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
        result = subprocess.run(
            [sys.executable, "-c", LOAD, str(tmp_path / "m.keras"), str(tmp_path / "x.npy")],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        reply = json.loads(result.stdout.strip().splitlines()[-1])
        assert reply["backend"] == backend
        np.testing.assert_allclose(np.array(reply["out"]), expected, atol=1e-5)

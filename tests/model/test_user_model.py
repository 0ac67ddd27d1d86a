"""keras_vit layers inside somebody else's functional model: build, fit, save, load."""

import keras
import numpy as np
from tests.conftest import images, to_numpy

from keras_vit import layers


def build_user_model():
    inputs = keras.Input((32, 32, 3))
    x = layers.PatchEmbedding(48, 8)(inputs)  # (B, 16, 48)
    x = layers.PositionEmbedding((4, 4), num_prefix_tokens=0)(x)
    x = layers.TransformerBlock(num_heads=4, mlp_dim=96)(x)
    x = layers.TransformerBlock(num_heads=4, mlp_dim=96, drop_path_rate=0.1)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)  # the user's own head
    outputs = keras.layers.Dense(3)(x)
    return keras.Model(inputs, outputs)


def test_user_model_trains_saves_and_loads(tmp_path):
    model = build_user_model()
    x = images((48, 32, 32, 3))
    y = np.argmax(x.reshape(48, 3, -1).mean(-1), axis=1)  # which third of the pixels is brightest
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=16, epochs=5, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    path = tmp_path / "user.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(to_numpy(loaded(x[:4])), to_numpy(model(x[:4])), atol=1e-5)

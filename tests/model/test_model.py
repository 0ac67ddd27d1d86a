"""The ViT model: presets, the NumPy oracle, resizing, saving, mixed precision, bad input."""

import keras
import numpy as np
import pytest
from tests.conftest import TINY, images, randomize, tiny_vit, to_numpy

import keras_vit
from keras_vit.models.resize import variable_path
from tests.model.oracle import vit_forward

# Parameter counts at 224 px with 1000 classes, as in the paper and timm.
PAPER_COUNTS = {
    "ViT-Ti/16": 5_717_416,
    "ViT-S/16": 22_050_664,
    "ViT-B/16": 86_567_656,
    "ViT-L/16": 304_326_632,
    "ViT-H/14": 632_045_800,
}


@pytest.mark.parametrize("name", PAPER_COUNTS)
def test_preset_parameter_counts_equal_the_paper(name):
    # Counting from the config keeps ViT-H off the 2-core CI machine; one preset is built for real,
    # and tests/model/test_options.py checks count_params against built models of every option.
    config = keras_vit.preset_config(name)
    if name == "ViT-Ti/16":
        assert keras_vit.ViT.from_preset(name).count_params() == PAPER_COUNTS[name]
    assert keras_vit.count_params(dict(config, image_size=224, num_classes=1000)) == PAPER_COUNTS[name]


def test_from_preset_takes_overrides_and_records_its_name():
    model = keras_vit.ViT.from_preset("ViT-Ti/8", image_size=64, num_classes=3, num_layers=1)
    assert model.grid_size == (8, 8) and model.preset == "ViT-Ti/8"
    assert to_numpy(model(np.zeros((1, 64, 64, 3)))).shape == (1, 3)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown preset 'ViT-X/16'. Known presets: ViT-Ti/8, .*ViT-H/32"):
        keras_vit.ViT.from_preset("ViT-X/16")


CASES = {
    "token": dict(),
    "gap": dict(pooling="gap"),
    "gap_with_class_token": dict(pooling="gap", class_token=True),
    "pre_logits": dict(representation_size=16),
    "non_square": dict(image_size=(32, 20)),
    "tanh_gelu_layer_scale": dict(gelu_approximate=True, layer_scale_init=0.5),
    "features": dict(num_classes=0),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_the_numpy_oracle(case):
    model = randomize(tiny_vit(**CASES[case]))
    x = images((2, *model.image_size, 3))
    expected, _ = vit_forward(model, x)
    np.testing.assert_allclose(to_numpy(model(x)), expected, atol=1e-5, rtol=1e-5)


def test_oracle_fails_on_a_wrong_weight():
    """The oracle test can fail: one block's q and k swapped changes the logits."""
    model = randomize(tiny_vit())
    x = images()
    expected, _ = vit_forward(model, x)
    attn = model.encoder.blocks[0].attn
    q = to_numpy(attn.query_dense.kernel)
    attn.query_dense.kernel.assign(to_numpy(attn.key_dense.kernel))
    attn.key_dense.kernel.assign(q)
    assert np.abs(to_numpy(model(x)) - expected).max() > 1e-3


def test_feature_grid_is_the_patch_tokens_on_the_grid():
    model = randomize(tiny_vit(image_size=(32, 24)))
    x = images((2, 32, 24, 3))
    grid = to_numpy(model.feature_grid(x))
    tokens = to_numpy(model.forward_features(x))
    assert grid.shape == (2, 8, 6, 48)
    np.testing.assert_allclose(grid[:, 1, 2], tokens[:, 1 + 1 * 6 + 2], atol=1e-6)


def test_normalization_is_recorded_and_applied():
    model = tiny_vit(num_channels=1, image_mean=(0.2860,), image_std=(0.3530,))
    pixels = np.full((1, 32, 32, 1), 255, "uint8")
    np.testing.assert_allclose(to_numpy(model.normalize(pixels)), (1 - 0.2860) / 0.3530, rtol=1e-6)
    assert tiny_vit().image_mean == (0.5, 0.5, 0.5)


def test_resize_to_the_same_size_is_an_exact_copy():
    model = randomize(tiny_vit())
    same = keras_vit.resize(model, 32)
    for a, b in zip(model.weights, same.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    x = images()
    np.testing.assert_array_equal(to_numpy(model(x)), to_numpy(same(x)))


@pytest.mark.parametrize("method", ["bilinear", "bicubic"])
def test_resize_resamples_only_the_position_embedding(method):
    model = randomize(tiny_vit())
    big = keras_vit.resize(model, (48, 40), method=method)
    assert big.grid_size == (12, 10) and big.resample_method == method
    expected = keras_vit.layers.resample_position_embedding(
        to_numpy(model.position_embedding.embedding), (8, 8), (12, 10), 1, method
    )
    np.testing.assert_allclose(to_numpy(big.position_embedding.embedding), expected, atol=1e-6)
    for a, b in zip(model.weights, big.weights):
        if a is not model.position_embedding.embedding:
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    assert to_numpy(big(images((1, 48, 40, 3)))).shape == (1, 5)


def test_resize_recomputes_sincos_embeddings():
    model = tiny_vit(position_embedding="sincos", pooling="gap")
    big = keras_vit.resize(model, 48)
    np.testing.assert_allclose(to_numpy(big.position_embedding.embedding)[0], keras_vit.layers.sincos_2d((12, 12), 48),
                               atol=1e-6)


def test_variable_shapes_take_no_memory_now_or_later():
    model, shapes = keras_vit.models.variable_shapes(dict(TINY, num_register_tokens=2, pooling="map"))
    built = tiny_vit(num_register_tokens=2, pooling="map")
    assert shapes == {variable_path(v, built): tuple(v.shape) for v in built.weights}
    # Keras initializes (allocates) the variables left in its list when a stateless scope ends;
    # variable_shapes takes its own off that list. `_value` is Keras' private slot for the value.
    with keras.StatelessScope():
        pass
    assert all(v._value is None for v in model.weights)


def test_adapt_pairs_variables_by_path_and_names_what_is_missing():
    model = randomize(tiny_vit(representation_size=8, num_register_tokens=1))
    values = dict(reversed(keras_vit.models.weights(model).items()))  # the order of the weights plays no part
    config = model.get_config()
    same = keras_vit.models.adapt(values, model.grid_size, config)
    x = images()
    np.testing.assert_array_equal(to_numpy(same(x)), to_numpy(model(x)))
    # The paper's new head (§3.2): the pre-logits layer goes, the classifier starts at zero.
    head = keras_vit.models.adapt(values, model.grid_size, keras_vit.models.new_head_config(config, 3), new_head=True)
    assert head.representation_size is None and head.head.pre_logits is None
    assert not np.any(to_numpy(head.head.classifier.kernel)) and head.num_classes == 3
    np.testing.assert_array_equal(to_numpy(head.forward_features(x)), to_numpy(model.forward_features(x)))
    del values["encoder/block_1/fc2/bias"]
    with pytest.raises(ValueError, match=r"no value of the right shape for \['encoder/block_1/fc2/bias \(48,\)'\]"):
        keras_vit.models.adapt(values, model.grid_size, config)


def test_saved_model_loads_in_safe_mode_with_equal_outputs(tmp_path):
    model = randomize(tiny_vit(pooling="gap", representation_size=8, class_names=list("abcde")))
    path = tmp_path / "vit.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    x = images()
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)), atol=1e-6)
    assert loaded.get_config() == model.get_config()
    assert loaded.class_names == tuple("abcde")


def test_fit_reduces_the_loss():
    model = tiny_vit(num_classes=2)
    x = images((32, 32, 32, 3))
    y = (x[:, :16].mean(axis=(1, 2, 3)) > x[:, 16:].mean(axis=(1, 2, 3))).astype("int32")
    model.compile(keras.optimizers.AdamW(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=8, epochs=4, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_mixed_bfloat16_keeps_norms_in_float32_and_logits_close():
    reference = randomize(tiny_vit(), scale=0.05)
    x = images()
    expected = to_numpy(reference(x))
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = tiny_vit()
    for a, b in zip(reference.weights, model.weights):
        b.assign(a)
    block = model.encoder.blocks[0]
    assert block.attn.compute_dtype == "bfloat16"
    assert block.norm1.variable_dtype == "float32" and model.encoder.norm.gamma.dtype == "float32"
    tokens, scores = model.forward_features(x, return_attention_scores=True)
    # LayerNorm statistics are computed in float32 (keras.ops.layer_normalization upcasts), and
    # the attention rows still sum to one.
    np.testing.assert_allclose(to_numpy(keras.ops.sum(keras.ops.cast(scores[0], "float32"), -1)), 1, atol=2e-2)
    logits = to_numpy(model(x))
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
    np.testing.assert_allclose(logits, expected, atol=5e-2 * np.abs(expected).max())


BAD = [
    (dict(patch_size=5), r"patch_size=5 does not divide image_size=\(32, 32\)"),
    (dict(num_heads=5), r"num_heads=5 does not divide hidden_dim=48"),
    (dict(pooling="max"), r"pooling='max' is not allowed; use one of \('token', 'gap', 'map', 'none'\)"),
    (dict(hidden_dim=0), r"hidden_dim=0 is not allowed; use a positive integer"),
    (dict(image_size=-32), r"image_size=-32 is not allowed"),
    (dict(num_layers=-1), r"num_layers=-1 is not allowed; use a positive integer"),
    (dict(num_classes=-1), r"num_classes=-1 is not allowed; use a non-negative integer"),
    (dict(position_embedding="rope"), r"position_embedding='rope' is not allowed"),
    (dict(image_mean=(0.5,)), r"image_mean=\(0.5,\) has 1 values; num_channels=3"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[str(o) for o, _ in BAD])
def test_bad_configs_name_the_value_and_what_is_allowed(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_vit(**overrides)


def test_wrong_channel_count_and_size_are_clear_errors():
    model = tiny_vit()
    with pytest.raises(ValueError, match="images have 1 channels but this model takes num_channels=3"):
        model(np.zeros((1, 32, 32, 1), "float32"))
    with pytest.raises(ValueError, match=r"images are \(64, 64\).*image_size=\(32, 32\).*keras_vit.resize"):
        model(np.zeros((1, 64, 64, 3), "float32"))


def test_vit_get_config_is_exactly_the_constructor_arguments():
    import inspect

    params = set(inspect.signature(keras_vit.ViT.__init__).parameters) - {"self", "kwargs"}
    config = tiny_vit().get_config()
    assert set(config) - {"name", "trainable", "dtype"} == params
    clone = keras_vit.ViT.from_config(config)
    assert clone.get_config() == config


def test_pooling_none_and_first_token():
    """big_vision's pool_type "none" (every patch token classified) and "0" (the first patch token)."""
    none = randomize(tiny_vit(pooling="none"))
    x = images()
    out = to_numpy(none(x))
    assert out.shape == (2, 64, 5) == none.compute_output_shape(x.shape)
    first = tiny_vit(pooling="token", class_token=False)
    first.set_weights(none.get_weights())
    np.testing.assert_allclose(to_numpy(first(x)), out[:, 0], rtol=1e-5, atol=1e-6)
    assert keras_vit.ViT.from_config(none.get_config()).pooling == "none"

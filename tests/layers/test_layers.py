"""Each public layer: shapes, config round trip, `.keras` save and load, and its math."""

import dataclasses
import math

import keras
import numpy as np
import pytest
import scipy.ndimage
from tests.conftest import images, randomize, to_numpy

from keras_vit import layers
from keras_vit.layers.resample import LINEAR, resample_matrix, resample_weights
from tests.model.oracle import gelu, layer_norm, softmax


def _roundtrip(layer, x, tmp_path):
    """from_config(get_config()) and a one-layer `.keras` file both reproduce the layer's output."""
    y = to_numpy(layer(x))
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    inputs = keras.Input(x.shape[1:])
    model = keras.Model(inputs, layer(inputs))
    path = tmp_path / "layer.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(to_numpy(loaded(x)), y, atol=1e-6)
    return y


def _constructor_args(cls):
    import inspect

    args = {p for p in inspect.signature(cls.__init__).parameters} - {"self", "kwargs"}
    if "options" in args:  # the blocks and the encoder also take BlockConfig's fields
        args = args - {"options"} | ({f.name for f in dataclasses.fields(layers.BlockConfig)} - {"block"})
    return args


BASE_KEYS = {"name", "trainable", "dtype"}


@pytest.mark.parametrize(
    "layer",
    [
        layers.PatchEmbedding(48, 4),
        layers.PositionEmbedding((8, 8), num_prefix_tokens=1),
        layers.TransformerBlock(num_heads=3, mlp_dim=96, layer_scale_init=0.1),
        layers.Encoder(num_layers=2, num_heads=3, mlp_dim=96),
        layers.ClassifierHead(5, pooling="gap", representation_size=8),
        layers.LayerScale(0.1),
    ],
    ids=lambda layer: type(layer).__name__,
)
def test_get_config_is_exactly_the_constructor_arguments(layer):
    config = set(layer.get_config()) - BASE_KEYS
    if isinstance(layer, layers.Encoder):  # the block options are saved once, as the `block` dict
        assert set(layer.get_config()["block"]) == {f.name for f in dataclasses.fields(layers.BlockConfig)}
        config |= set(layer.get_config()["block"])
    assert config == _constructor_args(type(layer)) | ({"block"} if isinstance(layer, layers.Encoder) else set())


def test_patch_embedding_is_raster_order_and_non_square(tmp_path):
    layer = layers.PatchEmbedding(8, 4)
    x = images((2, 16, 24, 3))
    y = _roundtrip(layer, x, tmp_path)
    assert y.shape == (2, 4 * 6, 8)
    # Token 7 is grid cell (row 1, column 1): pixels [4:8, 4:8].
    kernel, bias = to_numpy(layer.conv.kernel), to_numpy(layer.conv.bias)
    expected = np.einsum("hwc,hwcd->d", x[0, 4:8, 4:8], kernel) + bias
    np.testing.assert_allclose(y[0, 7], expected, atol=1e-5)
    assert layer.compute_output_shape((None, 16, 24, 3)) == (None, 24, 8)


def test_class_token_prepends_one_learned_row(tmp_path):
    layer = layers.ClassToken()
    x = images((2, 5, 8))
    y = _roundtrip(layer, x, tmp_path)
    assert y.shape == (2, 6, 8)
    np.testing.assert_array_equal(y[:, 1:], x)
    np.testing.assert_array_equal(y[:, 0], np.zeros((2, 8)))


@pytest.mark.parametrize("kind", ["learned", "sincos"])
def test_position_embedding_adds_its_table(kind, tmp_path):
    layer = layers.PositionEmbedding((2, 3), num_prefix_tokens=1, kind=kind)
    x = images((2, 7, 8))
    y = _roundtrip(layer, x, tmp_path)
    np.testing.assert_allclose(y - x, np.broadcast_to(to_numpy(layer.embedding), y.shape), atol=1e-6)
    assert layer.embedding.trainable == (kind == "learned")


def test_factorized_position_embedding_adds_a_row_and_a_column(tmp_path):
    layer = layers.PositionEmbedding((2, 3), num_prefix_tokens=1, kind="factorized")
    x = images((2, 7, 8))
    y = _roundtrip(layer, x, tmp_path)
    rows, cols = to_numpy(layer.rows)[0], to_numpy(layer.columns)[0]  # (2, 8), (3, 8)
    assert (rows.shape, cols.shape) == ((2, 8), (3, 8))
    np.testing.assert_allclose(y[:, 0], x[:, 0], atol=1e-6)  # the prefix token gets no position
    np.testing.assert_allclose(y[:, 1 + 1 * 3 + 2] - x[:, 1 + 1 * 3 + 2], np.broadcast_to(rows[1] + cols[2], (2, 8)),
                               atol=1e-6)  # patch (row 1, column 2)


def test_sincos_table_is_the_2d_formula():
    table = layers.sincos_2d((3, 4), 8, num_prefix_tokens=1)
    assert table.shape == (13, 8)
    np.testing.assert_array_equal(table[0], 0)
    # Token at grid (y=2, x=3): channels sin(x w), cos(x w), sin(y w), cos(y w), w = (1, 1e-4).
    omega = np.array([1.0, 1e-4])
    expected = np.concatenate([np.sin(3 * omega), np.cos(3 * omega), np.sin(2 * omega), np.cos(2 * omega)])
    np.testing.assert_allclose(table[1 + 2 * 4 + 3], expected, atol=1e-6)


def test_bilinear_resampling_is_scipy_zoom_order_1_and_keeps_the_class_row():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(1 + 4 * 5, 6)).astype("float32")
    out = layers.resample_position_embedding(table, (4, 5), (7, 3), num_prefix_tokens=1, method="bilinear")
    assert out.shape == (1 + 7 * 3, 6)
    np.testing.assert_array_equal(out[0], table[0])
    expected = scipy.ndimage.zoom(table[1:].reshape(4, 5, 6).astype("float64"), (7 / 4, 3 / 5, 1), order=1)
    np.testing.assert_allclose(out[1:].reshape(7, 3, 6), expected, atol=1e-6)
    # Corners are aligned: the corner rows are copied.
    np.testing.assert_allclose(out[1], table[1], atol=1e-6)
    np.testing.assert_allclose(out[-1], table[-1], atol=1e-6)


@pytest.mark.parametrize("new_grid", [(7, 3), (2, 9), (4, 5), (12, 10)])
def test_bicubic_resampling_matches_torch_antialiased_interpolate(new_grid):
    import torch  # the oracle for timm's resampling; a test dependency
    rng = np.random.default_rng(1)
    table = rng.normal(size=(1 + 4 * 5, 6)).astype("float32")
    out = layers.resample_position_embedding(table, (4, 5), new_grid, num_prefix_tokens=1, method="bicubic")
    grid = torch.from_numpy(table[1:].reshape(1, 4, 5, 6)).permute(0, 3, 1, 2).double()
    ref = torch.nn.functional.interpolate(grid, size=new_grid, mode="bicubic", antialias=True, align_corners=False)
    ref = ref.permute(0, 2, 3, 1).reshape(-1, 6).numpy()
    np.testing.assert_array_equal(out[0], table[0])
    np.testing.assert_allclose(out[1:], ref, atol=1e-5)


@pytest.mark.parametrize("n_out", [3, 4, 9])
def test_linear_resampling_matches_torch_linear_interpolate(n_out):
    """timm's resampling of factorized position tables: `F.interpolate(mode="linear")`, half-pixel."""
    import torch

    table = np.random.default_rng(3).normal(size=(4, 6))
    matrix = resample_matrix(4, n_out, LINEAR)
    ref = torch.nn.functional.interpolate(torch.from_numpy(table.T[None]), size=n_out, mode="linear",
                                          align_corners=False)[0].numpy().T
    np.testing.assert_allclose(matrix @ table, ref, atol=1e-12)


@pytest.mark.parametrize("method", [*layers.RESAMPLE_METHODS, LINEAR])
def test_resample_weights_of_each_point_are_the_rows_of_the_matrix(method):
    """Per-point weights (a patch sequence's tokens, each on its own grid) are the matrix rows, in
    NumPy and in keras.ops."""
    for n_in, n_out in ((8, 3), (8, 13), (5, 5)):
        matrix = resample_matrix(n_in, n_out, method)
        index, size = np.arange(n_out, dtype="float64"), np.full(n_out, float(n_out))
        np.testing.assert_allclose(resample_weights(index, size, n_in, method), matrix, atol=1e-12)
        got = resample_weights(keras.ops.convert_to_tensor(index, "float32"),
                               keras.ops.convert_to_tensor(size, "float32"), n_in, method, xp=keras.ops)
        np.testing.assert_allclose(to_numpy(got), matrix, atol=1e-5)


def test_resampling_to_the_same_grid_is_the_identity():
    table = np.random.default_rng(2).normal(size=(1, 17, 4)).astype("float32")
    out = layers.resample_position_embedding(table, (4, 4), (4, 4), method="bicubic")
    np.testing.assert_array_equal(out, table)


def test_resampling_rejects_bad_arguments():
    table = np.zeros((17, 4))
    with pytest.raises(ValueError, match="method='nearest'.*bilinear"):
        layers.resample_position_embedding(table, (4, 4), (5, 5), method="nearest")
    with pytest.raises(ValueError, match="17 rows.*needs 26"):
        layers.resample_position_embedding(table, (5, 5), (6, 6))


@pytest.mark.parametrize("approximate", [False, True])
def test_transformer_block_follows_the_pre_norm_equations(approximate, tmp_path):
    block = layers.TransformerBlock(num_heads=3, mlp_dim=16, layer_norm_epsilon=1e-6, gelu_approximate=approximate)
    x = images((2, 5, 12))
    y = _roundtrip(block, x, tmp_path)
    out, scores = block(x, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(out), y, atol=1e-6)
    assert tuple(scores.shape) == (2, 3, 5, 5)

    w = lambda v: to_numpy(v).astype("float64")  # noqa: E731
    h = layer_norm(x, w(block.norm1.gamma), w(block.norm1.beta), 1e-6)
    attn = block.attn
    q, k, v = (np.einsum("btd,dkh->bkth", h, w(d.kernel)) + w(d.bias)[:, None]
               for d in (attn.query_dense, attn.key_dense, attn.value_dense))
    a = softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(4))
    z = x + np.einsum("bkth,khd->btd", a @ v, w(attn.output_dense.kernel)) + w(attn.output_dense.bias)
    m = gelu(layer_norm(z, w(block.norm2.gamma), w(block.norm2.beta), 1e-6) @ w(block.fc1.kernel)
             + w(block.fc1.bias), approximate)
    expected = z + m @ w(block.fc2.kernel) + w(block.fc2.bias)
    np.testing.assert_allclose(y, expected, atol=1e-5)
    np.testing.assert_allclose(to_numpy(scores), a, atol=1e-6)


def test_gelu_choice_changes_the_output():
    x = images((1, 5, 12))
    exact = layers.TransformerBlock(num_heads=3, mlp_dim=16, gelu_approximate=False)
    approx = layers.TransformerBlock(num_heads=3, mlp_dim=16, gelu_approximate=True)
    exact.build(x.shape)
    approx.build(x.shape)
    for a, b in zip(exact.weights, approx.weights):
        b.assign(a)
    diff = np.abs(to_numpy(exact(x)) - to_numpy(approx(x))).max()
    assert 1e-6 < diff < 1e-2


def test_drop_path_drops_whole_samples_only_in_training():
    block = layers.TransformerBlock(num_heads=3, mlp_dim=16, drop_path_rate=0.5)
    x = images((64, 5, 12))
    block.build(x.shape)
    np.testing.assert_array_equal(to_numpy(block(x, training=False)), to_numpy(block(x)))
    y = to_numpy(block(x, training=True))
    # A sample whose two branches were both dropped is returned unchanged, token for token.
    unchanged = np.all(np.isclose(y, x, atol=1e-7), axis=(1, 2))
    assert 0 < unchanged.sum() < 64


def test_parts_that_are_switched_off_are_not_called(monkeypatch):
    """Dropout outside training or of rate 0, and an absent LayerScale, cost no Keras layer call;
    dropout in training is called and changes the output."""
    calls = []
    call = keras.layers.Layer.__call__
    monkeypatch.setattr(keras.layers.Layer, "__call__",
                        lambda self, *a, **k: calls.append(self.name) or call(self, *a, **k))
    block = layers.TransformerBlock(num_heads=3, mlp_dim=16, dropout_rate=0.5)
    x = images((4, 5, 12))
    block.build(x.shape)
    calls.clear()
    inference = to_numpy(block(x))
    assert not [name for name in calls if name.startswith(("dropout", "drop_path", "ls"))], calls
    calls.clear()
    training = to_numpy(block(x, training=True))
    assert calls.count("dropout") == 3 and "drop_path" not in calls, calls  # drop_path_rate is 0
    assert not np.allclose(training, inference)


def test_layer_scale_multiplies_each_branch(tmp_path):
    block = layers.TransformerBlock(num_heads=3, mlp_dim=16, layer_scale_init=0.0)
    x = images((2, 5, 12))
    # With a zero LayerScale both residual branches vanish: the block is the identity.
    np.testing.assert_allclose(_roundtrip(block, x, tmp_path), x, atol=1e-7)


def test_block_rejects_heads_that_do_not_divide_the_width():
    with pytest.raises(ValueError, match="num_heads=5 does not divide the width 12"):
        layers.TransformerBlock(num_heads=5, mlp_dim=16).build((None, 5, 12))


def test_encoder_stacks_blocks_with_linear_drop_path_and_a_final_norm(tmp_path):
    encoder = layers.Encoder(num_layers=3, num_heads=3, mlp_dim=16, drop_path_rate=0.2)
    x = images((2, 5, 12))
    y = _roundtrip(encoder, x, tmp_path)
    assert [b.config.drop_path_rate for b in encoder.blocks] == pytest.approx([0.0, 0.1, 0.2])
    z = x
    for block in encoder.blocks:
        z = block(z)
    np.testing.assert_allclose(y, to_numpy(encoder.norm(z)), atol=1e-6)
    out, scores = encoder(x, return_attention_scores=True)
    assert len(scores) == 3


@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_head_pools_then_pre_logits_then_zero_classifier(pooling, tmp_path):
    head = layers.ClassifierHead(4, pooling=pooling, representation_size=6, kernel_initializer="zeros")
    x = images((2, 5, 12))
    y = _roundtrip(head, x, tmp_path)
    np.testing.assert_array_equal(y, 0)  # the fine-tuning classifier starts at zero
    assert np.any(to_numpy(layers.ClassifierHead(4)(x)))  # the default (from scratch) does not
    head.classifier.kernel.assign(np.ones((6, 4)))
    pooled = x[:, 0] if pooling == "token" else x[:, 1:].mean(1)
    pre = np.tanh(pooled @ to_numpy(head.pre_logits.kernel) + to_numpy(head.pre_logits.bias))
    np.testing.assert_allclose(to_numpy(head(x)), pre @ np.ones((6, 4)), atol=1e-5)


def test_head_without_classes_returns_features():
    head = layers.ClassifierHead(0, pooling="token")
    assert to_numpy(head(images((2, 5, 12)))).shape == (2, 12)


def test_head_rejects_unknown_pooling():
    with pytest.raises(ValueError, match="pooling='max'.*'token', 'gap'"):
        layers.ClassifierHead(3, pooling="max")


@pytest.mark.parametrize("qk_norm,qkv_bias", [(False, True), (True, True), (False, False)])
def test_fused_attention_equals_keras_multi_head_attention(qk_norm, qkv_bias, monkeypatch):
    """The one-product self-attention gives Keras' result with Keras' variables, and is the path taken."""
    attn = layers.Attention(num_heads=3, key_dim=4, qk_norm=qk_norm, qkv_bias=qkv_bias)
    x = keras.ops.convert_to_tensor(images((2, 5, 12)))  # one tensor as query and value: self-attention
    attn.build(x.shape, x.shape)
    rng = np.random.default_rng(0)
    for v in attn.weights:
        v.assign(rng.normal(0.0, 0.5, v.shape).astype("float32"))
    names = {v.path.split("/", 1)[1] for v in attn.weights}
    assert {"query/kernel", "key/kernel", "value/kernel", "attention_output/kernel"} <= names
    assert attn.query_dense.kernel.shape == (12, 3, 4) and attn.output_dense.kernel.shape == (3, 4, 12)
    expected = [to_numpy(attn(x, x, return_attention_scores=True)[0]),  # Keras' einsum-softmax-einsum
                to_numpy(attn(x, x + 0.0))]  # another tensor as value: Keras' dot_product_attention
    if not qk_norm and qkv_bias:  # plain Keras with the same weights
        plain = keras.layers.MultiHeadAttention(num_heads=3, key_dim=4)
        plain.build(x.shape, x.shape)
        plain.set_weights(attn.get_weights())
        expected.append(to_numpy(plain(x, x)))
    calls = []
    monkeypatch.setattr(keras.layers.MultiHeadAttention, "call", lambda *a, **k: calls.append(1))
    fused = to_numpy(attn(x, x))
    assert calls == []
    for y in expected:
        np.testing.assert_allclose(fused, y, atol=1e-6 * np.abs(y).max())


def _attention_and_keras(x, **options):
    """An `Attention` and a Keras `MultiHeadAttention` with the same random weights."""
    attn, plain = layers.Attention(num_heads=3, key_dim=4, **options), keras.layers.MultiHeadAttention(3, 4, **options)
    attn.build(x.shape, x.shape)
    plain.build(x.shape, x.shape)
    rng = np.random.default_rng(0)
    plain.set_weights([rng.normal(0.0, 0.5, w.shape).astype("float32") for w in plain.get_weights()])
    attn.set_weights(plain.get_weights())
    return attn, plain


@pytest.mark.parametrize("option", [dict(use_gate=True), dict(sliding_window=2), dict(output_shape=(6,))])
def test_keras_options_the_fused_path_cannot_compute_take_keras_path(option):
    """A gate, a sliding window or another output shape (read from Keras' private attributes) send
    the call to Keras' own path, so the result is Keras' result."""
    x = keras.ops.convert_to_tensor(images((2, 5, 12)))
    attn, plain = _attention_and_keras(x, **option)
    np.testing.assert_allclose(to_numpy(attn(x, x)), to_numpy(plain(x, x)), atol=1e-6)


def test_masked_keys_are_masked_as_in_keras():
    x = images((2, 5, 12))
    x[:, -2:] = 0.0  # the last two tokens are masked out

    def masked():  # a new tensor each time: MultiHeadAttention clears the masks of its inputs
        return keras.layers.Masking(0.0)(keras.ops.convert_to_tensor(x))

    attn, plain = _attention_and_keras(masked())
    out, expected = to_numpy(attn(*[masked()] * 2)), to_numpy(plain(*[masked()] * 2))
    np.testing.assert_allclose(out, expected, atol=1e-6)
    unmasked = keras.ops.convert_to_tensor(x)
    assert np.abs(out - to_numpy(attn(unmasked, unmasked))).max() > 1e-2  # the mask mattered


def test_attention_mask_takes_the_fused_path_and_equals_attention_on_the_valid_keys(monkeypatch):
    """A key mask (B, 1, S) through the one-product path: each query attends to its own sample's
    valid keys only, as Keras' path and as the attention of the valid tokens alone give it."""
    x = keras.ops.convert_to_tensor(images((2, 6, 12)))
    attn, _ = _attention_and_keras(x)
    valid = np.array([[True] * 6, [True] * 4 + [False] * 2])
    mask = keras.ops.convert_to_tensor(valid[:, None, :])  # (B, 1, S)
    keras_path = to_numpy(attn(x, x, attention_mask=mask, return_attention_scores=True)[0])
    alone = to_numpy(attn(x[1:, :4], x[1:, :4]))  # the second sample's valid tokens, unpadded
    calls = []
    monkeypatch.setattr(keras.layers.MultiHeadAttention, "call", lambda *a, **k: calls.append(1))
    fused = to_numpy(attn(x, x, attention_mask=mask))
    assert calls == []
    np.testing.assert_allclose(fused, keras_path, atol=1e-5)
    np.testing.assert_allclose(fused[1, :4], alone[0], atol=1e-5)
    assert np.abs(fused[1] - to_numpy(attn(x, x))[1]).max() > 1e-2  # the mask mattered


def test_encoder_with_a_key_mask_equals_the_encoder_on_the_valid_tokens():
    """Padding keys masked in every block: a padded sequence's valid rows are the unpadded ones'."""
    encoder = layers.Encoder(2, num_heads=3, mlp_dim=24)
    x = keras.ops.convert_to_tensor(images((1, 7, 12)))
    encoder.build(x.shape)
    randomize(encoder)
    mask = keras.ops.convert_to_tensor(np.arange(7)[None, None] < 5)  # (1, 1, S): two padding tokens
    padded = to_numpy(encoder(x, attention_mask=mask))
    np.testing.assert_allclose(padded[:, :5], to_numpy(encoder(x[:, :5])), atol=1e-5)
    scores = encoder(x, attention_mask=mask, return_attention_scores=True)[1]
    assert np.abs(to_numpy(scores[0])[..., 5:]).max() == 0.0  # no probability on a padding key

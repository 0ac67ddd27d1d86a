"""keras_vit/explain/maps.py and figure7.py: attention maps and rollout against the oracle, on a
loaded model, under jit, and free when unused; the one-pass summary; mean attention distance;
position-embedding similarity."""

import keras
import numpy as np
import pytest
from tests.conftest import images, randomize, tiny_vit, to_numpy

import keras_vit
from tests.model.oracle import vit_forward


def numpy_rollout(maps, num_prefix, first_token, grid):
    """Abnar & Zuidema (2020) in NumPy: mean heads, + I, renormalize rows, multiply up the layers; the
    first token's row (`first_token`, the head reads it) or the mean patch row."""
    a = maps.mean(axis=2)  # (B, L, T, T)
    a = a + np.eye(a.shape[-1])
    a = a / a.sum(-1, keepdims=True)
    r = a[:, 0]
    for layer in range(1, a.shape[1]):
        r = a[:, layer] @ r
    row = r[:, 0, num_prefix:] if first_token else r[:, num_prefix:, num_prefix:].mean(1)
    return row.reshape(-1, *grid)


# The row that rollout and the summary read is the head's: the first token for pooling "token", with or
# without a class token, and the mean patch row otherwise, even beside a class token.
HEADS = [("token", None), ("gap", None), ("gap", True), ("token", False)]


@pytest.mark.parametrize("pooling, class_token", HEADS)
def test_maps_and_rollout_match_the_oracle(pooling, class_token):
    model = randomize(tiny_vit(pooling=pooling, class_token=class_token, image_size=(32, 24)), scale=0.1)
    x = images((2, 32, 24, 3))
    _, expected = vit_forward(model, x)
    maps = to_numpy(keras_vit.attention_maps(model, x))
    assert maps.shape == (2, 2, 3, model.num_prefix_tokens + 48, model.num_prefix_tokens + 48)
    np.testing.assert_allclose(maps, expected, atol=1e-6)
    rollout = to_numpy(keras_vit.attention_rollout(model, x))
    assert rollout.shape == (2, 8, 6)
    np.testing.assert_allclose(rollout, numpy_rollout(expected, model.num_prefix_tokens, pooling == "token", (8, 6)),
                               atol=1e-6)


def test_rollout_of_uniform_attention_is_uniform():
    # With zero query and key kernels every row of every map is uniform, and so is the rollout.
    model = randomize(tiny_vit())
    for block in model.encoder.blocks:
        for dense in (block.attn.query_dense, block.attn.key_dense):
            dense.kernel.assign(np.zeros(dense.kernel.shape))
            dense.bias.assign(np.zeros(dense.bias.shape))
    rollout = to_numpy(keras_vit.attention_rollout(model, images()))
    np.testing.assert_allclose(rollout, rollout[0, 0, 0], rtol=1e-5)


def test_works_on_a_model_loaded_from_disk(tmp_path):
    model = randomize(tiny_vit(), scale=0.1)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    x = images()
    np.testing.assert_allclose(
        to_numpy(keras_vit.attention_rollout(loaded, x)), to_numpy(keras_vit.attention_rollout(model, x)), atol=1e-6
    )


def test_works_under_jit():
    model = randomize(tiny_vit(), scale=0.1)
    x = images()
    eager = to_numpy(keras_vit.attention_rollout(model, x))
    fn = lambda batch: keras_vit.attention_rollout(model, batch)  # noqa: E731
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        compiled = jax.jit(fn)
    elif backend == "tensorflow":
        import tensorflow as tf

        compiled = tf.function(fn, jit_compile=True)
    else:
        import torch

        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    np.testing.assert_allclose(to_numpy(compiled(keras.ops.convert_to_tensor(x))), eager, atol=1e-5)


def test_normal_forward_pass_never_forms_attention_probabilities(monkeypatch):
    """The plain call takes the fused `ops.dot_product_attention` path of MultiHeadAttention; only
    `attention_maps` goes through the explicit softmax."""
    model = randomize(tiny_vit())
    x = images()
    calls = []

    def refuse(self, scores, mask=None):
        calls.append(scores.shape)
        raise AssertionError("attention probabilities were materialized")

    monkeypatch.setattr(keras.layers.MultiHeadAttention, "_masked_softmax", refuse)
    model(x)
    model.predict(x, verbose=0)
    assert calls == []
    with pytest.raises(AssertionError, match="materialized"):
        keras_vit.attention_maps(model, x)


@pytest.mark.parametrize("pooling, class_token", HEADS)
def test_selections_equal_slices_of_all_maps(pooling, class_token):
    model = randomize(tiny_vit(pooling=pooling, class_token=class_token, num_layers=3), scale=0.1)
    x = images()
    full = to_numpy(keras_vit.attention_maps(model, x))  # (B, L, K, T, T)
    p = model.num_prefix_tokens
    picked = to_numpy(keras_vit.attention_maps(model, x, layers=[-1, 0], heads=[2, 0]))
    np.testing.assert_allclose(picked, full[:, [2, 0]][:, :, [2, 0]], atol=1e-6)
    mean = to_numpy(keras_vit.attention_maps(model, x, layers=1, head_mean=True))
    np.testing.assert_allclose(mean, full[:, [1]].mean(axis=2), atol=1e-6)
    row = to_numpy(keras_vit.attention_maps(model, x, head_mean=True, query="summary"))  # (B, L, T)
    expected = full.mean(axis=2)[..., 0, :] if pooling == "token" else full.mean(axis=2)[..., p:, :].mean(axis=-2)
    np.testing.assert_allclose(row, expected, atol=1e-6)


def test_rollout_from_head_mean_maps_equals_the_direct_rollout():
    model = randomize(tiny_vit(), scale=0.1)
    x = images()
    direct = to_numpy(keras_vit.attention_rollout(model, x))
    means = keras_vit.attention_maps(model, x, head_mean=True)
    np.testing.assert_allclose(to_numpy(keras_vit.attention_rollout(model, None, maps=means)), direct, atol=1e-6)
    expected = numpy_rollout(to_numpy(keras_vit.attention_maps(model, x)), 1, True, model.grid_size)
    np.testing.assert_allclose(direct, expected, atol=1e-6)


@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_summary_equals_the_model_summary_maps_and_rollout(pooling):
    model = randomize(tiny_vit(pooling=pooling, num_layers=3), scale=0.1)
    x = images()
    logits, rows, rollout = keras_vit.explain.attention_summary(model, x)
    np.testing.assert_allclose(to_numpy(logits), to_numpy(model(x)), atol=1e-5)
    assert tuple(rows.shape) == (2, 3, 3, model.num_prefix_tokens + 64) and tuple(rollout.shape) == (2, 8, 8)
    summary = to_numpy(keras_vit.attention_maps(model, x, query="summary"))
    np.testing.assert_allclose(to_numpy(rows), summary, atol=1e-6)
    np.testing.assert_allclose(to_numpy(rollout), to_numpy(keras_vit.attention_rollout(model, x)), atol=1e-6)


def test_bad_selections_are_refused():
    model = tiny_vit()
    with pytest.raises(ValueError, match=r"layers=\(2,\) is not allowed"):
        keras_vit.attention_maps(model, images(), layers=2)
    with pytest.raises(ValueError, match=r"heads=\(\) is not allowed"):
        keras_vit.attention_maps(model, images(), heads=[])
    with pytest.raises(ValueError, match="query='cls' is not allowed"):
        keras_vit.attention_maps(model, images(), query="cls")


def test_mean_attention_distance_of_uniform_and_self_attention():
    model = randomize(tiny_vit())
    x = images()
    maps = to_numpy(keras_vit.attention_maps(model, x))
    t = maps.shape[-1]
    # Attention on itself only: distance 0. Uniform attention: the mean pairwise patch distance.
    eye = np.broadcast_to(np.eye(t), maps.shape)
    np.testing.assert_allclose(keras_vit.mean_attention_distance(model, x, maps=eye), 0, atol=1e-9)
    uniform = np.full(maps.shape, 1.0 / t)
    yy, xx = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    c = np.stack([yy.ravel(), xx.ravel()], 1) * 4.0
    mean_pairwise = np.linalg.norm(c[:, None] - c[None], axis=-1).mean()
    dist = keras_vit.mean_attention_distance(model, x, maps=uniform)
    assert dist.shape == (2, 3)
    np.testing.assert_allclose(dist, mean_pairwise, rtol=1e-6)
    real = keras_vit.mean_attention_distance(model, x)
    assert real.shape == (2, 3) and np.all((real > 0) & (real < 4 * 8 * np.sqrt(2)))


def test_position_embedding_similarity_is_cosine_on_the_grid():
    model = randomize(tiny_vit(image_size=(32, 24)))
    sim = keras_vit.position_embedding_similarity(model)
    assert sim.shape == (8, 6, 8, 6)
    np.testing.assert_allclose(np.einsum("ijij->ij", sim), 1, atol=1e-6)
    table = to_numpy(model.position_embedding.embedding)[0, 1:]
    a, b = table[1 * 6 + 2], table[5 * 6 + 0]
    np.testing.assert_allclose(sim[1, 2, 5, 0], a @ b / np.linalg.norm(a) / np.linalg.norm(b), atol=1e-6)

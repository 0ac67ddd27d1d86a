"""Multiply-adds, mean attention distance and position-embedding similarity."""

import numpy as np
import pytest
from conftest import images, randomize, tiny_vit, to_numpy

import keras_vit


@pytest.mark.parametrize(
    "patch,tokens,attention,linear",
    [(8, 785, 0.947, 5.556), (16, 197, 0.060, 1.394), (32, 50, 0.004, 0.354)],
)
def test_block_macs_reproduce_the_seed_table(patch, tokens, attention, linear):
    """Seed 000, "Patch size as a cost dial": 224 px, D = 768, GMAC per block to 3 decimals."""
    cost = keras_vit.model_macs(dict(keras_vit.preset_config(f"ViT-B/{patch}"), image_size=224))
    assert cost["tokens"] == tokens
    assert round(cost["block"]["attention"] / 1e9, 3) == attention
    assert round(cost["block"]["linear"] / 1e9, 3) == linear


def test_vit_s16_costs_4_60_gmac():
    cost = keras_vit.model_macs(dict(keras_vit.preset_config("ViT-S/16"), image_size=224, num_classes=1000))
    assert round(cost["total"] / 1e9, 2) == 4.60


def test_model_macs_accepts_a_model():
    model = tiny_vit()
    cost = keras_vit.model_macs(model)
    assert cost["tokens"] == 65
    assert cost["total"] == cost["patch_embedding"] + cost["blocks"] + cost["head"]
    assert cost["patch_embedding"] == 64 * 4 * 4 * 3 * 48


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

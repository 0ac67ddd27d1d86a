"""The seed's "Minimum shape checks" (seed 001, Reproduction Specification, items 1-7)."""

import numpy as np
import pytest
from tests.conftest import images, randomize, tiny_vit, to_numpy

import keras_vit


@pytest.mark.parametrize("image_size,patch", [((32, 32), 4), ((32, 24), 8), ((28, 28), 7)])
def test_1_patchification_gives_hw_over_p2_patches(image_size, patch):
    model = tiny_vit(image_size=image_size, patch_size=patch)
    tokens = model.patch_embedding(images((1, *image_size, 3)))
    assert tokens.shape[1] == image_size[0] * image_size[1] // patch**2


def test_2_patch_projection_gives_width_d():
    model = tiny_vit(hidden_dim=36, num_heads=3)
    assert model.patch_embedding(images()).shape[-1] == 36
    assert tuple(model.patch_embedding.conv.kernel.shape) == (4, 4, 3, 36)


@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_3_class_token_and_position_table_agree_on_length(pooling):
    model = tiny_vit(pooling=pooling)
    n = 64 + (1 if pooling == "token" else 0)
    assert model.position_embedding.embedding.shape == (1, n, 48)
    assert model.forward_features(images()).shape == (2, n, 48)


def test_4_each_head_has_the_declared_width():
    model = tiny_vit(hidden_dim=48, num_heads=4)
    attn = model.encoder.blocks[0].attn
    assert tuple(attn.query_dense.kernel.shape) == (48, 4, 12)
    assert tuple(attn.output_dense.kernel.shape) == (4, 12, 48)
    maps = keras_vit.attention_maps(model, images())
    assert tuple(maps.shape) == (2, 2, 4, 65, 65)


def test_5_residual_stream_keeps_n_plus_1_by_d_through_every_block():
    model = tiny_vit(num_layers=3)
    x = model.position_embedding(model.cls_token(model.patch_embedding(images())))
    for block in model.encoder.blocks:
        x = block(x)
        assert x.shape == (2, 65, 48)


@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_6_classifier_reads_the_documented_representation(pooling):
    model = randomize(tiny_vit(pooling=pooling, num_classes=0))
    x = images()
    features = to_numpy(model(x))
    tokens = to_numpy(model.forward_features(x))
    expected = tokens[:, 0] if pooling == "token" else tokens[:, 1:].mean(1) if model.class_token else tokens.mean(1)
    np.testing.assert_allclose(features, expected, atol=1e-6)


def test_7_resolution_transfer_changes_only_the_declared_components():
    model = randomize(tiny_vit())
    big = keras_vit.resize(model, 64)
    changed = [a.path for a, b in zip(model.weights, big.weights)
               if a.shape != b.shape or not np.array_equal(to_numpy(a), to_numpy(b))]
    assert changed == [model.position_embedding.embedding.path]
    assert big.position_embedding.embedding.shape == (1, 1 + 16 * 16, 48)

"""Explanations of patch sequences: attention rollout and class relevance on the padded form give
each image's map on its own grid, the padding masked as in the model."""

import numpy as np
import pytest
from tests.conftest import random_vit, to_numpy

import keras_vit
from keras_vit import naflex

SHAPES = [(32, 32), (20, 60), (70, 12)]


def _images():
    rng = np.random.default_rng(0)
    return [rng.uniform(0, 255, (*s, 3)).astype("float32") for s in SHAPES]


def _padded(batch, extra=8):
    """The same sequences padded by `extra` more tokens."""
    return {k: np.concatenate([v, np.zeros_like(v[:, :extra])], axis=1) for k, v in batch.items()}


@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_maps_of_patch_sequences_are_each_images_grid_whatever_the_padding(pooling):
    model = random_vit(pooling=pooling, class_token=pooling == "token")
    images = _images()
    batch = naflex.patch_sequences(images, 4, 64)
    grids = [tuple(int(v) for v in c[m].max(0) + 1) for c, m in zip(batch["patch_coord"], batch["patch_valid"])]
    assert grids == [(8, 8), (4, 12), (18, 3)]
    for explain in (keras_vit.attention_rollout, lambda m, x: keras_vit.class_relevance(m, x, classes=2)):
        maps = explain(model, batch)
        assert [m.shape for m in maps] == grids
        again = explain(model, _padded(batch))  # padding changes nothing
        for m, n in zip(maps, again):
            np.testing.assert_allclose(n, m, rtol=1e-4, atol=1e-6)
        alone = explain(model, naflex.patch_sequences(images[1:2], 4, 48))  # the wide image, unpadded
        np.testing.assert_allclose(alone[0], maps[1], rtol=1e-4, atol=1e-6)
        square = to_numpy(explain(model, ((images[0] / 255.0 - 0.5) / 0.5)[None]))  # at the table's grid
        np.testing.assert_allclose(maps[0], square[0], rtol=1e-4, atol=1e-6)
        assert np.abs(maps[1]).max() > 0


def test_summary_rows_of_patch_sequences_leave_the_padding_out():
    model = random_vit(pooling="gap")
    batch = naflex.patch_sequences(_images(), 4, 64)
    rows = to_numpy(keras_vit.attention_maps(model, batch, layers=[-1], head_mean=True, query="summary"))[:, 0]
    alone = to_numpy(keras_vit.attention_maps(model, naflex.patch_sequences(_images()[2:], 4, 54), layers=[-1],
                                              head_mean=True, query="summary"))[0, 0]
    np.testing.assert_allclose(rows[2, :54], alone, rtol=1e-4, atol=1e-7)
    assert np.abs(rows[1, 48:]).max() == 0.0  # no attention to the padding


def test_several_classes_of_one_patch_sequence_give_one_map_each_on_its_grid():
    model = random_vit(pooling="gap")
    batch = naflex.patch_sequences(_images()[1:2], 4, 64)  # the wide image: a 4 x 12 grid, padded to 64
    maps = keras_vit.class_relevance(model, batch, [3, 0, 1])
    assert [m.shape for m in maps] == [(4, 12)] * 3
    for c, m in zip([3, 0, 1], maps):
        np.testing.assert_allclose(m, keras_vit.class_relevance(model, batch, c)[0], rtol=1e-4, atol=1e-7)
    assert not np.allclose(maps[0], maps[1])

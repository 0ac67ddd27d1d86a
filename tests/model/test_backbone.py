"""A ViT for any input size and dense tasks (docs/backbone.md): `dynamic_image_size` and
`forward_intermediates` against timm's `VisionTransformer(dynamic_img_size=True)` with random
weights, loaded from a timm `.safetensors` file; the size checks, and the block selection."""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)


import keras
import numpy as np
import pytest
import safetensors.numpy
import torch
from tests.checkpoints.checkpoint_oracles import assert_parity, timm_state, torch_logits
from tests.conftest import images, random_vit, to_numpy
from tests.model.variant_oracles import timm_model

import keras_vit
from keras_vit import ViT

# Non-square, smaller than the table (32 x 32), larger, and the table's own size.
SIZES = [(32, 32), (48, 24), (16, 20), (56, 64)]
CASES = {"class_token": dict(), "registers_gap": dict(reg_tokens=2, no_embed_class=True, global_pool="avg",
                                                        class_token=False, fc_norm=False)}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(timm model, keras_vit model loaded from its file with `dynamic_image_size=True`)."""
    ref = timm_model(dynamic_img_size=True, **CASES[request.param]).eval()
    path = tmp_path_factory.mktemp("timm") / "model.safetensors"
    safetensors.numpy.save_file(timm_state(ref), str(path))
    return request.param, ref, keras_vit.load_checkpoint(path, num_heads=3, dynamic_image_size=True,
                                                         resample_method="bicubic")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_logits_equal_timms_at_any_size(pair, size):
    case, ref, model = pair
    x = images((2, *size, 3))
    assert_parity(f"dynamic/{case}/{size}", model(x), torch_logits(ref, x), tol=1e-4)


@pytest.mark.parametrize("norm", [False, True])
def test_forward_intermediates_equal_timms(pair, norm):
    case, ref, model = pair
    x = images((2, 24, 40, 3))
    with torch.no_grad():
        final, theirs = ref.forward_intermediates(torch.from_numpy(x.transpose(0, 3, 1, 2)), indices=[0, -1],
                                                  norm=norm, return_prefix_tokens=True)
    ours_final, ours = model.forward_intermediates(x, indices=[0, -1], norm=norm, return_prefix_tokens=True)
    assert len(ours) == 2
    for (grid, prefix), (their_grid, their_prefix) in zip(ours, theirs):
        assert tuple(grid.shape) == (2, 6, 10, 48)
        assert_parity(f"intermediates/{case}", grid, their_grid.numpy().transpose(0, 2, 3, 1), tol=1e-4)  # NCHW -> NHWC
        assert_parity(f"prefix/{case}", prefix, their_prefix.numpy(), tol=1e-4)
    assert_parity(f"final/{case}", ours_final, final.numpy(), tol=1e-4)


def test_a_dynamic_model_is_unchanged_at_its_own_size_and_keeps_the_flag():
    fixed = random_vit(pooling="gap", num_register_tokens=1)
    dynamic = ViT.from_config({**fixed.get_config(), "dynamic_image_size": True})
    dynamic.set_weights(fixed.get_weights())
    x = images()
    assert np.array_equal(to_numpy(dynamic(x)), to_numpy(fixed(x)))
    assert ViT.from_config(dynamic.get_config()).dynamic_image_size
    with pytest.raises(ValueError, match=r"images are \(48, 24\) but this model takes image_size=\(32, 32\)"):
        fixed(images((1, 48, 24, 3)))


def test_a_dynamic_model_equals_resize_at_other_sizes_for_each_table_kind():
    for options in [dict(resample_method="bilinear"), dict(position_embedding="sincos", pooling="gap")]:
        model = random_vit(dynamic_image_size=True, **options)
        for size in [(48, 24), (16, 16)]:
            x = images((2, *size, 3))
            assert_parity(f"resize/{options}", model(x), to_numpy(keras_vit.resize(model, size)(x)))


def test_the_hybrid_pooling_map_and_the_explanations_take_any_size(tmp_path):
    for options in [dict(stem="resnet50", stem_layers=(1, 1), patch_size=1), dict(pooling="map")]:
        model = random_vit(dynamic_image_size=True, **options)
        x = images((2, 48, 16, 3))
        assert_parity(f"resize/{options}", model(x), to_numpy(keras_vit.resize(model, (48, 16))(x)))
    model = random_vit(dynamic_image_size=True)
    x = images((2, 24, 40, 3))
    assert tuple(keras_vit.attention_rollout(model, x).shape) == (2, 6, 10)
    assert tuple(keras_vit.attention_maps(model, x).shape) == (2, 2, 3, 61, 61)
    relevance = to_numpy(keras_vit.class_relevance(model, x, classes=1))
    expected = to_numpy(keras_vit.class_relevance(keras_vit.resize(model, (24, 40)), x, classes=1))
    np.testing.assert_allclose(relevance, expected, rtol=1e-4, atol=1e-6)
    path = tmp_path / "dynamic.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.dynamic_image_size
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))


def test_a_size_the_patch_does_not_divide_is_refused_with_the_nearest_valid_ones():
    model = random_vit(dynamic_image_size=True)  # patch 4
    with pytest.raises(ValueError, match="multiples of 4 .*the nearest valid width is 28 or 32"):
        model(images((1, 32, 30, 3)))
    with pytest.raises(ValueError, match=r"the nearest valid height is 4(?! or)"):
        model(images((1, 2, 32, 3)))


def test_forward_intermediates_selects_blocks_as_timm_and_stops_early():
    model = random_vit(num_layers=3, dynamic_image_size=True)
    x = images((1, 16, 24, 3))
    full = model.forward_intermediates(x, intermediates_only=True, output_format="NLC")
    assert [tuple(g.shape) for g in full] == [(1, 24, 48)] * 3
    last_two = model.forward_intermediates(x, indices=2, intermediates_only=True)
    assert [tuple(g.shape) for g in last_two] == [(1, 4, 6, 48)] * 2
    np.testing.assert_allclose(to_numpy(last_two[1]), to_numpy(full[2]).reshape(1, 4, 6, 48), atol=1e-6)
    features, [grid] = model.forward_intermediates(x, indices=[-1], norm=True)
    np.testing.assert_allclose(to_numpy(features), to_numpy(model.forward_features(x)), atol=1e-6)
    for bad in [0, 4, [3], [], "last", [True]]:
        with pytest.raises(ValueError, match="indices="):
            model.forward_intermediates(x, indices=bad)
    with pytest.raises(ValueError, match="output_format='NCHW' is not allowed"):
        model.forward_intermediates(x, output_format="NCHW")


def segmenter(backbone, classes=3):
    """A user's functional model: the backbone's last grid, the pyramid's stride-4 level, a 1x1
    classifier and a resize back to the input size."""
    images = keras.Input((None, None, 3))
    grids = backbone(images)
    last = grids[-1] if isinstance(grids, list) else grids  # one block asked for: its grid alone
    fine = keras_vit.layers.SimpleFeaturePyramid(channels=16, scales=(4.0, 1.0))(last)[0]
    return keras.Model(images, keras.layers.Conv2D(classes, 1)(fine))  # (B, 4 h, 4 w, classes)


def test_the_backbone_goes_into_a_functional_model_runs_at_two_sizes_and_round_trips(tmp_path):
    vit = random_vit(dynamic_image_size=True, num_layers=3)
    backbone = vit.as_backbone(indices=[0, -1], norm=True)
    assert backbone.input_shape == (None, None, None, 3)
    assert backbone.output_shape == [(None, None, None, 48)] * 2
    assert {id(v) for v in backbone.weights} == {id(v) for v in vit.weights}  # shared, not copied
    model = segmenter(backbone)
    outputs = {}
    for size in [(32, 32), (24, 40)]:
        x = images((2, *size, 3))
        outputs[size] = to_numpy(model(x))
        assert outputs[size].shape == (2, size[0], size[1], 3)  # patch 4: the stride-4 level is the input size
        grids = backbone(x)
        expected = vit.forward_intermediates(x, indices=[0, -1], norm=True, intermediates_only=True)
        np.testing.assert_array_equal(to_numpy(grids[1]), to_numpy(expected[1]))
    path = tmp_path / "segmenter.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    for size, before in outputs.items():
        np.testing.assert_array_equal(to_numpy(loaded(images((2, *size, 3)))), before)


def test_the_segmenter_trains_with_fit_frozen_or_not():
    x = images((8, 32, 32, 3))
    y = (np.random.default_rng(2).random((8, 32, 32)) > 0.5).astype("int32")
    for frozen in [True, False]:
        vit = random_vit(dynamic_image_size=True)
        vit.trainable = not frozen
        model = segmenter(vit.as_backbone(indices=1), classes=2)
        before = [to_numpy(v) for v in vit.weights]
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=4, epochs=2, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        changed = any(not np.array_equal(b, to_numpy(v)) for b, v in zip(before, vit.weights))
        assert changed == (not frozen)


def test_the_pyramid_gives_strides_4_to_32_for_patch_16_and_refuses_other_scales():
    pyramid = keras_vit.layers.SimpleFeaturePyramid(channels=8)
    levels = pyramid(np.zeros((1, 14, 10, 32), "float32"))  # a 224 x 160 image with patch 16
    assert [tuple(level.shape) for level in levels] == [(1, 56, 40, 8), (1, 28, 20, 8), (1, 14, 10, 8), (1, 7, 5, 8)]
    assert pyramid.compute_output_shape((1, 14, 10, 32)) == [tuple(level.shape) for level in levels]
    again = keras_vit.layers.SimpleFeaturePyramid.from_config(pyramid.get_config())
    assert again.get_config() == pyramid.get_config()
    with pytest.raises(ValueError, match=r"scales=\(3.0,\) is not allowed"):
        keras_vit.layers.SimpleFeaturePyramid(scales=(3.0,))


def test_a_fixed_model_gives_a_backbone_of_its_own_size():
    backbone = random_vit().as_backbone(indices=1)
    assert backbone.input_shape == (None, 32, 32, 3) and backbone.output_shape == (None, 8, 8, 48)
    assert tuple(backbone(images()).shape) == (2, 8, 8, 48)  # one block: its grid, not a list of one
    with pytest.raises(ValueError, match="indices=5 is not allowed"):
        random_vit().as_backbone(indices=5)

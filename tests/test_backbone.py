"""A ViT for any input size and dense tasks (docs/backbone.md): `dynamic_image_size` and
`forward_intermediates` against timm's `VisionTransformer(dynamic_img_size=True)` with random
weights, loaded from a timm `.safetensors` file; the size checks, and the block selection."""

import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import numpy as np
import pytest
import safetensors.numpy
import torch
from checkpoint_oracles import assert_parity, timm_state, torch_logits
from conftest import images, random_vit, to_numpy
from variant_oracles import timm_model

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

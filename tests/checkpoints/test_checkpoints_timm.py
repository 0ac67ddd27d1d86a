"""timm `.safetensors` <-> keras_vit parity, against timm's VisionTransformer with random weights."""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import pathlib

import numpy as np
import pytest
import safetensors.numpy
import torch
from tests.checkpoints.checkpoint_oracles import (
    assert_parity, relative_error, tanh_gelu, timm_state, timm_vit, torch_logits,
)
from tests.conftest import images, randomize, tiny_vit, to_numpy
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer

import keras_vit
from keras_vit.checkpoints.timm import HEADS_BY_WIDTH


def _save(tmp_path, model, name="model.safetensors"):
    path = tmp_path / name
    safetensors.numpy.save_file(timm_state(model), str(path))
    return path


@pytest.mark.parametrize(
    "case, kwargs, size",
    [
        ("token", {}, (32, 32)),
        ("gap", dict(class_token=False, global_pool="avg", fc_norm=False), (32, 32)),
        ("no_embed_class", dict(no_embed_class=True), (32, 32)),
        ("non_square", dict(img_size=(32, 48)), (32, 48)),
        ("12_layers_width_192", dict(embed_dim=192, depth=12, mlp_ratio=1.0, patch_size=8), (32, 32)),
    ],
)
def test_timm_logits_equal(tmp_path, case, kwargs, size):
    ref = timm_vit(**kwargs)
    overrides = {"source_image_size": size} if size[0] != size[1] else {}
    if ref.embed_dim not in HEADS_BY_WIDTH:  # the 12-layer case uses the width -> heads table
        overrides["num_heads"] = 3
    model = keras_vit.load(_save(tmp_path, ref), **overrides)
    x = images((2, *size, 3))
    assert model.image_size == size and model.pooling == ("gap" if case == "gap" else "token")
    assert model.gelu_approximate is False and model.resample_method == "bicubic"
    tol = 1e-4 if "12_layers" in case else 2e-5  # round-off grows with depth: 1.2e-5 on JAX
    assert_parity(f"timm/{case}", model(x), torch_logits(ref, x), tol)


def test_timm_heads_from_override_or_table(tmp_path):
    ref = timm_vit(embed_dim=64, num_heads=4)  # 64 is not a standard width
    path = _save(tmp_path, ref)
    with pytest.raises(ValueError, match="width 64 is not a standard one.*num_heads"):
        keras_vit.load(path)
    model = keras_vit.load(path, num_heads=4)
    x = images()
    assert_parity("timm/num_heads_override", model(x), torch_logits(ref, x))


def test_timm_resample_bicubic_matches_timm(tmp_path):
    """A new, non-square size: the table equals timm's resample_abs_pos_embed (bicubic,
    antialias), and the logits equal timm's model built at that size."""
    ref = timm_vit()
    model = keras_vit.load(_save(tmp_path, ref), image_size=(48, 24), num_heads=3)
    expected = resample_abs_pos_embed(ref.pos_embed.detach(), new_size=(12, 6), num_prefix_tokens=1)
    got = to_numpy(model.position_embedding.embedding)
    assert relative_error(got, expected.numpy()) < 1e-5
    big = timm_vit(img_size=(48, 24))
    state = ref.state_dict()
    state["pos_embed"] = expected
    big.load_state_dict(state)
    x = images((2, 48, 24, 3))
    assert_parity("timm/resample_bicubic", model(x), torch_logits(big, x))


@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_save_checkpoint_loads_in_timm(tmp_path, pooling):
    model = randomize(tiny_vit(pooling=pooling, image_size=(32, 48), gelu_approximate=True))
    path = tmp_path / "out.safetensors"
    keras_vit.save_checkpoint(model, path)
    gap = pooling == "gap"
    ref = VisionTransformer(
        img_size=(32, 48), patch_size=4, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5,
        act_layer=tanh_gelu, class_token=not gap, global_pool="avg" if gap else "token", fc_norm=False,
    ).eval()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in safetensors.numpy.load_file(str(path)).items()})
    x = images((2, 32, 48, 3))
    expected = to_numpy(model(x))
    assert_parity(f"save->timm/{pooling}", torch_logits(ref, x), expected)
    # and back: the metadata restores what the tensors cannot say
    again = keras_vit.load(path)
    assert (again.num_heads, again.pooling, again.gelu_approximate, again.image_size) == (3, pooling, True, (32, 48))
    np.testing.assert_array_equal(to_numpy(again(x)), expected)


def test_save_checkpoint_refuses_what_timm_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="pre-logits"):
        keras_vit.save_checkpoint(tiny_vit(representation_size=16), tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="format='hf' is not supported"):
        keras_vit.save_checkpoint(tiny_vit(), tmp_path / "x.safetensors", format="hf")


@pytest.mark.parametrize("class_token", [False, True])
def test_timm_fc_norm(tmp_path, class_token):
    """timm's default for average pooling: no final LayerNorm, a LayerNorm on the pooled features."""
    ref = timm_vit(class_token=class_token, global_pool="avg")  # fc_norm=None -> True for "avg"
    assert "fc_norm.weight" in ref.state_dict()
    path = _save(tmp_path, ref)
    model = keras_vit.load(path, num_heads=3)
    assert model.fc_norm and model.pooling == "gap" and model.encoder.norm is None
    x = images()
    assert_parity(f"timm/fc_norm_cls{int(class_token)}", model(x), torch_logits(ref, x))
    keras_vit.save_checkpoint(model, tmp_path / "back.safetensors")
    back = safetensors.numpy.load_file(str(tmp_path / "back.safetensors"))
    assert sorted(back) == sorted(ref.state_dict())


def test_save_checkpoint_refuses_what_timm_cannot_hold_by_name(tmp_path):
    # A parallel block has the variables of a serial one, so only its option tells it from one.
    with pytest.raises(ValueError, match="does not support parallel_block=True"):
        keras_vit.save_checkpoint(tiny_vit(parallel_block=True), tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.parametrize("name", ["plain", "variants", "gap_fc_norm"])
def test_timm_files_written_before_the_rules_load(name):
    """Files written by save_checkpoint at 9fbc56f, whose metadata held only what the tensors
    cannot say (heads, grid, pooling, epsilon, GELU form, normalization, resampling, names)."""
    fixtures = pathlib.Path(__file__).parent / "fixtures"
    saved = np.load(fixtures / "timm_saved_outputs.npz")
    model = keras_vit.load(fixtures / f"timm_saved_{name}.safetensors")
    np.testing.assert_allclose(to_numpy(model(saved[name + "/images"])), saved[name], rtol=1e-5, atol=1e-5)
    if name == "plain":
        assert (model.image_size, model.class_names, model.layer_norm_epsilon) == ((32, 48), tuple("abcde"), 1e-5)
        assert (model.gelu_approximate, model.image_mean, model.resample_method) == (True, (0.4, 0.5, 0.6), "bicubic")
    if name == "variants":
        assert (model.num_register_tokens, model.pooling, model.layer_scale_init) == (2, "map", 1.0)

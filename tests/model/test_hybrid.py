"""The paper's hybrid (§3.1, "Hybrid Architecture"): a BiT ResNet-50 feature map as the token grid.

Parity against timm's hybrid VisionTransformer (random weights), loading of Google's hybrid `.npz`
layout (the writer below is checked with timm's own npz reader), and the seed's shape checks.
"""

import numpy as np
import pytest
import timm
import torch
from tests.checkpoints.checkpoint_oracles import (
    assert_parity, randomize_torch, save_npz, tanh_gelu, torch_logits, vit_jax_npz,
)
from tests.conftest import TINY, images, randomize, to_numpy
from timm.models.vision_transformer import _load_weights
from tests.model.variant_oracles import copy_timm, timm_hybrid

import keras_vit

HYBRID = dict(TINY, stem="resnet50", patch_size=1)  # 32 px, width 48, 2 layers, 3 heads


def hybrid(**overrides):
    return keras_vit.ViT(**{**HYBRID, **overrides})


def test_small_hybrid_matches_timm():
    ref = timm_hybrid(layers=(1, 1))
    model = copy_timm(hybrid(stem_layers=(1, 1)), ref)
    assert model.count_params() == sum(p.numel() for p in ref.parameters())
    x = images()
    assert_parity("hybrid/R50(1,1)+tiny", model(x), torch_logits(ref, x))


@pytest.mark.slow
def test_r50_vit_b16_architecture_matches_timm_vit_base_r50_s16_384():
    """timm's own registered hybrid with its (3, 4, 9) ResNet, shrunk to 64 px and a tiny ViT."""
    torch.manual_seed(0)
    ref = timm.create_model("vit_base_r50_s16_384", pretrained=False, img_size=64, embed_dim=48, depth=2,
                            num_heads=3, mlp_ratio=2.0, num_classes=5)
    randomize_torch(ref)
    config = dict(keras_vit.preset_config("R50+ViT-B/16"), hidden_dim=48, num_layers=2, num_heads=3, mlp_dim=96,
                  num_classes=5, image_size=64)
    model = copy_timm(keras_vit.ViT(**config), ref)
    assert model.stem_layers == (3, 4, 9) and model.grid_size == (4, 4)
    assert model.count_params() == sum(p.numel() for p in ref.parameters())
    x = images((2, 64, 64, 3))
    # 16 ResNet units of float32 round-off: 1.4e-5 measured on JAX, so 5e-5 here (a GELU mix-up is 1.5e-4).
    assert_parity("hybrid/R50+ViT-B/16-arch", model(x), torch_logits(ref, x), tol=5e-5)


def hybrid_npz(ref, group_norm_4d=True):
    """The tensors of a timm hybrid under Google's names: the ViT's as in vit_jax, the ResNet's as
    conv_root, gn_root, block{i}/unit{j}/{conv,gn}{1,2,3,_proj}; GroupNorm params as the
    pre-Linen code stored them, (1, 1, 1, C), when `group_norm_4d`."""
    out = vit_jax_npz(ref)
    sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    bb = "patch_embed.backbone."

    def norm(dst, src):
        for leaf, key in (("scale", "weight"), ("bias", "bias")):
            v = sd[f"{src}.{key}"]
            out[f"{dst}/{leaf}"] = v.reshape(1, 1, 1, -1) if group_norm_4d else v

    # (out, in, kh, kw) -> (kh, kw, in, out)
    out["conv_root/kernel"] = sd[bb + "stem.conv.weight"].transpose(2, 3, 1, 0)
    norm("gn_root", bb + "stem.norm")
    for i, stage in enumerate(ref.patch_embed.backbone.stages):
        for j, block in enumerate(stage.blocks):
            u, t = f"block{i + 1}/unit{j + 1}/", f"{bb}stages.{i}.blocks.{j}."
            for r in (1, 2, 3):
                out[f"{u}conv{r}/kernel"] = sd[f"{t}conv{r}.weight"].transpose(2, 3, 1, 0)
                norm(f"{u}gn{r}", f"{t}norm{r}")
            if block.downsample is not None:
                out[f"{u}conv_proj/kernel"] = sd[t + "downsample.conv.weight"].transpose(2, 3, 1, 0)
                norm(f"{u}gn_proj", t + "downsample.norm")
    return out


@pytest.mark.parametrize("group_norm_4d", [True, False])
def test_google_hybrid_npz_loads_with_parity(tmp_path, group_norm_4d):
    ref = timm_hybrid(layers=(2, 1), seed=3, act_layer=tanh_gelu)  # Google's Flax models use the tanh GELU
    path = save_npz(tmp_path / "R50+ViT-tiny.npz", hybrid_npz(ref, group_norm_4d))
    x = images()
    expected = torch_logits(ref, x)
    # The writer is right: timm's own reader of Google's hybrid files reproduces the reference.
    check = timm_hybrid(layers=(2, 1), seed=9, act_layer=tanh_gelu)
    _load_weights(check, str(path))
    assert_parity("hybrid/npz-writer-vs-timm", torch_logits(check.eval(), x), expected, tol=1e-5)
    model = keras_vit.load(path)
    assert (model.stem_kind, model.stem_layers, model.patch_size, model.num_channels) == ("resnet50", (2, 1), 1, 3)
    assert model.image_size == (32, 32) and model.grid_size == (4, 4)
    assert_parity(f"hybrid/google-npz{'-gn4d' if group_norm_4d else ''}", model(x), expected)


def test_hybrid_npz_at_a_new_resolution_resamples_only_positions(tmp_path):
    ref = timm_hybrid(layers=(1, 1))
    path = save_npz(tmp_path / "h.npz", hybrid_npz(ref))
    model = keras_vit.load(path, image_size=64)
    assert model.grid_size == (8, 8) and model.position_embedding.embedding.shape == (1, 1 + 64, 48)
    assert model(images((1, 64, 64, 3))).shape == (1, 5)


def test_hybrid_npz_with_a_missing_stem_tensor_names_it(tmp_path):
    tensors = hybrid_npz(timm_hybrid(layers=(1, 1)))
    del tensors["block2/unit1/gn_proj/bias"]
    with pytest.raises(ValueError, match="missing block2/unit1/gn_proj/bias"):
        keras_vit.load(save_npz(tmp_path / "bad.npz", tensors))


# The seed's shape checks, for the hybrid.


@pytest.mark.parametrize("layers, stride, width", [((1,), 4, 256), ((1, 1), 8, 512), ((1, 1, 1), 16, 1024)])
def test_tokens_are_feature_map_cells(layers, stride, width):
    model = hybrid(stem_layers=layers, image_size=(32, 48))
    x = images((2, 32, 48, 3))
    features = model.stem(x)
    assert tuple(features.shape) == (2, 32 // stride, 48 // stride, width)
    assert model.grid_size == (32 // stride, 48 // stride) and model.token_pixels == stride
    assert tuple(model.patch_embedding.conv.kernel.shape) == (1, 1, width, 48)  # 1 x 1 patches of F channels
    n = (32 // stride) * (48 // stride)
    assert tuple(model.forward_features(x).shape) == (2, 1 + n, 48)


@pytest.mark.parametrize("pooling, prefix", [("token", 1), ("gap", 0), ("map", 0)])
def test_class_token_policy(pooling, prefix):
    model = randomize(hybrid(stem_layers=(1, 1), pooling=pooling, num_classes=0))
    assert model.num_prefix_tokens == prefix and model.position_embedding.embedding.shape == (1, prefix + 16, 48)
    x = images()
    tokens = to_numpy(model.forward_features(x))
    if pooling == "token":
        np.testing.assert_allclose(to_numpy(model(x)), tokens[:, 0], atol=1e-6)
    elif pooling == "gap":
        np.testing.assert_allclose(to_numpy(model(x)), tokens.mean(1), atol=1e-5)


def test_widths_of_the_presets():
    b16, l32 = keras_vit.preset_config("R50+ViT-B/16"), keras_vit.preset_config("R50+ViT-L/32")
    assert (b16["hidden_dim"], b16["stem_layers"], b16["patch_size"]) == (768, (3, 4, 9), 1)
    assert (l32["hidden_dim"], l32["stem_layers"], l32["patch_size"]) == (1024, (3, 4, 6, 3), 1)
    # 384 px: a 24 x 24 grid after stride 16 and a 12 x 12 grid after stride 32, as in timm.
    assert keras_vit.count_params(dict(b16, image_size=384)) == 98_950_952  # timm vit_base_r50_s16_384
    assert keras_vit.count_params(dict(l32, image_size=384)) == 329_092_136  # timm vit_large_r50_s32_384


def test_attention_maps_and_rollout_use_the_feature_grid():
    model = randomize(hybrid(stem_layers=(1, 1)))
    x = images()
    maps = keras_vit.attention_maps(model, x)
    assert tuple(maps.shape) == (2, 2, 3, 17, 17)
    rollout = to_numpy(keras_vit.attention_rollout(model, x, maps=maps))
    assert rollout.shape == (2, 4, 4) and np.all(rollout > 0)
    distance = keras_vit.mean_attention_distance(model, x, maps=maps)
    # Tokens are 8 px apart on a 4 x 4 grid: distances lie between 0 and the diagonal, 8 * 3 * sqrt(2).
    assert distance.shape == (2, 3) and 0 < distance.min() and distance.max() < 8 * 3 * np.sqrt(2)
    assert tuple(model.feature_grid(x).shape) == (2, 4, 4, 48)


def test_hybrid_resize_and_keras_file(tmp_path):
    import keras

    model = randomize(hybrid(stem_layers=(1, 1)))
    big = keras_vit.resize(model, 64)
    assert big.grid_size == (8, 8) and big(images((1, 64, 64, 3))).shape == (1, 5)
    path = tmp_path / "hybrid.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    x = images()
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)), atol=1e-5)

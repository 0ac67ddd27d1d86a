"""Register tokens, MAP heads, LayerScale, QK-norm, `use_bias=False`, sin-cos tables and the
hybrid through timm checkpoints: timm `.safetensors` in (timm's `reg_token`, `attn_pool`,
`ls1/ls2.gamma`, `attn.q_norm/k_norm` and `patch_embed.backbone` keys) and out, against timm's
VisionTransformer with random weights; and `save_checkpoint` then `keras_vit.load` restores the
configuration exactly."""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

from functools import partial

import numpy as np
import pytest
import safetensors.numpy
import torch
from tests.checkpoints.checkpoint_oracles import assert_parity, timm_state, torch_logits
from tests.conftest import images, random_vit, to_numpy
from timm.layers import LayerNorm
from tests.model.variant_oracles import timm_hybrid, timm_model

import keras_vit

NO_BIAS = dict(qkv_bias=False, norm_layer=partial(LayerNorm, eps=1e-6, bias=False))
CASES = {
    "map": dict(global_pool="map", class_token=False),
    "registers": dict(reg_tokens=2),
    "registers_map": dict(reg_tokens=2, global_pool="map", class_token=False),
    "dinov2_registers": dict(reg_tokens=4, no_embed_class=True),  # no positions for class and registers
    "layer_scale": dict(init_values=0.1),
    "dinov2_registers_layer_scale": dict(reg_tokens=4, no_embed_class=True, init_values=1.0),
    "qk_norm": dict(qk_norm=True),
    "use_bias_false": NO_BIAS,
}
# keras_vit options -> the timm model that loads what save_checkpoint writes for them.
SAVED = {
    "registers_map": (dict(num_register_tokens=2, pooling="map"), lambda: timm_model(reg_tokens=2, global_pool="map",
                                                                                     class_token=False)),
    "registers_token": (dict(num_register_tokens=2), lambda: timm_model(reg_tokens=2)),
    "layer_scale": (dict(layer_scale_init=0.1), lambda: timm_model(init_values=0.1)),
    "qk_norm": (dict(qk_norm=True), lambda: timm_model(qk_norm=True)),
    "use_bias_false": (dict(use_bias=False), lambda: timm_model(**NO_BIAS)),
    "sincos": (dict(position_embedding="sincos"), timm_model),  # the table is stored as pos_embed
    "hybrid": (dict(stem="resnet50", stem_layers=(1, 1), patch_size=1), lambda: timm_hybrid((1, 1))),
}
# Every option a timm file carries, and the other arguments of the model, each off its default.
ROUND_TRIP = {
    "sincos_layer_scale": dict(position_embedding="sincos", layer_scale_init=1e-3),
    "registers_map": dict(num_register_tokens=2, pooling="map"),
    "qk_norm_no_bias": dict(qk_norm=True, use_bias=False),
    "hybrid": dict(stem="resnet50", stem_layers=(1, 1), patch_size=1, pooling="gap", class_token=True),
    "fc_norm": dict(pooling="gap", fc_norm=True),
    "the_rest": dict(image_size=(32, 48), gelu_approximate=True, layer_norm_epsilon=1e-5, dropout_rate=0.1,
                     attention_dropout_rate=0.05, drop_path_rate=0.2, image_mean=(0.4, 0.5, 0.6),
                     image_std=(0.2, 0.3, 0.4), resample_method="bicubic_no_antialias", class_names=tuple("abcde"),
                     preset="ViT-Ti/4", head_initializer="zeros", name="my_vit", num_classes=5),
}


@pytest.mark.parametrize("case", list(CASES))
def test_timm_file_with_variants_loads_with_parity(tmp_path, case):
    ref = timm_model(**CASES[case])
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(timm_state(ref), str(path))
    model = keras_vit.load(path, num_heads=3)
    assert model.num_register_tokens == CASES[case].get("reg_tokens", 0)
    assert (model.layer_scale_init is not None) == ("init_values" in CASES[case])
    assert model.pooling == ("map" if "global_pool" in CASES[case] else "token")
    assert (model.qk_norm, model.use_bias) == (case == "qk_norm", case != "use_bias_false")
    x = images()
    assert_parity(f"timm-file/{case}", model(x), torch_logits(ref, x))


def test_timm_hybrid_file_loads_with_parity(tmp_path):
    ref = timm_hybrid((2, 1))
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(timm_state(ref), str(path))
    model = keras_vit.load(path, num_heads=3)
    assert (model.stem_kind, model.stem_layers, model.patch_size, model.grid_size) == ("resnet50", (2, 1), 1, (4, 4))
    x = images()
    assert_parity("timm-file/hybrid", model(x), torch_logits(ref, x))


@pytest.mark.parametrize("case", list(SAVED))
def test_save_checkpoint_with_variants_loads_in_timm(tmp_path, case):
    options, reference = SAVED[case]
    model = random_vit(**options)
    path = tmp_path / "out.safetensors"
    keras_vit.save_checkpoint(model, path)
    ref = reference()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in safetensors.numpy.load_file(str(path)).items()})
    x = images()
    expected = to_numpy(model(x))
    assert_parity(f"save->timm/{case}", torch_logits(ref.eval(), x), expected)
    np.testing.assert_array_equal(to_numpy(keras_vit.load(path)(x)), expected)


@pytest.mark.parametrize("case", list(ROUND_TRIP))
def test_save_then_load_restores_the_configuration_exactly(tmp_path, case):
    model = random_vit(**ROUND_TRIP[case])
    keras_vit.save_checkpoint(model, tmp_path / "m.safetensors")
    again = keras_vit.load(tmp_path / "m.safetensors")
    assert again.get_config() == model.get_config()
    assert [(v.path, v.trainable) for v in again.weights] == [(v.path, v.trainable) for v in model.weights]
    x = images((2, *model.image_size, 3))
    np.testing.assert_array_equal(to_numpy(again(x)), to_numpy(model(x)))

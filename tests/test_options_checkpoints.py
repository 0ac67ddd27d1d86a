"""Register tokens, MAP heads and LayerScale through checkpoints: timm `.safetensors` in (timm's
`reg_token`, `attn_pool` and `ls1/ls2.gamma` keys) and out, against timm's VisionTransformer with
random weights."""

import numpy as np
import pytest
import safetensors.numpy
import torch
from checkpoint_oracles import assert_parity, timm_state, torch_logits
from conftest import images, randomize, tiny_vit, to_numpy
from variant_oracles import timm_model

import keras_vit

CASES = {
    "map": dict(global_pool="map", class_token=False),
    "registers": dict(reg_tokens=2),
    "registers_map": dict(reg_tokens=2, global_pool="map", class_token=False),
    "dinov2_registers": dict(reg_tokens=4, no_embed_class=True),  # no positions for class and registers
    "layer_scale": dict(init_values=0.1),
    "dinov2_registers_layer_scale": dict(reg_tokens=4, no_embed_class=True, init_values=1.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_timm_file_with_registers_or_map_loads_with_parity(tmp_path, case):
    ref = timm_model(**CASES[case])
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(timm_state(ref), str(path))
    model = keras_vit.load_checkpoint(path, num_heads=3)
    assert model.num_register_tokens == CASES[case].get("reg_tokens", 0)
    assert (model.layer_scale_init is not None) == ("init_values" in CASES[case])
    assert model.pooling == ("map" if "global_pool" in CASES[case] else "token")
    x = images()
    assert_parity(f"timm-file/{case}", model(x), torch_logits(ref, x))


@pytest.mark.parametrize("pooling", ["map", "token"])
def test_save_checkpoint_with_registers_loads_in_timm(tmp_path, pooling):
    model = randomize(tiny_vit(num_register_tokens=2, pooling=pooling))
    path = tmp_path / "out.safetensors"
    keras_vit.save_checkpoint(model, path)
    kwargs = dict(global_pool="map", class_token=False) if pooling == "map" else {}
    ref = timm_model(reg_tokens=2, **kwargs)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in safetensors.numpy.load_file(str(path)).items()})
    x = images()
    expected = to_numpy(model(x))
    assert_parity(f"save->timm/registers_{pooling}", torch_logits(ref.eval(), x), expected)
    again = keras_vit.load_checkpoint(path)
    assert (again.num_register_tokens, again.pooling) == (2, pooling)
    np.testing.assert_array_equal(to_numpy(again(x)), expected)


def test_save_checkpoint_with_layer_scale_loads_in_timm(tmp_path):
    model = randomize(tiny_vit(layer_scale_init=0.1))
    path = tmp_path / "out.safetensors"
    keras_vit.save_checkpoint(model, path)
    ref = timm_model(init_values=0.1)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in safetensors.numpy.load_file(str(path)).items()})
    x = images()
    expected = to_numpy(model(x))
    assert_parity("save->timm/layer_scale", torch_logits(ref.eval(), x), expected)
    np.testing.assert_array_equal(to_numpy(keras_vit.load_checkpoint(path)(x)), expected)

"""Hugging Face ViT folders -> keras_vit parity, against transformers' models with random weights."""

import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import json

import numpy as np
import pytest
import torch
from checkpoint_oracles import assert_parity, randomize_torch, torch_logits
from conftest import images
from transformers import ViTConfig, ViTForImageClassification, ViTModel

import keras_vit

TINY_HF = dict(image_size=32, patch_size=4, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=96)


def _folder(tmp_path, model):
    model.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    return tmp_path / "hf"


@pytest.mark.parametrize(
    "case, kwargs",
    [
        ("default", {}),
        ("tanh_gelu_eps_1e-6", dict(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)),
        ("non_square", dict(image_size=(32, 48))),
    ],
)
def test_hf_logits_equal(tmp_path, case, kwargs):
    torch.manual_seed(0)
    ref = randomize_torch(ViTForImageClassification(ViTConfig(**{**TINY_HF, **kwargs}, num_labels=5)))
    model = keras_vit.load_checkpoint(_folder(tmp_path, ref))
    config = ref.config
    assert model.layer_norm_epsilon == config.layer_norm_eps
    assert model.gelu_approximate == (config.hidden_act != "gelu")
    size = tuple(kwargs.get("image_size", (32, 32)))
    assert model.image_size == size and model.class_names is None  # LABEL_i placeholders are dropped
    x = images((2, *size, 3))
    assert_parity(f"hf/{case}", model(x), torch_logits(ref, x))


def test_hf_labels_and_normalization_travel(tmp_path):
    torch.manual_seed(0)
    names = ["cat", "dog", "fish"]
    config = ViTConfig(**TINY_HF, id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    folder = _folder(tmp_path, randomize_torch(ViTForImageClassification(config)))
    pre = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "do_normalize": True}
    (folder / "preprocessor_config.json").write_text(json.dumps(pre))
    model = keras_vit.load_checkpoint(folder)
    assert model.class_names == tuple(names)
    assert np.allclose(model.image_mean, pre["image_mean"]) and np.allclose(model.image_std, pre["image_std"])


def test_hf_pooler_is_pre_logits(tmp_path):
    """A bare ViTModel: its tanh pooler output equals keras_vit's pre-logits features."""
    torch.manual_seed(0)
    ref = randomize_torch(ViTModel(ViTConfig(**TINY_HF)))
    model = keras_vit.load_checkpoint(_folder(tmp_path, ref))
    assert model.num_classes == 0 and model.representation_size == 48
    x = images()
    with torch.no_grad():
        expected = ref(torch.from_numpy(x.transpose(0, 3, 1, 2))).pooler_output.numpy()
    assert_parity("hf/pooler", model(x), expected)

"""Hugging Face ViT folders -> keras_vit parity, against transformers' models with random weights;
and keras_vit -> transformers folders (`save_checkpoint(format="transformers")`) -> keras_vit."""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import json

import numpy as np
import pytest
import torch
from tests.checkpoints.checkpoint_oracles import assert_parity, randomize_torch, torch_logits
from tests.conftest import images, random_vit, to_numpy
from transformers import AutoImageProcessor, ViTConfig, ViTForImageClassification, ViTModel

import keras_vit

TINY_HF = dict(image_size=32, patch_size=4, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
               intermediate_size=96)


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
    model = keras_vit.load(_folder(tmp_path, ref))
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
    model = keras_vit.load(folder)
    assert model.class_names == tuple(names)
    assert np.allclose(model.image_mean, pre["image_mean"]) and np.allclose(model.image_std, pre["image_std"])


def test_hf_pooler_is_pre_logits(tmp_path):
    """A bare ViTModel: its tanh pooler output equals keras_vit's pre-logits features."""
    torch.manual_seed(0)
    ref = randomize_torch(ViTModel(ViTConfig(**TINY_HF)))
    model = keras_vit.load(_folder(tmp_path, ref))
    assert model.num_classes == 0 and model.representation_size == 48
    x = images()
    with torch.no_grad():
        expected = ref(torch.from_numpy(x.transpose(0, 3, 1, 2))).pooler_output.numpy()
    assert_parity("hf/pooler", model(x), expected)


# keras_vit models that transformers' ViT holds: every option it carries off its default.
TO_TRANSFORMERS = {
    "classifier": dict(image_size=(32, 48), class_names=tuple("abcde"), gelu_approximate=True, layer_norm_epsilon=1e-5,
                       image_mean=(0.4, 0.5, 0.6), image_std=(0.2, 0.3, 0.4), resample_method="bicubic",
                       position_embedding="sincos", dropout_rate=0.1, attention_dropout_rate=0.05, drop_path_rate=0.1,
                       name="my_vit", head_initializer="zeros"),
    "backbone": dict(num_classes=0),
    "backbone_pooler": dict(num_classes=0, representation_size=24),  # ViTModel's tanh pooler
}


@pytest.mark.parametrize("case", list(TO_TRANSFORMERS))
def test_save_transformers_loads_in_transformers_and_back(tmp_path, case):
    model = random_vit(**TO_TRANSFORMERS[case])
    keras_vit.save_checkpoint(model, tmp_path / "out", format="transformers")
    x = images((2, *model.image_size, 3))
    if model.num_classes:
        ref = ViTForImageClassification.from_pretrained(tmp_path / "out").eval()
        assert ref.config.id2label == dict(enumerate(model.class_names))
        expected = torch_logits(ref, x)
    else:
        ref = ViTModel.from_pretrained(tmp_path / "out", add_pooling_layer=bool(model.representation_size)).eval()
        with torch.no_grad():
            out = ref(torch.from_numpy(x.transpose(0, 3, 1, 2)))  # (B, H, W, C) -> (B, C, H, W)
        expected = (out.pooler_output if model.representation_size else out.last_hidden_state[:, 0]).numpy()
    assert_parity(f"save->transformers/{case}", expected, to_numpy(model(x)), tol=1e-5)
    processor = AutoImageProcessor.from_pretrained(tmp_path / "out")
    assert (processor.size.height, processor.size.width) == model.image_size
    assert processor.resample == {"bilinear": 2, "bicubic": 3}[model.image_resize]  # PIL's BILINEAR, BICUBIC
    pixels = np.random.default_rng(0).integers(0, 256, (*model.image_size, 3), dtype=np.uint8)
    np.testing.assert_allclose(processor(pixels, return_tensors="np")["pixel_values"][0].transpose(1, 2, 0),
                               to_numpy(model.normalize(pixels)), atol=1e-6)
    again = keras_vit.load(tmp_path / "out")
    assert again.get_config() == model.get_config()
    np.testing.assert_allclose(to_numpy(again(x)), to_numpy(model(x)), rtol=1e-5, atol=1e-6)


def test_save_transformers_refuses_what_vit_cannot_hold(tmp_path):
    for option, value in [("num_register_tokens", 2), ("qk_norm", True), ("pooling", "gap"), ("layer_scale_init", 0.1),
                          ("representation_size", 16)]:
        with pytest.raises(ValueError, match=rf"^the transformers writer does not support .*\b{option}={value!r} \("):
            keras_vit.save_checkpoint(random_vit(**{option: value}), tmp_path / option, format="transformers")
        assert not (tmp_path / option).exists()

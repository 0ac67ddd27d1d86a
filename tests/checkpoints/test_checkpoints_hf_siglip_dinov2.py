"""Hugging Face SigLIP and DINOv2 folders -> keras_vit parity with transformers (random weights):
pooled features and last hidden states, the classifier of SiglipForImageClassification with its
label names, the normalization each folder states, and position interpolation at another image
size (transformers' `interpolate_pos_encoding`).
"""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import numpy as np
import pytest
import torch
import transformers
from tests.checkpoints.checkpoint_oracles import assert_parity, randomize_torch
from tests.conftest import images

import keras_vit

TINY = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, image_size=32, patch_size=4)
SIGLIP = dict(TINY, intermediate_size=96)
MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.3, 0.25)


def hf_outputs(model, x, **kwargs):
    """(pooled, last hidden state) of a transformers vision model on NHWC numpy images."""
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))), **kwargs)
    pooled = out.pooler_output
    return None if pooled is None else pooled.numpy(), out.last_hidden_state.numpy()


def save(model, folder, processor=None):
    model.save_pretrained(folder, safe_serialization=True)
    if processor is not None:
        processor.save_pretrained(folder)
    return folder


def siglip_vision(seed=0, **config):
    torch.manual_seed(seed)
    return randomize_torch(transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SIGLIP, **config)), seed)


def dinov2(registers, seed=0):
    torch.manual_seed(seed)
    if registers:
        config = transformers.Dinov2WithRegistersConfig(**TINY, mlp_ratio=2, num_register_tokens=registers)
        return randomize_torch(transformers.Dinov2WithRegistersModel(config), seed)
    return randomize_torch(transformers.Dinov2Model(transformers.Dinov2Config(**TINY, mlp_ratio=2)), seed)


def assert_features(case, model, ref, size=(32, 32), **kwargs):
    """keras_vit's features and encoder output equal transformers' pooler and last hidden state."""
    x = images((2, *size, 3))
    pooled, hidden = hf_outputs(ref, x, **kwargs)
    assert_parity(case + "/pooled", model(x), pooled)
    assert_parity(case + "/hidden", model.forward_features(x), hidden)


def test_siglip_vision_model(tmp_path):
    ref = siglip_vision()
    processor = transformers.SiglipImageProcessor(image_mean=MEAN, image_std=STD)
    model = keras_vit.load(save(ref, tmp_path / "siglip", processor))
    assert (model.pooling, model.class_token, model.num_classes, model.gelu_approximate) == ("map", False, 0, True)
    assert (model.image_mean, model.image_std) == (MEAN, STD)
    assert_features("hf_siglip/vision_model", model, ref)


def test_siglip_vision_model_without_head(tmp_path):
    """vision_use_head=False: no MAP head; keras_vit averages the tokens (transformers pools nothing)."""
    ref = siglip_vision(vision_use_head=False)
    model = keras_vit.load(save(ref, tmp_path / "siglip"))
    x = images()
    _, hidden = hf_outputs(ref, x)
    assert model.pooling == "gap"
    assert_parity("hf_siglip/no_head", model(x), hidden.mean(axis=1))


def test_siglip_model_vision_tower(tmp_path):
    torch.manual_seed(0)
    text = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=3, vocab_size=64,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = transformers.SiglipConfig(vision_config=SIGLIP, text_config=text)
    ref = randomize_torch(transformers.SiglipModel(config))
    model = keras_vit.load(save(ref, tmp_path / "siglip"))
    assert_features("hf_siglip/siglip_model", model, ref.vision_model)


def _bytes_read():
    """Bytes this process has read through read() and its kin so far (Linux's rchar)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_siglip_model_text_tower_is_never_read(tmp_path):
    """A SiglipModel whose text tower is 9.6 MB (a 50,000-token vocabulary) of a 10 MB file:
    loading its image tower reads less than the image tower's bytes plus 1 MB (JSON, headers)."""
    torch.manual_seed(0)
    text = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=3, vocab_size=50_000,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    ref = randomize_torch(transformers.SiglipModel(transformers.SiglipConfig(vision_config=SIGLIP, text_config=text)))
    folder = save(ref, tmp_path / "siglip")
    sd = ref.state_dict()
    image_bytes = sum(v.numel() * 4 for k, v in sd.items() if k.startswith("vision_model."))
    text_bytes = sum(v.numel() * 4 for k, v in sd.items() if not k.startswith("vision_model."))
    assert text_bytes > 9e6 and image_bytes < 1e6
    keras_vit.load(folder)  # once, so that every module and code path is loaded
    before = _bytes_read()
    model = keras_vit.load(folder)
    read = _bytes_read() - before
    assert image_bytes <= read < image_bytes + 1e6, (read, image_bytes)
    assert_features("hf_siglip/siglip_model_big_text", model, ref.vision_model)


def test_siglip_for_image_classification_labels(tmp_path):
    labels = {0: "cat", 1: "dog", 2: "fox"}
    config = transformers.SiglipConfig(vision_config=SIGLIP, id2label=labels,
                                       label2id={v: k for k, v in labels.items()})
    torch.manual_seed(0)
    ref = randomize_torch(transformers.SiglipForImageClassification(config))
    model = keras_vit.load(save(ref, tmp_path / "siglip"))
    assert model.class_names == ("cat", "dog", "fox") and model.pooling == "gap"
    x = images()
    with torch.no_grad():
        expected = ref(pixel_values=torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))).logits.numpy()
    assert_parity("hf_siglip/classifier", model(x), expected)


def test_siglip_interpolated_positions(tmp_path):
    ref = siglip_vision()
    model = keras_vit.load(save(ref, tmp_path / "siglip"), image_size=(48, 24))
    assert model.resample_method == "bicubic_no_antialias"
    assert_features("hf_siglip/interpolate_48x24", model, ref, size=(48, 24), interpolate_pos_encoding=True)


@pytest.mark.parametrize("registers", [0, 4], ids=["dinov2", "registers"])
def test_dinov2(tmp_path, registers):
    ref = dinov2(registers)
    processor = transformers.BitImageProcessor(image_mean=MEAN, image_std=STD)
    model = keras_vit.load(save(ref, tmp_path / "dinov2", processor))
    assert (model.num_register_tokens, model.layer_scale_init, model.num_classes) == (registers, 1.0, 0)
    assert (model.gelu_approximate, model.image_mean, model.image_std) == (False, MEAN, STD)
    assert_features(f"hf_dinov2/{'registers' if registers else 'plain'}", model, ref)


@pytest.mark.parametrize("registers", [0, 4], ids=["dinov2", "registers"])
def test_dinov2_interpolated_positions(tmp_path, registers, size=(48, 24)):
    """transformers always interpolates DINOv2's table to the input (bicubic; antialiased only with
    registers); keras_vit resamples it once at load time with the same filter. 8 x 8 -> 12 x 6
    both enlarges and shrinks, where antialiasing matters."""
    ref = dinov2(registers)
    model = keras_vit.load(save(ref, tmp_path / "dinov2"), image_size=size)
    assert model.resample_method == ("bicubic" if registers else "bicubic_no_antialias")
    assert_features(f"hf_dinov2/{'registers' if registers else 'plain'}_{size[0]}x{size[1]}", model, ref, size=size)


@pytest.mark.parametrize("old,new", [((8, 8), (12, 6)), ((7, 7), (16, 3)), ((5, 9), (5, 9))])
def test_bicubic_no_antialias_is_torch_interpolate(old, new):
    table = np.random.default_rng(0).normal(size=(1 + old[0] * old[1], 6)).astype("float32")
    grid = torch.from_numpy(table[1:].reshape(1, *old, 6)).permute(0, 3, 1, 2)  # (1, h, w, D) -> (1, D, h, w)
    expected = torch.nn.functional.interpolate(grid, size=new, mode="bicubic", align_corners=False)
    expected = expected.permute(0, 2, 3, 1).reshape(-1, 6).numpy()  # (1, D, h', w') -> (h' * w', D)
    actual = keras_vit.layers.resample_position_embedding(table, old, new, method="bicubic_no_antialias")
    np.testing.assert_array_equal(actual[0], table[0])
    np.testing.assert_allclose(actual[1:], expected, atol=2e-6)


def test_unsupported_folders_are_named(tmp_path):
    ref = dinov2(0)
    classifier = transformers.Dinov2ForImageClassification(transformers.Dinov2Config(**TINY, mlp_ratio=2, num_labels=3))
    with pytest.raises(ValueError, match="DINOv2 classifier"):
        keras_vit.load(save(classifier, tmp_path / "classifier"))
    folder = save(ref, tmp_path / "siglip2")
    (folder / "config.json").write_text('{"model_type": "siglip2"}')
    with pytest.raises(ValueError, match="model_type='siglip2'.*supported"):
        keras_vit.load(folder)

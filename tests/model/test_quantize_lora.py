"""Keras' own `model.quantize` and `enable_lora` on a ViT: keras-hub's ViT with the same weights as
the reference for quantization error, `.keras` round trips, the shipped checkpoint in int8, and LoRA
on ViT-S/16 (unchanged outputs, few trainable weights, training, saving, merging)."""

import os

import keras
import keras_hub
import numpy as np
import pytest
from tests import ROOT
from tests.conftest import images, random_vit, to_numpy

import keras_vit

CKPT = os.path.join(ROOT, "checkpoints", "fashion-mnist-vit")


def _error(out, ref):
    """Largest deviation from the float outputs, relative to their range."""
    return float(np.abs(out - ref).max() / np.ptp(ref))


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantize_error_is_no_larger_than_keras_hubs_with_the_same_weights(tmp_path, mode):
    model = random_vit()
    keras_vit.save_checkpoint(model, tmp_path / "preset", format="keras_hub")
    hub = keras_hub.models.ViTImageClassifier.from_preset(str(tmp_path / "preset"))
    x = images()
    ref = to_numpy(model(x))
    np.testing.assert_allclose(to_numpy(hub(x)), ref, rtol=1e-5, atol=1e-5)
    model.quantize(mode)
    hub.backbone.quantize(mode)  # the classifier's image preprocessor holds an unbuilt Resizing layer
    hub.output_dense.quantize(mode)
    ours, theirs = _error(to_numpy(model(x)), ref), _error(to_numpy(hub(x)), ref)
    assert ours <= theirs * 1.01 + 1e-6, (mode, ours, theirs)
    assert 0 < ours < {"int8": 0.05, "int4": 0.5}[mode], (mode, ours)


def test_fused_attention_reads_no_quantized_kernel():
    model = random_vit()
    model.quantize("int8")
    attention = model.encoder.blocks[0].attn
    assert attention.quantized
    x = keras.ops.convert_to_tensor(images((2, 65, 48)))
    assert not attention._fused_path(x, x, None, False, False, {})


@pytest.mark.parametrize("mode", ["int8", "int4", "float8"])
def test_quantized_model_round_trips_through_keras_file_in_safe_mode(tmp_path, mode):
    # The MAP head's attention and the registers once; the other modes on the plain model.
    model = random_vit(pooling="map", num_register_tokens=1, class_token=True) if mode == "int8" else random_vit()
    model.quantize(mode)
    x = images()
    out = to_numpy(model(x))
    model.save(tmp_path / "q.keras")
    again = keras.saving.load_model(tmp_path / "q.keras", safe_mode=True)
    assert again.quantization == model.quantization and again.quantization["mode"] == mode
    np.testing.assert_array_equal(to_numpy(again(x)), out)


def test_quantize_refuses_what_cannot_work(tmp_path):
    model = random_vit()
    for config in (keras.quantizers.GPTQConfig([""], None), keras.quantizers.AWQConfig([""], None)):
        with pytest.raises(ValueError, match=rf"quantize\(mode='{config.mode}'\) is not supported: Keras' .* "
                                             "tokenized text"):
            model.quantize(config=config)
    model.quantize("int8")
    with pytest.raises(ValueError, match="already quantized to 'int8'"):
        model.quantize("int4")
    with pytest.raises(ValueError, match="save_checkpoint writes float weights, and this model is quantized to 'int8'"):
        keras_vit.save_checkpoint(model, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="export takes a float model, and this one is quantized to 'int8'"):
        keras_vit.export(model, tmp_path / "x.onnx", format="onnx")
    with pytest.raises(ValueError, match="enable_lora on a model quantized to 'int8' is not supported"):
        model.enable_lora(4)


def test_shipped_checkpoint_in_int8_agrees_with_float32():
    model = keras.saving.load_model(os.path.join(CKPT, "model.keras"), safe_mode=True, compile=False)
    sample = np.load(os.path.join(CKPT, "test_sample.npz"), allow_pickle=False)
    x, labels = model.normalize(sample["images"][:1000]), sample["labels"][:1000]
    ref = to_numpy(model.predict(x, batch_size=250, verbose=0)).argmax(-1)
    model.quantize("int8")
    out = to_numpy(model.predict(x, batch_size=250, verbose=0)).argmax(-1)
    assert (out == ref).mean() >= 0.99, (out == ref).mean()
    assert (out == labels).mean() >= (ref == labels).mean() - 0.005


@pytest.fixture(scope="module")
def vit_s():
    model = keras_vit.ViT.from_preset("ViT-S/16", image_size=64, num_classes=10)
    rng = np.random.default_rng(0)
    for v in model.weights:  # a non-zero head, so that every output depends on the attention
        v.assign(rng.normal(0.0, 0.05, v.shape).astype("float32"))
    return model


def test_enable_lora_on_vit_s16_trains_few_weights_and_saves(tmp_path, vit_s):
    base = vit_s
    x = images((4, 64, 64, 3))
    ref = to_numpy(base(x))
    model = keras_vit.ViT.from_config(base.get_config())
    model.set_weights(base.get_weights())
    paths = model.enable_lora(8)
    assert len(paths) == 24 and all(p.endswith(("/query", "/value")) for p in paths)
    np.testing.assert_allclose(to_numpy(model(x)), ref, rtol=1e-6, atol=1e-6)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert 0 < trainable <= 0.05 * model.count_params(), (trainable, model.count_params())
    assert {v.path.rsplit("/", 1)[-1] for v in model.trainable_weights} == {"lora_kernel_a", "lora_kernel_b",
                                                                            "kernel", "bias"}
    assert all("head" in v.path or "lora" in v.path for v in model.trainable_weights)

    frozen = {v.path: to_numpy(v) for v in model.weights if not v.trainable}
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, np.arange(4), epochs=2, batch_size=4, verbose=0)
    tuned = to_numpy(model(x))
    assert np.abs(tuned - ref).max() > 1e-3
    assert all(np.array_equal(to_numpy(v), frozen[v.path]) for v in model.weights if v.path in frozen)

    model.save(tmp_path / "lora.keras")
    again = keras.saving.load_model(tmp_path / "lora.keras", safe_mode=True, compile=False)
    np.testing.assert_allclose(to_numpy(again(x)), tuned, rtol=1e-5, atol=1e-5)

    merged = model.merge_lora()
    assert not any("lora" in v.path for v in merged.weights)
    np.testing.assert_allclose(to_numpy(merged(x)), tuned, rtol=1e-5, atol=1e-5)
    keras_vit.save_checkpoint(merged, tmp_path / "merged.safetensors")
    np.testing.assert_allclose(to_numpy(keras_vit.load(tmp_path / "merged.safetensors")(x)), tuned,
                               rtol=1e-4, atol=1e-5)

    model.save_lora_weights(tmp_path / "adapter.safetensors")
    onto_base = keras_vit.ViT.from_config(base.get_config())
    onto_base.set_weights(base.get_weights())
    onto_base.load_lora_weights(tmp_path / "adapter.safetensors")
    np.testing.assert_allclose(to_numpy(onto_base(x)), tuned, rtol=1e-5, atol=1e-5)


def test_lora_works_with_class_relevance_and_other_targets(tmp_path):
    model = random_vit()
    paths = model.enable_lora(2, target_layer_names=["key", "fc1"])
    assert sorted(paths) == ["encoder/block_0/attn/key", "encoder/block_0/fc1", "encoder/block_1/attn/key",
                             "encoder/block_1/fc1"]
    rng = np.random.default_rng(3)
    for v in model.weights:
        if "lora_kernel_b" in v.path:
            v.assign(rng.normal(0.0, 0.2, v.shape).astype("float32"))
    x = images()
    merged = model.merge_lora()
    np.testing.assert_allclose(to_numpy(merged(x)), to_numpy(model(x)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(keras_vit.class_relevance(model, x, 1)),
                               to_numpy(keras_vit.class_relevance(merged, x, 1)), rtol=1e-4, atol=1e-6)


def test_lora_refuses_bad_arguments_and_files(tmp_path):
    model = random_vit()
    with pytest.raises(ValueError, match=r"rank=0 is not allowed; use a positive integer"):
        model.enable_lora(0)
    with pytest.raises(ValueError, match=r"\['qkv'\] are not layers of this ViT that take LoRA; use names from "):
        model.enable_lora(4, target_layer_names=["query", "qkv"])
    with pytest.raises(ValueError, match="no LoRA weights to save"):
        model.save_lora_weights(tmp_path / "a.safetensors")
    with pytest.raises(ValueError, match="no LoRA weights to merge"):
        model.merge_lora()
    keras_vit.save_checkpoint(model, tmp_path / "plain.safetensors")
    with pytest.raises(ValueError, match="holds no keras_vit LoRA weights"):
        model.load_lora_weights(tmp_path / "plain.safetensors")
    model.enable_lora(4)
    model.save_lora_weights(tmp_path / "r4.safetensors")
    other = random_vit()
    other.enable_lora(2)
    with pytest.raises(ValueError, match=r"does not fit this model's LoRA layers \(rank 2"):
        other.load_lora_weights(tmp_path / "r4.safetensors")
    with pytest.raises(ValueError, match="already enabled"):
        model.enable_lora(4)
    with pytest.raises(ValueError, match=r"quantize\(mode='int8'\) after enable_lora is not supported"):
        model.quantize("int8")

"""Strict loading, refused files, overrides and labels."""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import numpy as np
import pytest
import safetensors.numpy
from tests.checkpoints.checkpoint_oracles import save_npz, timm_state, timm_vit, vit_jax_npz
from tests.conftest import images, to_numpy

import keras_vit


def _timm_file(tmp_path, state):
    path = tmp_path / "w.safetensors"
    safetensors.numpy.save_file(state, str(path))
    return path


def test_strict_names_every_bad_tensor(tmp_path):
    state = timm_state(timm_vit())
    del state["blocks.1.norm1.bias"]
    state["blocks.0.attn.q_norm.weight"] = np.ones(16, "float32")
    state["head.bias"] = np.zeros(6, "float32")
    with pytest.raises(ValueError) as info:
        keras_vit.load(_timm_file(tmp_path, state), num_heads=3)
    message = str(info.value)
    assert "missing blocks.1.norm1.bias (48,)" in message
    assert "unexpected blocks.0.attn.q_norm.weight (16,)" in message
    assert "wrong shape head.bias: (6,), expected (5,)" in message
    assert "nothing was loaded" in message


def test_strict_npz(tmp_path):
    tensors = vit_jax_npz(timm_vit())
    del tensors["Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias"]
    tensors["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/kernel"] = np.zeros((3, 16, 40), "float32")
    with pytest.raises(ValueError) as info:
        keras_vit.load(save_npz(tmp_path / "w.npz", tensors))
    assert "missing Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias" in str(info.value)
    assert "wrong shape Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/kernel" in str(info.value)


@pytest.mark.parametrize("name", ["w.pth", "pytorch_model.bin"])
def test_pickled_files_are_refused(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"\x80\x04not loaded")
    with pytest.raises(ValueError, match="never unpickles.*safetensors.torch.save_file"):
        keras_vit.load(path)
    (tmp_path / "config.json").write_text("{}")
    if name.endswith(".bin"):
        with pytest.raises(ValueError, match="pickled PyTorch weights"):
            keras_vit.load(tmp_path)


# Object arrays, truncated, hostile and half-precision files: test_checkpoints_hostile.py.


def test_unsupported_variants_are_named(tmp_path):
    # Registers and MAP load (test_options_checkpoints.py).
    from timm.models.vision_transformer import ParallelScalingBlock

    state = timm_state(timm_vit(block_fn=ParallelScalingBlock))
    with pytest.raises(ValueError, match="unexpected blocks.0.in_proj.weight"):
        keras_vit.load(_timm_file(tmp_path, state), num_heads=3)
    # QK-norm loads (test_options_checkpoints.py); one of its two norms alone is not QK-norm.
    state = timm_state(timm_vit(qk_norm=True))
    del state["blocks.0.attn.k_norm.weight"], state["blocks.0.attn.k_norm.bias"]
    with pytest.raises(ValueError, match="unexpected blocks.0.attn.q_norm.weight"):
        keras_vit.load(_timm_file(tmp_path, state), num_heads=3)


def test_options_are_checked_before_anything_is_read(tmp_path):
    missing = tmp_path / "nowhere" / "w.safetensors"  # a typo must fail before the path is even looked at
    with pytest.raises(ValueError, match=r"got \['hidden_dim'\].*takes only"):
        keras_vit.load(missing, num_heads=3, hidden_dim=64)
    for bad, message in [(dict(num_clases=3), r"\['num_clases'\]"), (dict(pooling="cls"), "pooling='cls'; use one of"),
                         (dict(image_size=(32,)), r"image_size=\(32,\); use an int or \(H, W\)"),
                         (dict(labels=tmp_path / "no.txt"), "a text file of class names")]:
        with pytest.raises(ValueError, match=message):
            keras_vit.load("hf://org/not-fetched", **bad)


def test_new_head_is_zero_and_keeps_features(tmp_path):
    ref = timm_vit()
    path = _timm_file(tmp_path, timm_state(ref))
    old = keras_vit.load(path, num_heads=3)
    new = keras_vit.load(path, num_heads=3, num_classes=7)
    assert new.num_classes == 7 and not np.any(to_numpy(new.head.classifier.kernel))
    x = images()
    np.testing.assert_array_equal(to_numpy(new(x)), np.zeros((2, 7)))
    np.testing.assert_allclose(to_numpy(new.forward_features(x)), to_numpy(old.forward_features(x)), atol=1e-6)


def test_a_new_head_drops_the_pre_logits_layer(tmp_path):
    """§3.2: the pre-trained prediction head, an MLP at pre-training time (§3.1), is removed: a new
    head of another class count has no tanh pre-logits layer, and the features are kept."""
    tensors = vit_jax_npz(timm_vit())
    rng = np.random.default_rng(0)
    tensors.update({"pre_logits/kernel": rng.normal(0, 0.2, (48, 16)).astype("float32"),
                    "pre_logits/bias": rng.normal(0, 0.2, (16,)).astype("float32"),
                    "head/kernel": rng.normal(0, 0.2, (16, 5)).astype("float32")})
    path = save_npz(tmp_path / "w.npz", tensors)
    old, new = keras_vit.load(path), keras_vit.load(path, num_classes=7)
    assert (old.representation_size, new.representation_size, new.head.pre_logits) == (16, None, None)
    assert new.get_config()["head_initializer"]["class_name"] == "Zeros"
    x = images()
    np.testing.assert_array_equal(to_numpy(new(x)), np.zeros((2, 7)))
    np.testing.assert_allclose(to_numpy(new.forward_features(x)), to_numpy(old.forward_features(x)), atol=1e-6)


def test_labels(tmp_path):
    path = _timm_file(tmp_path, timm_state(timm_vit(num_classes=1000)))
    model = keras_vit.load(path, num_heads=3)
    assert len(model.class_names) == 1000 and model.class_names[0] == "tench, Tinca tinca"
    assert model.class_names[207] == "golden retriever"
    labels = tmp_path / "labels.txt"
    labels.write_text("ant\nbee\nwasp\n")
    model = keras_vit.load(path, num_heads=3, num_classes=3, labels=labels)
    assert model.class_names == ("ant", "bee", "wasp")
    with pytest.raises(ValueError, match="has 3 labels but the model has num_classes=4"):
        keras_vit.load(path, num_heads=3, num_classes=4, labels=labels)


def test_an_unknown_file_or_folder_is_told_every_format(tmp_path):
    from keras_vit.checkpoints import formats

    (tmp_path / "w.h5").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "w.h5", tmp_path / "empty"):
        with pytest.raises(ValueError) as e:
            keras_vit.load(str(path))
        named = [f.what for f in formats.FORMATS if f.what in str(e.value)]
        folders = [f.what for f in formats.FORMATS if f.folder]
        assert named == ([f.what for f in formats.FORMATS] if path.is_file() else folders), str(e.value)
        assert "config.json and model.weights.h5" in str(e.value), str(e.value)


@pytest.mark.parametrize("fmt, stored", [("transformers", "config.json"), ("keras_hub", "metadata.json")])
def test_stored_arguments_are_kept_only_while_the_tensors_match_them(tmp_path, fmt, stored):
    import json

    from tests.conftest import tiny_vit

    keras_vit.save_checkpoint(tiny_vit(name="mine"), tmp_path / "m", format=fmt)  # the name: stored only there
    assert keras_vit.load(str(tmp_path / "m")).name == "mine"
    file = tmp_path / "m" / stored
    meta = json.loads(file.read_text())
    meta["keras_vit"]["num_layers"] += 1  # as if the weights were replaced after keras_vit wrote the folder
    file.write_text(json.dumps(meta))
    loaded = keras_vit.load(str(tmp_path / "m"))
    assert loaded.name == "vit" and loaded.num_layers == tiny_vit().num_layers

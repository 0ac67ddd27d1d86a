"""The vision towers of keras-hub's SigLIP and DINOv2 presets -> keras_vit, against keras-hub's own
models with random weights saved with `save_to_preset`."""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import keras
import numpy as np
import pytest
from tests.checkpoints.checkpoint_oracles import assert_parity
from tests.conftest import images, to_numpy
from tests.checkpoints.kerashub_oracles import MEAN, STD, dinov2_preset, siglip_preset, torch_bicubic

import keras_vit
from keras_vit.io import h5

# (vision encoder options, saved alone rather than in a SigLIPBackbone).
SIGLIP = {"backbone": ({}, False), "alone_exact_gelu": (dict(intermediate_activation="gelu"), True)}


@pytest.mark.parametrize("case", list(SIGLIP))
def test_keras_hub_siglip_tower_loads_with_parity(tmp_path, monkeypatch, case):
    options, alone = SIGLIP[case]
    ref = siglip_preset(tmp_path / "preset", options, alone)
    read = []
    monkeypatch.setattr(h5, "read", lambda path, names: read.extend(names) or _READ(path, names))
    model = keras_vit.load(tmp_path / "preset")
    assert read and not [n for n in read if "text_encoder" in n or "sig_lip_head" in n]  # the text tower is never read
    assert (model.pooling, model.class_token, model.num_classes) == ("map", False, 0)
    assert model.gelu_approximate == (options.get("intermediate_activation", "gelu_approximate") == "gelu_approximate")
    np.testing.assert_allclose(model.image_mean, MEAN, atol=1e-6)
    np.testing.assert_allclose(model.image_std, STD, atol=1e-6)
    x = images()
    assert_parity(f"keras_hub/siglip/{case}", model(x), to_numpy(ref({"images": x})), tol=1e-5)


_READ = h5.read

# DINOv2 options; those with another position_embedding_shape resample the table to image_shape.
DINOV2 = {
    "registers": dict(num_register_tokens=2, layer_scale_init_value=0.5),
    "no_mask_token": dict(use_mask_token=False),
    "resampled": dict(num_register_tokens=1, position_embedding_shape=(24, 24, 3)),
    "resampled_antialias": dict(position_embedding_shape=(48, 48, 3), antialias_in_interpolation=True),
}


@pytest.mark.parametrize("case", list(DINOV2))
def test_keras_hub_dinov2_loads_with_parity(tmp_path, case):
    options = DINOV2[case]
    ref = dinov2_preset(tmp_path / "preset", options)
    model = keras_vit.load(tmp_path / "preset")
    assert (model.image_size, model.num_classes, model.pooling) == ((32, 32), 0, "token")
    assert model.num_register_tokens == options.get("num_register_tokens", 0)
    assert model.layer_scale_init == options.get("layer_scale_init_value", 1.0)
    np.testing.assert_allclose(model.image_std, STD, atol=1e-6)
    side = options.get("position_embedding_shape", (32,))[0] // 4
    if side != 8:
        # keras-hub resamples with the backend's bicubic: torch's on torch, which keras_vit follows
        # (as transformers does); TF and JAX's (a = -0.5) differ, so the reference takes torch's.
        table = torch_bicubic(to_numpy(ref.embeddings.position_embeddings), (side, side), (8, 8),
                              options.get("antialias_in_interpolation", False))
        if keras.backend.backend() == "torch":
            np.testing.assert_allclose(to_numpy(ref.embeddings.interpolated_position_embeddings), table, atol=1e-6)
        ref.embeddings.interpolated_position_embeddings.assign(table)
    x = images()
    assert_parity(f"keras_hub/dinov2/{case}", model.forward_features(x), to_numpy(ref({"images": x})), tol=1e-5)
    assert_parity(f"keras_hub/dinov2/{case}/pooled", model(x), to_numpy(ref({"images": x}))[:, 0], tol=1e-5)


def test_keras_hub_towers_refuse_what_keras_vit_cannot_express(tmp_path):
    siglip_preset(tmp_path / "siglip", dict(intermediate_activation="relu", layer_norm_epsilon=1e-5), alone=True)
    with pytest.raises(ValueError, match=r"config\.json has intermediate_activation='relu', layer_norm_epsilon=1e-05; "
                                         r"keras_vit reads intermediate_activation one of"):
        keras_vit.load(tmp_path / "siglip")
    dinov2_preset(tmp_path / "dinov2", dict(use_swiglu_ffn=True))
    with pytest.raises(ValueError, match=r"config\.json has use_swiglu_ffn=True; keras_vit reads a GELU MLP"):
        keras_vit.load(tmp_path / "dinov2")

"""keras-hub ViT presets -> keras_vit -> keras-hub, against keras-hub's own models with random
weights saved with `save_to_preset`; and keras_vit -> keras-hub presets (`save_checkpoint(format=
"keras_hub")`) -> keras_vit."""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import json

import h5py
import keras_hub
import numpy as np
import pytest
from tests.checkpoints.checkpoint_oracles import assert_parity
from tests.conftest import images, random_vit, to_numpy
from tests.checkpoints.kerashub_oracles import MEAN, STD, keras_hub_preset

import keras_vit

# A backbone's options, a classifier's (None: a backbone alone), and whether an image converter states MEAN, STD.
CASES = {
    "classifier_pre_logits": ({}, dict(num_classes=5, intermediate_dim=24), True),
    "classifier_gap": (dict(use_class_token=False, layer_norm_epsilon=1e-5), dict(num_classes=3, pooling="gap"), False),
    "backbone": ({}, None, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_keras_hub_preset_loads_with_parity(tmp_path, case):
    backbone_options, head, normalized = CASES[case]
    ref = keras_hub_preset(tmp_path / "preset", backbone_options, head, normalized)
    model = keras_vit.load(tmp_path / "preset")
    assert model.num_classes == (head or {}).get("num_classes", 0)
    assert model.representation_size == (head or {}).get("intermediate_dim")
    assert model.class_token == (backbone_options.get("use_class_token", True))
    np.testing.assert_allclose(model.image_mean, MEAN if normalized else (0.0,) * 3, atol=1e-6)
    np.testing.assert_allclose(model.image_std, STD if normalized else (1.0,) * 3, atol=1e-6)
    x = images()
    expected = to_numpy(ref(x))
    assert_parity(f"keras_hub/{case}", model(x), expected if head else expected[:, 0], tol=1e-5)
    keras_vit.save_checkpoint(model, tmp_path / "again", format="keras_hub")
    again = type(ref).from_preset(str(tmp_path / "again"))
    np.testing.assert_allclose(to_numpy(again(x)), expected, rtol=1e-5, atol=1e-6)
    assert _options(again) == _options(ref)


def _options(model):
    """A keras-hub backbone's or classifier's options, as JSON (lists for tuples), but its name."""
    task = {k: v for k, v in model.get_config().items()
            if k in ("num_classes", "pooling", "intermediate_dim", "activation")}
    return json.loads(json.dumps({**getattr(model, "backbone", model).get_config(), **task, "name": None}))


def test_keras_hub_preset_with_linked_data_is_refused(tmp_path):
    keras_hub_preset(tmp_path / "preset", head=dict(num_classes=3))
    with h5py.File(tmp_path / "preset" / "model.weights.h5", "a") as f:
        name = "layers/vi_t_encoder/layer_norm/vars/1"
        del f[name]
        f[name] = h5py.ExternalLink("elsewhere.h5", "/beta")
    with pytest.raises(ValueError, match="vars/1 is a ExternalLink; keras_vit reads only the file's own datasets"):
        keras_vit.load(tmp_path / "preset")


# keras_vit models that keras-hub's ViT holds: every option it carries off its default.
TO_KERAS_HUB = {
    "classifier": dict(representation_size=24, image_mean=MEAN, image_std=STD, class_names=tuple("abcde"),
                       position_embedding="sincos", layer_norm_epsilon=1e-5, dropout_rate=0.1, name="my_vit"),
    "gap_no_class_token": dict(pooling="gap", class_token=False, image_size=(32, 48)),
    "backbone": dict(num_classes=0),
}


@pytest.mark.parametrize("case", list(TO_KERAS_HUB))
def test_save_keras_hub_loads_in_keras_hub_and_back(tmp_path, case):
    model = random_vit(**TO_KERAS_HUB[case])
    keras_vit.save_checkpoint(model, tmp_path / "preset", format="keras_hub")
    cls = keras_hub.models.ViTImageClassifier if model.num_classes else keras_hub.models.ViTBackbone
    ref = cls.from_preset(str(tmp_path / "preset"))
    x = images((2, *model.image_size, 3))
    out = to_numpy(ref(x))
    assert_parity(f"save->keras_hub/{case}", out if model.num_classes else out[:, 0], to_numpy(model(x)), tol=1e-5)
    if model.num_classes:
        pixels = np.random.default_rng(0).integers(0, 256, (2, *model.image_size, 3)).astype("float32")
        np.testing.assert_allclose(to_numpy(ref.preprocessor(pixels)), to_numpy(model.normalize(pixels)), atol=1e-5)
    again = keras_vit.load(tmp_path / "preset")
    assert again.get_config() == model.get_config()
    np.testing.assert_allclose(to_numpy(again(x)), to_numpy(model(x)), rtol=1e-5, atol=1e-6)


def test_save_keras_hub_refuses_what_vit_cannot_hold(tmp_path):
    for option, value in [("num_register_tokens", 2), ("qk_norm", True), ("pooling", "map"),
                          ("gelu_approximate", True)]:
        with pytest.raises(ValueError, match=rf"^the keras_hub writer does not support .*\b{option}={value!r} \("):
            keras_vit.save_checkpoint(random_vit(**{option: value}), tmp_path / option, format="keras_hub")
        assert not (tmp_path / option).exists()
    with pytest.raises(ValueError, match=r"representation_size=16 \(ViTBackbone has no pre-logits layer\)"):
        keras_vit.save_checkpoint(random_vit(num_classes=0, representation_size=16), tmp_path / "x", format="keras_hub")

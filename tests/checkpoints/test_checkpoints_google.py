"""Google `.npz` (vit_jax / AugReg and big_vision) -> keras_vit parity.

The files are written from a random timm model by the test-side writers in checkpoint_oracles;
timm's own npz reader (`_load_weights`) checks that those writers are faithful. Google's models
use the tanh GELU, so the timm reference is built with it.
"""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import numpy as np
import pytest
import scipy.ndimage
import torch
from tests.checkpoints.checkpoint_oracles import (
    assert_parity, big_vision_npz, relative_error, save_npz, tanh_gelu, timm_vit, torch_logits, vit_jax_npz,
)
from tests.conftest import images, to_numpy
from timm.models.vision_transformer import _load_weights

import keras_vit

LAYOUTS = {
    "vit_jax": vit_jax_npz,
    "big_vision": big_vision_npz,
    "big_vision_scan": lambda m: big_vision_npz(m, scan=True),
}
CASES = {
    "token": ({}, (32, 32)),
    "gap": (dict(class_token=False, global_pool="avg", fc_norm=False), (32, 32)),
    "non_square": (dict(img_size=(32, 48)), (32, 48)),
}


def _reference(layout, case_kwargs, seed=0):
    # big_vision adds no position to the class token: timm's no_embed_class is that model.
    extra = dict(no_embed_class=True) if layout != "vit_jax" and case_kwargs.get("class_token", True) else {}
    return timm_vit(seed=seed, act_layer=tanh_gelu, **case_kwargs, **extra)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_npz_writer_is_faithful_to_timm_loader(tmp_path, layout):
    ref = _reference(layout, {})
    path = save_npz(tmp_path / "w.npz", LAYOUTS[layout](ref))
    other = _reference(layout, {}, seed=1)
    with torch.no_grad():
        _load_weights(other, str(path))
    x = images()
    assert relative_error(torch_logits(other, x), torch_logits(ref, x)) < 1e-6


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_google_logits_equal(tmp_path, layout, case):
    kwargs, size = CASES[case]
    ref = _reference(layout, kwargs)
    path = save_npz(tmp_path / "w.npz", LAYOUTS[layout](ref))
    overrides = {"source_image_size": size} if size[0] != size[1] else {}
    model = keras_vit.load(path, **overrides)
    assert (model.gelu_approximate, model.resample_method, model.image_mean) == (True, "bilinear", (0.5,) * 3)
    assert model.image_size == size and model.pooling == ("gap" if case == "gap" else "token")
    x = images((2, *size, 3))
    assert_parity(f"{layout}/{case}", model(x), torch_logits(ref, x))


def test_google_pre_logits(tmp_path):
    """The tanh representation layer of the in21k checkpoints: logits = head(tanh(pre(x_cls)))."""
    ref = timm_vit(act_layer=tanh_gelu)
    tensors = vit_jax_npz(ref)
    rng = np.random.default_rng(0)
    tensors["pre_logits/kernel"] = rng.normal(0, 0.2, (48, 16)).astype("float32")
    tensors["pre_logits/bias"] = rng.normal(0, 0.2, (16,)).astype("float32")
    tensors["head/kernel"] = rng.normal(0, 0.2, (16, 5)).astype("float32")
    model = keras_vit.load(save_npz(tmp_path / "w.npz", tensors))
    assert model.representation_size == 16
    x = images()
    with torch.no_grad():
        cls = ref.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2)))[:, 0].double().numpy()
    expected = np.tanh(cls @ tensors["pre_logits/kernel"] + tensors["pre_logits/bias"])
    expected = expected @ tensors["head/kernel"] + tensors["head/bias"]
    assert_parity("vit_jax/pre_logits", model(x), expected)


def test_google_resample_bilinear_matches_zoom(tmp_path):
    """A new, non-square size: the patch rows equal scipy.ndimage.zoom(order=1) of the grid, the
    class row is kept, and the logits equal timm's model built at that size with that table."""
    ref = timm_vit(act_layer=tanh_gelu)
    model = keras_vit.load(save_npz(tmp_path / "w.npz", vit_jax_npz(ref)), image_size=(48, 24))
    table = ref.pos_embed.detach().numpy()[0]
    grid = scipy.ndimage.zoom(table[1:].reshape(8, 8, 48), (12 / 8, 6 / 8, 1), order=1)  # (h, w, D)
    expected = np.concatenate([table[:1], grid.reshape(72, 48)])[None]
    assert relative_error(to_numpy(model.position_embedding.embedding), expected) < 1e-6
    big = timm_vit(img_size=(48, 24), act_layer=tanh_gelu)
    state = ref.state_dict()
    state["pos_embed"] = torch.from_numpy(expected)
    big.load_state_dict(state)
    x = images((2, 48, 24, 3))
    assert_parity("vit_jax/resample_bilinear", model(x), torch_logits(big, x))

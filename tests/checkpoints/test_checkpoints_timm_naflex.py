"""timm `NaFlexVit` `.safetensors` <-> keras_vit parity on patch sequences, against timm's model with
random weights: the same patch dicts (a batch mixing aspect ratios, padded) give the same logits."""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import numpy as np
import pytest
import safetensors.numpy
import torch
from tests.checkpoints.checkpoint_oracles import assert_parity, randomize_torch, timm_state
from tests.conftest import logits, randomize, tiny_vit
from timm.data.naflex_transforms import get_image_size_for_seq, patchify_image
from timm.models.naflexvit import NaFlexVit, NaFlexVitCfg

import keras_vit
from keras_vit import naflex

TINY_NAFLEX = dict(patch_size=4, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0, pos_embed_grid_size=(8, 8))


def timm_naflex(seed=0, **overrides):
    torch.manual_seed(seed)
    return randomize_torch(NaFlexVit(NaFlexVitCfg(**{**TINY_NAFLEX, **overrides}), num_classes=5), seed)


SHAPES = [(32, 32), (20, 60), (70, 12), (9, 50)]


def sequences(max_seq_len=64, seed=2):
    """Four images, square, wide, tall and very wide, as a padded batch: grids 8 x 8 (the table's),
    4 x 12, 18 x 3 and 3 x 17, three of them padded."""
    rng = np.random.default_rng(seed)
    images = [rng.uniform(0, 255, (*s, 3)).astype("float32") for s in SHAPES]
    return naflex.patch_sequences(images, 4, max_seq_len)


@pytest.mark.one_backend
def test_budget_grid_is_timms_largest_size_within_the_budget():
    rng = np.random.default_rng(0)
    sizes = [(224, 224), (1, 500), (500, 1), (37, 1000), (480, 640), (3, 3)] + [
        tuple(int(v) for v in rng.integers(1, 900, 2)) for _ in range(40)]
    for patch, budget in ((16, 256), (4, 64), (14, 729), (16, 1)):
        for h, w in sizes:
            ratio, (th, tw) = get_image_size_for_seq((h, w), patch, budget)
            if ratio > 99.99:  # timm's bisection stops at 100x; the closed form has no such bound
                continue
            assert naflex.budget_grid(h, w, patch, budget) == (th // patch, tw // patch), (h, w, patch, budget)


@pytest.mark.one_backend
def test_patch_sequences_are_timms_patchify_of_the_resized_image():
    image = np.random.default_rng(0).uniform(0, 255, (20, 60, 3)).astype("float32")
    pixels = (naflex.resize_to_budget(image, 4, 64) / 255.0 - 0.5) / 0.5  # (16, 48, 3)
    patches, coord, valid = patchify_image(torch.from_numpy(pixels.transpose(2, 0, 1).copy()), (4, 4))
    got = naflex.patch_sequences([image], 4, 64)
    n = len(patches)
    np.testing.assert_allclose(got["patches"][0, :n], patches.numpy(), atol=1e-6)
    np.testing.assert_array_equal(got["patch_coord"][0, :n], coord.numpy())
    assert got["patch_valid"][0].tolist() == [True] * n + [False] * (64 - n) and not got["patches"][0, n:].any()


def timm_logits(model, batch):
    with torch.no_grad():
        return model({k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}).numpy()


@pytest.mark.parametrize("case, overrides", [
    ("learned_map", dict()),  # NaFlexVitCfg's defaults: MAP pooling, no class token
    ("factorized_gap", dict(pos_embed="factorized", class_token=True, reg_tokens=2, global_pool="avg", fc_norm=True,
                            init_values=1e-5)),
    ("learned_token_keep_aspect", dict(class_token=True, global_pool="token", pos_embed_ar_preserving=True)),
    ("factorized_map_keep_aspect", dict(pos_embed="factorized", pos_embed_ar_preserving=True, reg_tokens=1)),
])
def test_naflex_logits_equal_timm(tmp_path, case, overrides):
    ref = timm_naflex(**overrides)
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(timm_state(ref), str(path))
    keep_aspect = overrides.get("pos_embed_ar_preserving", False)
    model = keras_vit.load_checkpoint(path, num_heads=3, resample_keep_aspect=keep_aspect)
    assert model.max_seq_len == 64 and model.patch_size == 4 and model.image_size == (32, 32)
    assert model.position_embedding_kind == overrides.get("pos_embed", "learned")
    batch = sequences()
    assert batch["patch_valid"].sum(1).tolist() == [64, 48, 54, 51]
    assert_parity(f"timm_naflex/{case}", logits(model, batch), timm_logits(ref, batch))


@pytest.mark.parametrize("case, options, timm_options", [
    ("learned_token_registers", dict(num_register_tokens=2, max_seq_len=64, resample_method="bicubic"),
     dict(class_token=True, reg_tokens=2, global_pool="token")),
    ("learned_bilinear_map", dict(pooling="map", max_seq_len=64, resample_method="bilinear"),  # corners aligned
     dict(pos_embed_interp_mode="bilinear", pos_embed_align_corners=True, pos_embed_antialias=False)),
    ("factorized_gap", dict(pooling="gap", position_embedding="factorized", fc_norm=True, layer_scale_init=0.5),
     dict(pos_embed="factorized", global_pool="avg", fc_norm=True, init_values=0.5)),
])
def test_save_checkpoint_writes_a_file_naflexvit_loads(tmp_path, case, options, timm_options):
    """A model of patch sequences (or factorized positions) is written in NaFlexVit's layout; the
    class and register rows of a learned table are added to those tokens, as timm converts a ViT."""
    model = randomize(tiny_vit(**options))
    path = tmp_path / "out.safetensors"
    keras_vit.save_checkpoint(model, path)
    ref = NaFlexVit(NaFlexVitCfg(**{**TINY_NAFLEX, **timm_options}), num_classes=5).eval()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in safetensors.numpy.load_file(str(path)).items()})
    batch = sequences()
    expected = logits(model, batch)
    assert_parity(f"save->timm_naflex/{case}", timm_logits(ref, batch), expected)
    again = keras_vit.load_checkpoint(path)  # the metadata restores the arguments
    assert again.get_config() == model.get_config()
    np.testing.assert_allclose(logits(again, batch), expected, rtol=1e-5, atol=1e-5)


def test_a_vit_checkpoint_serves_patch_sequences_as_timm_converts_it(tmp_path):
    """A VisionTransformer file loads with max_seq_len into the same variables, and gives on patch
    sequences the logits of the NaFlexVit that timm's own `checkpoint_filter_fn` makes of it."""
    from timm.models.naflexvit import checkpoint_filter_fn
    from tests.checkpoints.checkpoint_oracles import timm_vit

    vit = timm_vit(img_size=32)  # a class token with its position row, token pooling
    path = tmp_path / "vit.safetensors"
    safetensors.numpy.save_file(timm_state(vit), str(path))
    model = keras_vit.load_checkpoint(path, num_heads=3, max_seq_len=64)
    plain = keras_vit.load_checkpoint(path, num_heads=3)
    assert [v.path for v in model.weights] == [v.path for v in plain.weights]
    ref = NaFlexVit(NaFlexVitCfg(**TINY_NAFLEX, class_token=True, global_pool="token", embed_proj_type="linear"),
                    num_classes=5).eval()
    ref.load_state_dict(checkpoint_filter_fn(vit.state_dict(), ref))
    batch = sequences()
    assert_parity("timm_vit->naflex", logits(model, batch), timm_logits(ref, batch))

"""keras_vit.class_relevance (keras_vit/explain/relevance.py): Chefer et al.'s rule for the class's
log-softmax, 0 on patches equal to the background, against the same method computed with torch
autograd on timm's VisionTransformer holding the same weights, one image with
several classes, the block-by-block backward sweep against one backward pass through the whole
encoder, a localization test on a tiny model trained here, and the checks of `classes`.

Every backend runs these tests against the same timm reference, so the three backends agree with it
and with each other.
"""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import keras
import numpy as np
import pytest
import safetensors.numpy
import torch
from tests.conftest import TINY, images, randomize, tiny_vit, to_numpy
from timm.models.vision_transformer import VisionTransformer
from tests.model.variant_oracles import TIMM_OPTIONS, copy_timm, timm_hybrid, timm_model

import keras_vit
from experiments.explain.localization import localization_scores, make_objects, train
from experiments.explain.methods import METHODS
from keras_vit.explain import autodiff, relevance

CLASSES = np.array([3, 1])


def timm_relevance(ref, x, classes, baseline, cell):
    """Chefer et al.'s rule for log_softmax(logits)[c] on a timm ViT: its non-fused attention path,
    the probabilities caught by forward hooks on the attention dropout, their gradients from one
    torch.autograd pass; 0 on the `cell` x `cell` pixel cells that equal `baseline` (C,)."""
    probs = []
    hooks = []
    for block in ref.blocks:
        attn = block.attn if hasattr(block, "attn") else block  # ParallelScalingBlock holds its attention
        attn.fused_attn = False
        hooks.append(attn.attn_drop.register_forward_hook(lambda module, args, out: probs.append(out)))
    try:
        with torch.enable_grad():
            logits = ref(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))))  # NHWC -> NCHW
            target = torch.log_softmax(logits, -1).gather(1, torch.from_numpy(classes)[:, None]).sum()
            grads = torch.autograd.grad(target, probs)
    finally:
        for hook in hooks:
            hook.remove()
    t, p = probs[0].shape[-1], ref.num_prefix_tokens
    start = torch.zeros(len(x), t, dtype=torch.float64)
    if ref.global_pool == "token":
        start[:, 0] = 1.0
    else:  # "avg" and "map" read the patch tokens
        start[:, p:] = 1.0 / (t - p)
    row = start
    for a, g in zip(reversed(probs), reversed(grads)):
        abar = (g.double() * a.detach().double()).clamp(min=0).mean(1)  # (B, K, T, T) -> (B, T, T)
        row = row + torch.einsum("bt,bts->bs", row, abar)
    h, w = ref.patch_embed.grid_size
    near = (np.abs(x - baseline) <= 1e-3).all(-1).reshape(len(x), h, cell, w, cell)  # (B, H, W) per cell
    return (row - start)[:, p:].reshape(len(x), h, w).numpy() * ~near.all((2, 4))  # the share the layers add


def black(model):
    """A black pixel in the model's input space (C,), from its mean and std."""
    return ((0.0 - np.asarray(model.image_mean)) / np.asarray(model.image_std)).astype("float32")


def with_background(model):
    """The test images, the first with its top-left 16 x 16 pixels black: 16 patches of a patch-4
    grid, one cell of the hybrid's 16-pixel grid."""
    x = images()
    x[0, :16, :16] = black(model)
    return x


def relative_error(actual, expected):
    """max |actual - expected| over the range of `expected`: the constant that the identity adds to
    every patch of a "gap" map cannot make a wrong map look right."""
    actual, expected = np.asarray(to_numpy(actual), np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    return float(np.abs(actual - expected).max() / (expected.max() - expected.min()))


def _saved_in_timm(tmp_path, pooling):
    """A keras_vit model through `save_checkpoint` into timm's VisionTransformer."""
    model = randomize(tiny_vit(pooling=pooling), scale=0.1)
    keras_vit.save_checkpoint(model, tmp_path / "m.safetensors")
    gap = pooling == "gap"
    ref = VisionTransformer(img_size=32, patch_size=4, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0,
                            num_classes=5, class_token=not gap, global_pool="avg" if gap else "token", fc_norm=False)
    state = safetensors.numpy.load_file(str(tmp_path / "m.safetensors"))
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return model, ref.eval()


def _copied_from_timm(case):
    """A timm model of one of variant_oracles' options, copied into keras_vit."""
    if case == "hybrid":
        ref = timm_hybrid(layers=(1, 1))
        return (copy_timm(keras_vit.ViT(**{**TINY, "stem": "resnet50", "patch_size": 1, "stem_layers": (1, 1)}), ref),
                ref)
    ours, theirs = TIMM_OPTIONS[case]
    ref = timm_model(**theirs)
    return copy_timm(tiny_vit(**ours), ref), ref


@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_matches_timm_autograd_through_save_checkpoint(tmp_path, pooling):
    model, ref = _saved_in_timm(tmp_path, pooling)
    x = with_background(model)
    got = keras_vit.class_relevance(model, x, CLASSES)
    assert tuple(got.shape) == (2, 8, 8) and "float32" in str(got.dtype)
    expected = timm_relevance(ref, x, CLASSES, black(model), 4)
    assert (expected[0, :4, :4] == 0).all() and (expected[1] != 0).all()  # the background cells are 0
    err = relative_error(got, expected)
    assert err <= 1e-4, f"{pooling}: relative error {err:.2e}"


@pytest.mark.parametrize("case", ["map", "registers_gap", "layer_scale", "vit22b_style", "hybrid"])
def test_matches_timm_autograd_on_variants(case):
    model, ref = _copied_from_timm(case)
    x = with_background(model)
    expected = timm_relevance(ref, x, CLASSES, black(model), model.token_pixels)
    err = relative_error(keras_vit.class_relevance(model, x, CLASSES), expected)
    assert err <= 1e-4, f"{case}: relative error {err:.2e}"


def test_maps_depend_on_the_class():
    model = randomize(tiny_vit(), scale=0.1)
    x = images()
    a, b = (to_numpy(keras_vit.class_relevance(model, x, c)) for c in (0, 4))
    assert relative_error(a, b) > 0.05
    top = np.argmax(to_numpy(model(x)), axis=-1)
    np.testing.assert_array_equal(to_numpy(keras_vit.class_relevance(model, x)),
                                  to_numpy(keras_vit.class_relevance(model, x, top)))


def test_patches_equal_to_the_baseline_get_zero():
    model = randomize(tiny_vit(), scale=0.1)
    x = images()
    x[:, 4:12, 8:16] = [0.5, -0.25, 1.0]  # patches (1..2, 2..3)
    default, given = (to_numpy(keras_vit.class_relevance(model, x, CLASSES, baseline=b))
                      for b in (None, [0.5, -0.25, 1.0]))
    assert (given[:, 1:3, 2:4] == 0).all() and np.count_nonzero(given) == 2 * (64 - 4)
    assert np.count_nonzero(default) == 2 * 64
    np.testing.assert_array_equal(np.where(given == 0, 0, default), given)  # the same map elsewhere


def test_one_image_with_several_classes_equals_the_image_repeated():
    model = randomize(tiny_vit(), scale=0.1)
    x = images()[:1]
    several = to_numpy(keras_vit.class_relevance(model, x, [4, 0, 2]))
    repeated = to_numpy(keras_vit.class_relevance(model, np.repeat(x, 3, axis=0), [4, 0, 2]))
    assert several.shape == (3, 8, 8)
    np.testing.assert_allclose(several, repeated, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("options", [dict(parallel_block=True, qk_norm=True, pooling="map"),
                                     dict(fc_norm=True, pooling="gap")])
def test_block_by_block_equals_one_backward_pass(options):
    """The sweep's gradients, chained from block to block, equal one vjp through the whole encoder
    with every layer's probability offset as an input."""
    model = randomize(tiny_vit(**options), scale=0.1)
    classes = keras.ops.convert_to_tensor(CLASSES)

    def both(model, x):
        t = model.num_prefix_tokens + 64

        def whole(*offsets):
            h = model.embed_tokens(x, training=False)
            for block, offset in zip(model.encoder.blocks, offsets):
                h, _ = relevance._block_with_offset(block, h, offset)
            return relevance.head_logits(model, h), None

        offsets = tuple(keras.ops.zeros((2, model.num_heads, t, t)) for _ in range(model.num_layers))
        _, _, expected = autodiff.vjp(whole, offsets, keras.ops.one_hot(classes, 5))
        tokens, _ = relevance.block_inputs(model, x)
        swept = [grad for _, _, grad, _ in relevance.gradient_sweep(model, tokens, classes)]
        return expected, swept[::-1]

    expected, swept = autodiff.model_function(both, model)(keras.ops.convert_to_tensor(images()))
    for got, want in zip(swept, expected):
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-4, atol=1e-7)


def test_bad_classes_are_refused():
    model, x = tiny_vit(), images()
    for classes, match in [
        (5, r"classes=5 is not allowed: 5 is not a class of this model; use None .* an int in \[0, 5\)"),
        ([1, -1], r"classes=\[1, -1\] is not allowed: -1 is not a class"),
        ([1, 2, 3], "classes has 3 entries for 2 images"),
        (1.0, r"classes=1.0 is not allowed"),
        (True, r"classes=True is not allowed"),
        ("1", r"classes='1' is not allowed"),
        ([[1], [2]], r"classes=\[\[1\], \[2\]\] is not allowed"),
    ]:
        with pytest.raises(ValueError, match=match):
            keras_vit.class_relevance(model, x, classes)
    for baseline, match in [
        ([0.0, 1.0], r"baseline=\[0.0, 1.0\] is not allowed; use None \(a black pixel\), "
                     r"a float or a sequence of 3 floats"),
        ("black", r"baseline='black' is not allowed"),
        (True, r"baseline=True is not allowed"),
        (float("nan"), r"baseline=nan is not allowed: it is not finite"),
    ]:
        with pytest.raises(ValueError, match=match):
            keras_vit.class_relevance(model, x, baseline=baseline)
    with pytest.raises(ValueError, match="num_classes=0"):
        keras_vit.class_relevance(tiny_vit(num_classes=0), x)
    with pytest.raises(ValueError, match='pooling="none"'):
        keras_vit.class_relevance(tiny_vit(pooling="none"), x)


@pytest.mark.slow  # trains a model: about 40 s per backend on 2 cores
def test_each_class_map_peaks_on_its_own_shape():
    """The localization test of experiments/explain/__main__.py, small: a tiny multi-label model learns four
    colored shapes (seconds of training), and on images holding two shapes each class's map must
    peak on its own shape, where rollout's one map can peak on only one."""
    x, y, _, _ = make_objects(600, np.random.default_rng(0), size=24)
    test, _, masks, kinds = make_objects(40, np.random.default_rng(1), size=24, two=1.0)
    config = dict(image_size=24, patch_size=4, hidden_dim=32, num_layers=2, num_heads=2, mlp_dim=64, pooling="token")
    model = train(x, y, config, epochs=4)
    ours = localization_scores(model, test, masks, kinds, METHODS["class_relevance"])
    rollout = localization_scores(model, test, masks, kinds, METHODS["rollout"])
    assert ours["pairs"] == 80 and ours["peak"] >= 0.8 and ours["blank"] >= 0.8, ours
    assert rollout["peak"] <= 0.5, rollout

"""keras_vit.class_relevance (keras_vit/relevance.py): Chefer et al.'s rule against the same rule
computed with torch autograd on timm's VisionTransformer holding the same weights, one image with
several classes, the block-by-block backward sweep against one backward pass through the whole
encoder, a localization test on a tiny model trained here, and the checks of `classes`.

Every backend runs these tests against the same timm reference, so the three backends agree with it
and with each other.
"""

import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import keras
import numpy as np
import pytest
import safetensors.numpy
import torch
from conftest import TINY, images, randomize, tiny_vit, to_numpy
from timm.models.vision_transformer import VisionTransformer
from variant_oracles import TIMM_OPTIONS, copy_timm, timm_hybrid, timm_model

import keras_vit
from keras_vit import autodiff, relevance

CLASSES = np.array([3, 1])


def timm_relevance(ref, x, classes):
    """Chefer et al.'s rule on a timm ViT: its non-fused attention path, the probabilities caught by
    forward hooks on the attention dropout, their gradients from one torch.autograd pass."""
    probs = []
    hooks = []
    for block in ref.blocks:
        attn = block.attn if hasattr(block, "attn") else block  # ParallelScalingBlock holds its attention
        attn.fused_attn = False
        hooks.append(attn.attn_drop.register_forward_hook(lambda module, args, out: probs.append(out)))
    try:
        with torch.enable_grad():
            logits = ref(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))))  # NHWC -> NCHW
            target = logits.gather(1, torch.from_numpy(classes)[:, None]).sum()
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
    return (row - start)[:, p:].reshape(len(x), h, w).numpy()  # the share the layers add


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
        return copy_timm(keras_vit.ViT(**{**TINY, "stem": "resnet50", "patch_size": 1, "stem_layers": (1, 1)}), ref), ref
    ours, theirs = TIMM_OPTIONS[case]
    ref = timm_model(**theirs)
    return copy_timm(tiny_vit(**ours), ref), ref


@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_matches_timm_autograd_through_save_checkpoint(tmp_path, pooling):
    model, ref = _saved_in_timm(tmp_path, pooling)
    x = images()
    got = keras_vit.class_relevance(model, x, CLASSES)
    assert tuple(got.shape) == (2, 8, 8) and "float32" in str(got.dtype)
    err = relative_error(got, timm_relevance(ref, x, CLASSES))
    assert err <= 1e-4, f"{pooling}: relative error {err:.2e}"


@pytest.mark.parametrize("case", ["map", "registers_gap", "layer_scale", "vit22b_style", "hybrid"])
def test_matches_timm_autograd_on_variants(case):
    model, ref = _copied_from_timm(case)
    x = images()
    err = relative_error(keras_vit.class_relevance(model, x, CLASSES), timm_relevance(ref, x, CLASSES))
    assert err <= 1e-4, f"{case}: relative error {err:.2e}"


def test_maps_depend_on_the_class():
    model = randomize(tiny_vit(), scale=0.1)
    x = images()
    a, b = (to_numpy(keras_vit.class_relevance(model, x, c)) for c in (0, 4))
    assert relative_error(a, b) > 0.05
    top = np.argmax(to_numpy(model(x)), axis=-1)
    np.testing.assert_array_equal(to_numpy(keras_vit.class_relevance(model, x)),
                                  to_numpy(keras_vit.class_relevance(model, x, top)))


def test_one_image_with_several_classes_equals_the_image_repeated():
    model = randomize(tiny_vit(), scale=0.1)
    x = images()[:1]
    several = to_numpy(keras_vit.class_relevance(model, x, [4, 0, 2]))
    repeated = to_numpy(keras_vit.class_relevance(model, np.repeat(x, 3, axis=0), [4, 0, 2]))
    assert several.shape == (3, 8, 8)
    np.testing.assert_allclose(several, repeated, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("options", [dict(parallel_block=True, qk_norm=True, pooling="map"), dict(fc_norm=True, pooling="gap")])
def test_block_by_block_equals_one_backward_pass(options):
    """The sweep's gradients, chained from block to block, equal one vjp through the whole encoder
    with every layer's probability offset as an input."""
    model = randomize(tiny_vit(**options), scale=0.1)
    x = keras.ops.convert_to_tensor(images())
    t, k = model.num_prefix_tokens + 64, model.num_heads
    offsets = tuple(keras.ops.zeros((2, k, t, t)) for _ in range(model.num_layers))

    def whole(*offsets):
        h = model.embed_tokens(x, training=False)
        for block, offset in zip(model.encoder.blocks, offsets):
            h, _ = relevance._block_with_offset(block, h, offset)
        return relevance.head_logits(model, h), None

    _, _, expected = autodiff.vjp(whole, offsets, keras.ops.one_hot(CLASSES, 5))
    tokens, _ = relevance.block_inputs(model, x)
    for index, _, grad, _ in relevance.gradient_sweep(model, tokens, keras.ops.convert_to_tensor(CLASSES)):
        np.testing.assert_allclose(to_numpy(grad), to_numpy(expected[index]), rtol=1e-4, atol=1e-7)


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
    with pytest.raises(ValueError, match="num_classes=0"):
        keras_vit.class_relevance(tiny_vit(num_classes=0), x)
    with pytest.raises(ValueError, match='pooling="none"'):
        keras_vit.class_relevance(tiny_vit(pooling="none"), x)

"""The ViT family options: MAP pooling, register tokens, LayerScale, QK-norm, parallel blocks and
use_bias=False, each against timm's VisionTransformer with random weights; their layers' configs;
and the analytic parameter count, including ViT-22B."""

import dataclasses

import keras
import numpy as np
import pytest
import torch
from tests.checkpoints.checkpoint_oracles import assert_parity, torch_logits
from tests.conftest import TINY, images, randomize, tiny_vit, to_numpy
from tests.model.oracle import param_count
from tests.model.variant_oracles import TIMM_OPTIONS, copy_timm, timm_model

import keras_vit
from keras_vit import layers

ALL_OPTIONS = dict(num_register_tokens=2, pooling="map", qk_norm=True, parallel_block=True, use_bias=False,
                   layer_scale_init=0.1)


@pytest.mark.parametrize("case", list(TIMM_OPTIONS))
def test_option_matches_timm(case):
    ours, theirs = TIMM_OPTIONS[case]
    ref = timm_model(**theirs)
    model = copy_timm(tiny_vit(**ours), ref)
    assert model.count_params() == sum(p.numel() for p in ref.parameters()), "a weight is missing on one side"
    x = images()
    assert_parity(f"option/{case}", model(x), torch_logits(ref, x))


def test_dinov2_style_registers_without_position_match_timm():
    """DINOv2 gives registers and the class token no position (timm no_embed_class): zero rows."""
    ref = timm_model(reg_tokens=4, no_embed_class=True, init_values=0.1)
    model = copy_timm(tiny_vit(num_register_tokens=4, layer_scale_init=0.1), ref)
    x = images()
    assert_parity("option/registers_no_embed_class", model(x), torch_logits(ref, x))


@pytest.mark.parametrize("case", ["map", "registers_gap", "vit22b_style"])
def test_attention_scores_path_equals_fused_path(case):
    """return_attention_scores takes Keras' explicit softmax path; it must give the same tokens."""
    model = randomize(tiny_vit(**TIMM_OPTIONS[case][0]))
    x = images()
    fused = to_numpy(model.forward_features(x))
    explicit, maps = model.forward_features(x, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(explicit), fused, atol=2e-5)
    t = model.num_prefix_tokens + 64
    assert tuple(maps[0].shape) == (2, 3, t, t)
    np.testing.assert_allclose(to_numpy(maps[0]).sum(-1), 1.0, atol=1e-5)


def test_registers_are_prefix_tokens_skipped_by_pooling_rollout_and_grid():
    model = randomize(tiny_vit(num_register_tokens=3, pooling="gap", num_classes=0))
    assert (model.num_prefix_tokens, model.class_token) == (3, False)
    x = images()
    tokens = to_numpy(model.forward_features(x))
    assert tokens.shape == (2, 3 + 64, 48)
    np.testing.assert_allclose(to_numpy(model(x)), tokens[:, 3:].mean(1), atol=1e-5)
    assert tuple(model.feature_grid(x).shape) == (2, 8, 8, 48)
    assert tuple(keras_vit.attention_rollout(model, x).shape) == (2, 8, 8)
    assert keras_vit.mean_attention_distance(model, x).shape == (2, 3)
    with_cls = tiny_vit(num_register_tokens=2)
    assert with_cls.num_prefix_tokens == 3 and with_cls.position_embedding.embedding.shape == (1, 3 + 64, 48)


def test_map_pools_only_patch_tokens():
    """Changing the register tokens changes the patches' values, so compare the head on the grid alone."""
    model = randomize(tiny_vit(num_register_tokens=2, pooling="map", num_classes=0))
    tokens = model.forward_features(images())
    pooled = to_numpy(model.head(tokens))
    np.testing.assert_allclose(pooled, to_numpy(model.head.map_head(tokens[:, 2:])), atol=1e-6)
    shuffled = keras.ops.concatenate([tokens[:, 1:2], tokens[:, 0:1], tokens[:, 2:]], axis=1)  # registers swapped
    np.testing.assert_allclose(to_numpy(model.head(shuffled)), pooled, atol=1e-6)


def test_qk_norm_override_is_live_and_matches_keras_signature():
    """An upstream rename of MultiHeadAttention._compute_attention would silently drop QK-norm
    (its signature is checked by tests/layers/test_layers.py's test of the private Keras API)."""
    model = randomize(tiny_vit(qk_norm=True))
    block = model.encoder.blocks[0]
    assert isinstance(block.attn, layers.Attention) and block.attn.q_norm is not None
    x = images()
    for path in (False, True):  # the fused path and the explicit-scores path both normalize
        block.attn.q_norm.gamma.assign(np.ones(16, "float32"))
        before = to_numpy(block(model.patch_embedding(x), return_attention_scores=path)[0] if path
                          else block(model.patch_embedding(x)))
        block.attn.q_norm.gamma.assign(np.full(16, 4.0, "float32"))  # sharper attention
        after = to_numpy(block(model.patch_embedding(x), return_attention_scores=path)[0] if path
                         else block(model.patch_embedding(x)))
        assert np.abs(after - before).max() > 1e-2


def test_plain_path_is_keras_multi_head_attention_without_qk_norm():
    block = tiny_vit().encoder.blocks[0]
    assert isinstance(block.attn, keras.layers.MultiHeadAttention) and block.attn.q_norm is None
    assert isinstance(block.norm2, keras.layers.LayerNormalization)
    assert type(block.ls1) is type(block.ls2) is keras.layers.Identity  # no LayerScale by default


def test_use_bias_false_drops_exactly_the_qkv_and_layer_norm_biases():
    model = tiny_vit(use_bias=False)
    block = model.encoder.blocks[0]
    assert all(d.bias is None for d in (block.attn.query_dense, block.attn.key_dense, block.attn.value_dense))
    assert block.attn.output_dense.bias is not None and block.fc1.bias is not None and block.fc2.bias is not None
    assert block.norm1.beta is None and block.norm2.beta is None and model.encoder.norm.beta is None
    assert model.patch_embedding.conv.bias is not None


def test_parallel_block_has_one_norm_and_one_layer_scale():
    block = tiny_vit(parallel_block=True, layer_scale_init=0.1).encoder.blocks[0]
    assert type(block) is layers.TransformerBlock and isinstance(block.ls1, layers.LayerScale)
    assert block.norm2 is None and block.ls2 is None
    assert [w.path.split("/")[-2] for w in block.weights if "norm" in w.path] == ["norm1", "norm1"]


def test_parallel_block_is_an_option_of_the_block_and_keeps_its_old_name():
    block = layers.ParallelTransformerBlock(3, 96, layer_scale_init=0.1)
    assert type(block) is layers.TransformerBlock and block.config == layers.BlockConfig(
        3, 96, layer_scale_init=0.1, parallel_block=True)
    # Files saved while it was a class of its own name it keras_vit>ParallelTransformerBlock.
    assert keras.saving.get_registered_object("keras_vit>ParallelTransformerBlock") is layers.TransformerBlock
    assert keras.saving.get_registered_name(layers.TransformerBlock) == "keras_vit>TransformerBlock"


def test_parallel_block_sums_attention_and_mlp_of_one_norm():
    block = layers.TransformerBlock(3, 96, parallel_block=True, layer_scale_init=0.5)
    x = keras.ops.convert_to_tensor(images((2, 9, 48)))
    y = to_numpy(block(x))
    h = block.norm1(x)
    expected = to_numpy(x + block.ls1(block.attn(h, h) + block.mlp(h)))
    np.testing.assert_allclose(y, expected, atol=1e-5)


def test_block_options_pass_once_as_one_config():
    model = tiny_vit(qk_norm=True, layer_scale_init=0.1, drop_path_rate=0.2)
    config = model.encoder.block_config
    assert (config.qk_norm, config.layer_scale_init, config.num_heads) == (True, 0.1, model.num_heads)
    rates = [block.config.drop_path_rate for block in model.encoder.blocks]
    assert rates == pytest.approx([0.2 * i / (len(rates) - 1) for i in range(len(rates))])
    flat = layers.Encoder(2, num_heads=3, mlp_dim=96, qk_norm=True)
    assert flat.block_config == layers.BlockConfig(3, 96, qk_norm=True)
    assert layers.Encoder.from_config(flat.get_config()).block_config == flat.block_config
    with pytest.raises(ValueError, match="qk_nrom"):  # Keras names the argument that is neither
        layers.Encoder(2, num_heads=3, mlp_dim=96, qk_nrom=True)


def test_all_options_round_trip_through_config_and_keras_file(tmp_path):
    model = randomize(tiny_vit(**ALL_OPTIONS))
    config = model.get_config()
    assert {k: config[k] for k in ALL_OPTIONS} == ALL_OPTIONS
    x = images()
    expected = to_numpy(model(x))
    clone = keras_vit.ViT.from_config(config)
    assert clone.get_config() == config
    path = tmp_path / "options.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.get_config() == config
    np.testing.assert_allclose(to_numpy(loaded(x)), expected, atol=1e-6)


@pytest.mark.parametrize(
    "layer, inputs",
    [
        (layers.TransformerBlock(3, 96, parallel_block=True, qk_norm=True, use_bias=False, layer_scale_init=0.1),
         [(2, 9, 48)]),
        (layers.Attention(3, 16, qk_norm=True, qkv_bias=False, norm_bias=False), [(2, 9, 48), (2, 9, 48)]),
        (layers.MAPHead(3, 96, gelu_approximate=True), [(2, 9, 48)]),
        (layers.ClassifierHead(5, pooling="map", num_prefix_tokens=2, block=layers.BlockConfig(3, 96)), [(2, 11, 48)]),
        (layers.RegisterTokens(4), [(2, 9, 48)]),
        (layers.ResNetStem((1, 1)), [(2, 32, 32, 3)]),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, keras.layers.Layer) else "",
)
def test_new_layers_config_is_the_constructor_arguments_and_round_trips(layer, inputs):
    import inspect

    args = set(inspect.signature(type(layer).__init__).parameters) - {"self", "kwargs", "args"}
    config = layer.get_config()
    if isinstance(layer, layers.Attention):  # MultiHeadAttention's own arguments come along; Keras
        # itself leaves flash_attention out of its config.
        args |= set(inspect.signature(keras.layers.MultiHeadAttention.__init__).parameters) - {
            "self", "kwargs", "use_bias", "flash_attention"}
    if "options" in args:  # a block: BlockConfig's fields
        args = args - {"options"} | {f.name for f in dataclasses.fields(layers.BlockConfig)}
    assert set(config) - {"name", "trainable", "dtype"} == args
    xs = [images(shape, seed=i) for i, shape in enumerate(inputs)]
    y = to_numpy(layer(*xs))
    clone = type(layer).from_config(config)
    clone(*xs)
    for a, b in zip(layer.weights, clone.weights):
        b.assign(a)
    np.testing.assert_allclose(to_numpy(clone(*xs)), y, atol=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(pooling="map"), dict(num_register_tokens=2), dict(qk_norm=True), dict(layer_scale_init=0.1),
     dict(parallel_block=True, layer_scale_init=0.1), dict(use_bias=False), ALL_OPTIONS,
     dict(ALL_OPTIONS, representation_size=8, position_embedding="sincos"),
     dict(stem="resnet50", stem_layers=(1, 2), patch_size=1, pooling="gap")],
    ids=lambda o: ",".join(o) or "plain",
)
def test_count_params_equals_a_built_model(overrides):
    config = {**TINY, **overrides}
    built = keras_vit.ViT(**config).count_params()
    assert keras_vit.count_params(config) == built
    assert param_count(config) == built  # the architecture's formula agrees with what Keras builds


@pytest.mark.parametrize("name", ["ViT-B/16", "ViT-H/14", "ViT-22B", "R50+ViT-B/16"])
def test_count_params_equals_the_formula_for_presets_too_big_to_build(name):
    config = keras_vit.preset_config(name)
    assert keras_vit.count_params(config) == param_count(config)


def test_vit22b_preset_has_21743m_parameters_without_building_it():
    config = keras_vit.preset_config("ViT-22B")
    assert (config["hidden_dim"], config["num_layers"], config["mlp_dim"], config["num_heads"],
            config["patch_size"]) == (6144, 48, 24576, 48, 14)
    assert config["parallel_block"] and config["qk_norm"] and config["use_bias"] is False
    count = keras_vit.count_params(config)
    assert abs(count / 21_743e6 - 1) < 0.005, count


def test_vit_b16_count_matches_the_paper():
    assert keras_vit.count_params(keras_vit.preset_config("ViT-B/16")) == 86_567_656


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_register_tokens=2, class_token=False),
         r'pooling="token" reads the class token, but class_token=False'),
        (dict(num_register_tokens=-1), r"num_register_tokens=-1 is not allowed"),
        (dict(pooling="attention"),
         r"pooling='attention' is not allowed; use one of \('token', 'gap', 'map', 'none'\)"),
        (dict(stem="resnet18"), r"stem='resnet18' is not allowed; use one of \(None, 'resnet50'\)"),
        (dict(stem="resnet50", patch_size=1, image_size=36), r"image_size=\(36, 36\) is not a multiple of 16"),
        (dict(stem="resnet50", patch_size=1, stem_layers=(3, 4, 6, 3, 2)),
         r"layers=.* use 1 to 4 positive unit counts"),
    ],
)
def test_bad_option_values_name_the_value(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_vit(**overrides)


def test_timm_writer_refuses_options_it_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="timm writer does not support parallel_block=True"):
        keras_vit.save_checkpoint(tiny_vit(parallel_block=True), tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="representation_size=8"):  # QK-norm it holds (test_options_checkpoints.py)
        keras_vit.save_checkpoint(tiny_vit(representation_size=8), tmp_path / "x.safetensors")


def test_timm_reference_really_differs_per_option():
    """The timm configs above are not silently the plain model: each changes timm's output."""
    x = torch.from_numpy(images().transpose(0, 3, 1, 2).copy())
    with torch.no_grad():
        plain = timm_model()(x)
        for case in ("qk_norm", "parallel_block", "use_bias_false", "registers_token"):
            assert (timm_model(**TIMM_OPTIONS[case][1])(x) - plain).abs().max() > 1e-3, case


def test_model_macs_counts_registers_and_the_map_head_and_refuses_hybrids():
    base, reg = keras_vit.model_macs(TINY), keras_vit.model_macs(dict(TINY, num_register_tokens=2))
    assert reg["tokens"] == base["tokens"] + 2 and reg["blocks"] > base["blocks"]
    gap, pooled = keras_vit.model_macs(dict(TINY, pooling="gap")), keras_vit.model_macs(dict(TINY, pooling="map"))
    assert pooled["head"] > gap["head"] + 2 * 64 * 48 * 48  # at least the K and V projections of 64 tokens
    with pytest.raises(ValueError, match="stem='resnet50'"):
        keras_vit.model_macs(dict(TINY, stem="resnet50", patch_size=1))

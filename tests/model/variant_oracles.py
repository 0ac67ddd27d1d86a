"""timm references for the ViT options and the hybrid, and a weight copy from timm to keras_vit.

The copy is written here, from timm's module names, independently of keras_vit.checkpoints, so a
mapping error in one cannot hide in the other. Shapes: D width, K heads, Dh head width, M MLP
width; PyTorch Linear weights are (out, in), Conv2d weights (out, in, kh, kw).
"""

from functools import partial

import numpy as np
import torch
from tests.checkpoints.checkpoint_oracles import TINY_TIMM, randomize_torch
from timm.layers import HybridEmbed, LayerNorm
from timm.models.vision_transformer import ParallelScalingBlock, VisionTransformer
from timm.models.vision_transformer_hybrid import _resnetv2

# timm keyword arguments of each option, as keras_vit spells it.
TIMM_OPTIONS = {
    "map": (dict(pooling="map"), dict(global_pool="map", class_token=False)),
    "registers_token": (dict(num_register_tokens=2), dict(reg_tokens=2)),
    "registers_gap": (dict(num_register_tokens=3, pooling="gap"),
                      dict(reg_tokens=3, class_token=False, global_pool="avg", fc_norm=False)),
    "registers_map": (dict(num_register_tokens=2, pooling="map"),
                      dict(reg_tokens=2, class_token=False, global_pool="map")),
    "layer_scale": (dict(layer_scale_init=0.1), dict(init_values=0.1)),
    "qk_norm": (dict(qk_norm=True), dict(qk_norm=True)),
    "parallel_block": (dict(parallel_block=True), dict(block_fn=ParallelScalingBlock, qkv_bias=True)),
    "parallel_layer_scale": (dict(parallel_block=True, layer_scale_init=0.1),
                             dict(block_fn=ParallelScalingBlock, qkv_bias=True, init_values=0.1)),
    "use_bias_false": (dict(use_bias=False), dict(qkv_bias=False, norm_layer=partial(LayerNorm, eps=1e-6, bias=False))),
    "vit22b_style": (dict(parallel_block=True, qk_norm=True, use_bias=False, pooling="map"),
                     dict(block_fn=ParallelScalingBlock, qk_norm=True, qkv_bias=False, global_pool="map",
                          class_token=False, norm_layer=partial(LayerNorm, eps=1e-6, bias=False))),
}


def timm_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return randomize_torch(VisionTransformer(**{**TINY_TIMM, **overrides}), seed)


def timm_hybrid(layers=(1, 1), seed=0, **overrides):
    """A timm hybrid ViT on a BiT ResNet with `layers` units per stage ('same' stem, StdConv eps 1e-8)."""
    torch.manual_seed(seed)
    embed = partial(HybridEmbed, backbone=_resnetv2(layers))
    return randomize_torch(VisionTransformer(**{**TINY_TIMM, "patch_size": 1, "embed_layer": embed, **overrides}), seed)


def _a(variable, value):
    variable.assign(np.asarray(value, "float32").reshape(variable.shape))


def _linear(dense, sd, key):
    """A Linear (out, in) into a Dense / EinsumDense kernel (in, ...) and bias."""
    _a(dense.kernel, sd[key + ".weight"].T)
    if key + ".bias" in sd:
        _a(dense.bias, sd[key + ".bias"])


def _norm(layer, sd, key):
    _a(layer.gamma, sd[key + ".weight"])
    if key + ".bias" in sd:
        _a(layer.beta, sd[key + ".bias"])


def _qkv(attn, w, b):
    """Fused (3D, D) rows [q; k; v] into Keras' (D, K, Dh) kernels and (K, Dh) biases."""
    for i, dense in enumerate((attn.query_dense, attn.key_dense, attn.value_dense)):
        d = w.shape[1]
        _a(dense.kernel, w[i * d:(i + 1) * d].T)
        if b is not None:
            _a(dense.bias, b[i * d:(i + 1) * d])


def copy_block(block, sd, a, parallel):
    if parallel:  # in_proj rows: [fc1 (M); q; k; v]
        m = block.config.mlp_dim
        w, b = sd[a + "in_proj.weight"], sd.get(a + "in_proj.bias")
        _a(block.fc1.kernel, w[:m].T)
        _a(block.fc1.bias, b[:m] if b is not None else sd[a + "mlp_bias"])
        _qkv(block.attn, w[m:], None if b is None else b[m:])
        _norm(block.norm1, sd, a + "in_norm")
        _linear(block.attn.output_dense, sd, a + "attn_out_proj")
        _linear(block.fc2, sd, a + "mlp_out_proj")
        pairs = (("q_norm", "q_norm"), ("k_norm", "k_norm"))
        if hasattr(block.ls1, "gamma"):  # an Identity without LayerScale
            _a(block.ls1.gamma, sd[a + "ls.gamma"])
    else:
        _qkv(block.attn, sd[a + "attn.qkv.weight"], sd.get(a + "attn.qkv.bias"))
        _linear(block.attn.output_dense, sd, a + "attn.proj")
        _norm(block.norm1, sd, a + "norm1")
        _norm(block.norm2, sd, a + "norm2")
        _linear(block.fc1, sd, a + "mlp.fc1")
        _linear(block.fc2, sd, a + "mlp.fc2")
        pairs = (("q_norm", "attn.q_norm"), ("k_norm", "attn.k_norm"))
        for ls in ("ls1", "ls2"):
            if hasattr(getattr(block, ls), "gamma"):
                _a(getattr(block, ls).gamma, sd[a + ls + ".gamma"])
    for name, key in pairs:
        if getattr(block.attn, name, None) is not None:
            _norm(getattr(block.attn, name), sd, a + key)


def copy_map_head(head, sd):
    p = "attn_pool."
    _a(head.probe, sd[p + "latent"])
    _linear(head.attn.query_dense, sd, p + "q")
    w, b = sd[p + "kv.weight"], sd[p + "kv.bias"]  # rows [k; v]
    d = w.shape[1]
    for i, dense in enumerate((head.attn.key_dense, head.attn.value_dense)):
        _a(dense.kernel, w[i * d:(i + 1) * d].T)
        _a(dense.bias, b[i * d:(i + 1) * d])
    _linear(head.attn.output_dense, sd, p + "proj")
    _norm(head.norm, sd, p + "norm")
    _linear(head.fc1, sd, p + "mlp.fc1")
    _linear(head.fc2, sd, p + "mlp.fc2")


def copy_stem(stem, sd, prefix="patch_embed.backbone."):
    def conv(layer, key):
        return _a(layer.kernel, sd[key].transpose(2, 3, 1, 0))  # (out, in, kh, kw) -> (kh, kw, in, out)

    conv(stem.conv_root, prefix + "stem.conv.weight")
    _norm(stem.gn_root, sd, prefix + "stem.norm")
    for i, stage in enumerate(stem.stages):
        for j, unit in enumerate(stage):
            u = f"{prefix}stages.{i}.blocks.{j}."
            for r in (1, 2, 3):
                conv(getattr(unit, f"conv{r}"), f"{u}conv{r}.weight")
                _norm(getattr(unit, f"gn{r}"), sd, f"{u}norm{r}")
            if unit.conv_proj is not None:
                conv(unit.conv_proj, u + "downsample.conv.weight")
                _norm(unit.gn_proj, sd, u + "downsample.norm")


def copy_timm(model, ref):
    """Copies every weight of the timm `ref` into the keras_vit `model`; returns `model`."""
    sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    # (D, C, P, P) -> (P, P, C, D)
    _a(model.patch_embedding.conv.kernel, sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0))
    _a(model.patch_embedding.conv.bias, sd["patch_embed.proj.bias"])
    if model.stem is not None:
        copy_stem(model.stem, sd)
    if model.cls_token is not None:
        _a(model.cls_token.token, sd["cls_token"])
    if model.registers is not None:
        _a(model.registers.tokens, sd["reg_token"])
    pos = sd["pos_embed"]
    if ref.no_embed_class and model.num_prefix_tokens:  # prefix tokens without a position: zero rows
        pos = np.concatenate([np.zeros((1, model.num_prefix_tokens, pos.shape[-1]), pos.dtype), pos], axis=1)
    _a(model.position_embedding.embedding, pos)
    for i, block in enumerate(model.encoder.blocks):
        copy_block(block, sd, f"blocks.{i}.", block.config.parallel_block)
    _norm(model.encoder.norm, sd, "norm")
    if model.head.map_head is not None:
        copy_map_head(model.head.map_head, sd)
    if model.head.classifier is not None:
        _linear(model.head.classifier, sd, "head")
    return model

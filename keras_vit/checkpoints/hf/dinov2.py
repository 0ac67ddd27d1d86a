"""Hugging Face DINOv2 folders: `Dinov2Model` and `Dinov2WithRegistersModel` (Oquab et al., 2024;
Darcet et al., 2024).

A pre-norm ViT with a class token, LayerScale on both branches ("layer_scale1.lambda1",
"layer_scale2.lambda1"), exact GELU and, with registers, R "register_tokens" inserted after the
class token *after* the position table is added (1 + N rows; the registers get no position, which
is a zero row in keras_vit's table). "mask_token" serves masked pre-training only and is not
loaded. The pooled output is the normalized class token (`num_classes=0`, pooling "token").
transformers resizes the table with torch bicubic interpolation: plain for `Dinov2Model`,
antialiased for `Dinov2WithRegistersModel`; the loaded model's `resample_method` follows.
Shapes: P patch, C channels, D width, R registers, N patches.
"""

import numpy as np

from keras_vit.checkpoints import safetensors_io
from keras_vit.checkpoints.canonical import BLOCK, LAYER_SCALE, LN1, LN2, MLP, POS, REG
from keras_vit.checkpoints.common import build_model, grid_from_rows
from keras_vit.checkpoints.hf import common as hf

MODEL_TYPES = ("dinov2", "dinov2_with_registers")
_UNUSED = ("embeddings.mask_token",)
# DINOv2's ImageNet statistics, which its BitImageProcessor configs state.
_IMAGENET = dict(image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))


def _names(spec):
    """[(HF name, canonical name, layout kind)], all but the position table."""
    e = "embeddings."
    names = [(e + "patch_embeddings.projection.weight", "embedding/kernel", "conv"),
             (e + "patch_embeddings.projection.bias", "embedding/bias", "copy"), (e + "cls_token", "cls", "copy")]
    if spec["num_register_tokens"]:
        names.append((e + "register_tokens", REG, "copy"))
    for i in range(spec["num_layers"]):
        h, b = f"encoder.layer.{i}.", BLOCK.format(i)
        names += hf.attention_names(h, b)
        names += hf.norm_names(h + "norm1", b + LN1) + hf.norm_names(h + "norm2", b + LN2) + hf.mlp_names(h + "mlp.", b + MLP)
        names += [(f"{h}layer_scale{j + 1}.lambda1", LAYER_SCALE.format(i, j), "copy") for j in range(2)]
    return names + hf.norm_names("layernorm", "Transformer/encoder_norm/")


def load(folder, overrides):
    """Builds a `ViT` (features, `num_classes=0`) from a DINOv2 folder."""
    config = hf.read_config(folder)
    sd, _ = safetensors_io.read(folder / "model.safetensors")
    if any(k.startswith("dinov2") for k in sd) or config.get("use_swiglu_ffn"):
        raise ValueError(f"{folder} is a DINOv2 classifier or uses a SwiGLU MLP (DINOv2-g); keras_vit reads the "
                         "Dinov2Model / Dinov2WithRegistersModel backbones with a GELU MLP (sizes S, B, L)")
    sd = {k: v for k, v in sd.items() if k not in _UNUSED}
    spec = _spec(config, sd, folder)
    pos = sd["embeddings.position_embeddings"]
    tensors = hf.convert(sd, _names(spec), spec, folder, overrides,
                         extra={"embeddings.position_embeddings": (1, 1 + spec["grid"][0] * spec["grid"][1], spec["hidden_dim"])})
    registers = np.zeros((1, spec["num_register_tokens"], pos.shape[-1]), pos.dtype)
    tensors[POS] = np.concatenate([pos[:, :1], registers, pos[:, 1:]], axis=1)  # (1, 1 + N, D) -> (1, 1 + R + N, D)
    return build_model(spec, tensors, hf.DEFAULTS, overrides)


def _spec(config, sd, folder):
    """The architecture from config.json and the tensors."""
    d, c, p, _ = sd["embeddings.patch_embeddings.projection.weight"].shape
    size = config.get("image_size", 518)
    size = (size, size) if isinstance(size, int) else tuple(size)
    registers = int(sd["embeddings.register_tokens"].shape[1]) if "embeddings.register_tokens" in sd else 0
    return dict(
        patch_size=int(p), num_channels=int(c), hidden_dim=int(d), num_heads=int(config.get("num_attention_heads", 12)),
        num_layers=len({k.split(".")[2] for k in sd if k.startswith("encoder.layer.")}),
        mlp_dim=int(sd["encoder.layer.0.mlp.fc1.weight"].shape[0]), num_classes=0, representation_size=None,
        class_token=True, pooling="token", num_register_tokens=registers, layer_scale=True,
        grid=grid_from_rows(sd["embeddings.position_embeddings"].shape[1] - 1, (size[0] // p, size[1] // p)),
        config=dict(layer_norm_epsilon=float(config.get("layer_norm_eps", 1e-6)),
                    gelu_approximate=hf.gelu_approximate(config, folder),
                    resample_method="bicubic" if config.get("model_type") == "dinov2_with_registers" else "bicubic_no_antialias",
                    **{**_IMAGENET, **hf.normalization(folder)}),
    )

"""Hugging Face SigLIP folders: `SiglipVisionModel`, the vision tower of a `SiglipModel` (its text
tower, `logit_scale` and `logit_bias` are ignored) and `SiglipForImageClassification`.

The image tower is a ViT without a class token: a position table of N rows, a final
"post_layernorm" and, with `vision_use_head` (the default), a MAP head ("head.probe",
`nn.MultiheadAttention` with a fused "in_proj_weight" (3D, D) whose rows are [q; k; v], "layernorm",
"mlp.fc1/fc2"). Its pooled output is the MAP head's; `SiglipForImageClassification` instead
classifies the mean of the patch tokens. transformers resizes the position table with plain torch
bicubic interpolation, so that is the model's `resample_method`.
Shapes: P patch, C channels, D width, K heads, Dh = D / K, N patches.
"""

import numpy as np

from keras_vit.checkpoints import safetensors_io
from keras_vit.checkpoints.canonical import BLOCK, LN1, LN2, MAP, MAP_MHA, MHA, MLP, POS
from keras_vit.checkpoints.common import build_model, grid_from_rows
from keras_vit.checkpoints.hf import common as hf

MODEL_TYPES = ("siglip", "siglip_vision_model")


def _names(spec, p):
    """[(HF name, canonical name, layout kind)], all but the MAP head's fused projection."""
    e = p + "embeddings."
    names = [(e + "patch_embedding.weight", "embedding/kernel", "conv"), (e + "patch_embedding.bias", "embedding/bias", "copy"),
             (e + "position_embedding.weight", POS, "embedding_table")]
    for i in range(spec["num_layers"]):
        h, b = f"{p}encoder.layers.{i}.", BLOCK.format(i)
        for n in ("q", "k", "v"):
            c = {"q": "query", "k": "key", "v": "value"}[n]
            names += [(f"{h}self_attn.{n}_proj.weight", f"{b}{MHA}{c}/kernel", "qkv"),
                      (f"{h}self_attn.{n}_proj.bias", f"{b}{MHA}{c}/bias", "bias")]
        names += [(h + "self_attn.out_proj.weight", f"{b}{MHA}out/kernel", "out"),
                  (h + "self_attn.out_proj.bias", f"{b}{MHA}out/bias", "copy")]
        names += hf.norm_names(h + "layer_norm1", b + LN1) + hf.norm_names(h + "layer_norm2", b + LN2)
        names += hf.mlp_names(h + "mlp.", b + MLP)
    names += hf.norm_names(p + "post_layernorm", "Transformer/encoder_norm/")
    if spec["pooling"] == "map":
        names += [(p + "head.probe", MAP + "probe", "copy"), (p + "head.attention.out_proj.weight", MAP_MHA + "out/kernel", "out"),
                  (p + "head.attention.out_proj.bias", MAP_MHA + "out/bias", "copy")]
        names += hf.norm_names(p + "head.layernorm", MAP + "LayerNorm_0/") + hf.mlp_names(p + "head.mlp.", MAP + "MlpBlock_0/")
    if spec["num_classes"]:
        names += [("classifier.weight", "head/kernel", "linear"), ("classifier.bias", "head/bias", "copy")]
    return names


def load(folder, overrides):
    """Builds a `ViT` from a SigLIP folder: the MAP-pooled image tower, or the classifier."""
    config = hf.read_config(folder)
    vision = config.get("vision_config", {}) if config.get("model_type") == "siglip" else config
    sd, _ = safetensors_io.read(folder / "model.safetensors")
    p = "vision_model." if any(k.startswith("vision_model.") for k in sd) else ""
    sd = {k: v for k, v in sd.items() if k.startswith(p) or k.startswith("classifier.")}  # drop the text tower
    spec = _spec(config, vision, sd, p, folder)
    if spec["pooling"] != "map":  # the classifier reads the mean of the tokens; its vision head is unused
        sd = {k: v for k, v in sd.items() if not k.startswith(p + "head.")}
    fused = {}
    if spec["pooling"] == "map":
        d = spec["hidden_dim"]
        fused = {p + "head.attention.in_proj_weight": (3 * d, d), p + "head.attention.in_proj_bias": (3 * d,)}
    tensors = hf.convert(sd, _names(spec, p), spec, folder, overrides, extra=fused)
    if fused:
        weights = np.split(sd[p + "head.attention.in_proj_weight"], 3)  # (3D, D) -> 3 x (D, D), rows [q; k; v]
        biases = np.split(sd[p + "head.attention.in_proj_bias"], 3)
        for n, w, b in zip(("query", "key", "value"), weights, biases):
            tensors[f"{MAP_MHA}{n}/kernel"] = hf.LAYOUTS["qkv"][1](w, spec)  # (D, D) -> (D, K, Dh)
            tensors[f"{MAP_MHA}{n}/bias"] = hf.LAYOUTS["bias"][1](b, spec)  # (D,) -> (K, Dh)
    return build_model(spec, tensors, hf.DEFAULTS, overrides)


def _spec(config, vision, sd, p, folder):
    """The architecture from the vision config and the tensors."""
    d, c, patch, _ = sd[p + "embeddings.patch_embedding.weight"].shape
    size = vision.get("image_size", 224)
    size = (size, size) if isinstance(size, int) else tuple(size)
    num_classes = int(sd["classifier.weight"].shape[0]) if "classifier.weight" in sd else 0
    pooling = "gap" if num_classes else "map" if vision.get("vision_use_head", True) else "gap"
    return dict(
        patch_size=int(patch), num_channels=int(c), hidden_dim=int(d), num_heads=int(vision.get("num_attention_heads", 12)),
        num_layers=len({k.split(".")[len(p.split(".")) + 1] for k in sd if k.startswith(p + "encoder.layers.")}),
        mlp_dim=int(vision.get("intermediate_size", 3072)), num_classes=num_classes, representation_size=None,
        class_token=False, pooling=pooling, class_names=hf.class_names(config, num_classes),
        grid=grid_from_rows(sd[p + "embeddings.position_embedding.weight"].shape[0], (size[0] // patch, size[1] // patch)),
        config=dict(layer_norm_epsilon=float(vision.get("layer_norm_eps", 1e-6)), resample_method="bicubic_no_antialias",
                    gelu_approximate=hf.gelu_approximate({"hidden_act": "gelu_pytorch_tanh", **vision}, folder),
                    **hf.normalization(folder)),
    )

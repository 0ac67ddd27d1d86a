"""Hugging Face `transformers` ViT folders: `config.json` + `model.safetensors`.

`ViTForImageClassification` prefixes the backbone with "vit." and adds "classifier"; a bare
`ViTModel` has no prefix and may carry a tanh "pooler", which is the paper's pre-logits layer.
Shapes: P patch, C channels, D width, K heads, M MLP width, R pooler width, N classes.
"""

import pathlib

from keras_vit.checkpoints import safetensors_io
from keras_vit.checkpoints.canonical import BLOCK, LN1, LN2, MLP, POS
from keras_vit.checkpoints.common import build_model, grid_from_rows
from keras_vit.checkpoints.hf import common as hf

MODEL_TYPES = ("vit",)


def load(path, overrides):
    """Builds a `ViT` from a Hugging Face ViT folder."""
    folder = pathlib.Path(path)
    config = hf.read_config(folder)
    sd, _ = safetensors_io.read(folder / "model.safetensors")
    prefix = "vit." if "vit.embeddings.cls_token" in sd else ""
    spec = _spec(config, sd, prefix, folder)
    tensors = hf.convert(sd, _names(spec, prefix), spec, folder, overrides)
    return build_model(spec, tensors, hf.DEFAULTS, overrides)


def _names(spec, prefix):
    """[(HF name, canonical name, layout kind)] for the model that `spec` describes."""
    e = prefix + "embeddings."
    names = [(e + "patch_embeddings.projection.weight", "embedding/kernel", "conv"),
             (e + "patch_embeddings.projection.bias", "embedding/bias", "copy"),
             (e + "cls_token", "cls", "copy"), (e + "position_embeddings", POS, "copy")]
    for i in range(spec["num_layers"]):
        h, b = f"{prefix}encoder.layer.{i}.", BLOCK.format(i)
        names += hf.attention_names(h, b)
        for norm, ln in (("layernorm_before", LN1), ("layernorm_after", LN2)):
            names += [(f"{h}{norm}.weight", b + ln + "scale", "copy"), (f"{h}{norm}.bias", b + ln + "bias", "copy")]
        for dense, j in (("intermediate.dense", 0), ("output.dense", 1)):
            names += [(f"{h}{dense}.weight", f"{b}{MLP}Dense_{j}/kernel", "linear"),
                      (f"{h}{dense}.bias", f"{b}{MLP}Dense_{j}/bias", "copy")]
    names += [(prefix + "layernorm.weight", "Transformer/encoder_norm/scale", "copy"),
              (prefix + "layernorm.bias", "Transformer/encoder_norm/bias", "copy")]
    if spec["representation_size"]:
        names += [("pooler.dense.weight", "pre_logits/kernel", "linear"), ("pooler.dense.bias", "pre_logits/bias", "copy")]
    if spec["num_classes"]:
        names += [("classifier.weight", "head/kernel", "linear"), ("classifier.bias", "head/bias", "copy")]
    return names


def _spec(config, sd, prefix, folder):
    """The architecture from config.json (heads, grid, activation) and the tensors."""
    if not config.get("qkv_bias", True):
        raise ValueError(f"{folder}/config.json has qkv_bias=false; keras_vit's attention always has biases")
    d, c, p, _ = sd[prefix + "embeddings.patch_embeddings.projection.weight"].shape
    size = config.get("image_size", 224)
    size = (size, size) if isinstance(size, int) else tuple(size)
    rows = sd[prefix + "embeddings.position_embeddings"].shape[1] - 1
    head = "classifier.weight" in sd
    num_classes = int(sd["classifier.weight"].shape[0]) if head else 0
    return dict(
        patch_size=int(p), num_channels=int(c), hidden_dim=int(d), num_heads=int(config["num_attention_heads"]),
        num_layers=len({k.split(".")[len(prefix.split(".")) + 1] for k in sd if k.startswith(prefix + "encoder.layer.")}),
        mlp_dim=int(config.get("intermediate_size", 4 * d)), num_classes=num_classes,
        representation_size=int(sd["pooler.dense.weight"].shape[0]) if "pooler.dense.weight" in sd else None,
        class_token=True, grid=grid_from_rows(rows, (size[0] // p, size[1] // p)),
        class_names=hf.class_names(config, num_classes),
        config=dict(layer_norm_epsilon=float(config.get("layer_norm_eps", 1e-12)), gelu_approximate=hf.gelu_approximate(config, folder),
                    **hf.normalization(folder)),
    )

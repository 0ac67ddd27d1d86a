"""Hugging Face `transformers` ViT folders: `config.json` + `model.safetensors`; and what the other
Hugging Face readers (`hf_siglip`, `hf_dinov2`) share: PyTorch-to-Keras layouts, `config.json`,
normalization and label names.

`ViTForImageClassification` prefixes the backbone with "vit." and adds "classifier"; a bare
`ViTModel` has no prefix and may carry a tanh "pooler", which is the paper's pre-logits layer.
Layouts are PyTorch's: Conv2d (D, C, P, P) and Linear (out, in). Shapes: P patch, C channels,
D width, K heads, Dh = D / K, M MLP width, R pooler width, N classes.
"""

import json
import pathlib

import numpy as np

from keras_vit.checkpoints import safetensors_io
from keras_vit.checkpoints.canonical import BLOCK, LN1, LN2, MHA, MLP, POS, canonical_shapes
from keras_vit.checkpoints.common import build_model, check_tensors, grid_from_rows

# ViTImageProcessor's defaults, used when the folder has no preprocessor_config.json.
DEFAULTS = dict(gelu_approximate=False, resample_method="bicubic", image_mean=(0.5,) * 3, image_std=(0.5,) * 3)
# hidden_act -> gelu_approximate. gelu_new, gelu_fast and gelu_pytorch_tanh are all the tanh form.
GELU = {"gelu": False, "gelu_new": True, "gelu_fast": True, "gelu_pytorch_tanh": True}

# (layout kind, canonical -> HF, HF -> canonical); `spec` gives the head count.
LAYOUTS = {
    "copy": (lambda x, s: x, lambda x, s: x),
    "conv": (lambda x, s: x.transpose(3, 2, 0, 1), lambda x, s: x.transpose(2, 3, 1, 0)),  # (P,P,C,D) <-> (D,C,P,P)
    "linear": (lambda x, s: x.T, lambda x, s: x.T),  # (in, out) <-> (out, in)
    # (D, K, Dh) <-> (K*Dh, D) and (K, Dh) <-> (K*Dh,)
    "qkv": (lambda x, s: x.reshape(x.shape[0], -1).T, lambda x, s: x.T.reshape(x.shape[1], s["num_heads"], -1)),
    "bias": (lambda x, s: x.reshape(-1), lambda x, s: x.reshape(s["num_heads"], -1)),
    # (K, Dh, D) <-> (D, K*Dh)
    "out": (lambda x, s: x.reshape(-1, x.shape[-1]).T, lambda x, s: x.T.reshape(s["num_heads"], -1, x.shape[0])),
    "embedding_table": (lambda x, s: x[0], lambda x, s: x[None]),  # (1, N, D) <-> (N, D), an nn.Embedding
}


def _names(spec, prefix):
    """[(HF name, canonical name, layout kind)] for the model that `spec` describes."""
    e = prefix + "embeddings."
    names = [(e + "patch_embeddings.projection.weight", "embedding/kernel", "conv"),
             (e + "patch_embeddings.projection.bias", "embedding/bias", "copy"),
             (e + "cls_token", "cls", "copy"), (e + "position_embeddings", POS, "copy")]
    for i in range(spec["num_layers"]):
        h, b = f"{prefix}encoder.layer.{i}.", BLOCK.format(i)
        names += attention_names(h, b)
        for hf, ln in (("layernorm_before", LN1), ("layernorm_after", LN2)):
            names += [(f"{h}{hf}.weight", b + ln + "scale", "copy"), (f"{h}{hf}.bias", b + ln + "bias", "copy")]
        for hf, j in (("intermediate.dense", 0), ("output.dense", 1)):
            names += [(f"{h}{hf}.weight", f"{b}{MLP}Dense_{j}/kernel", "linear"),
                      (f"{h}{hf}.bias", f"{b}{MLP}Dense_{j}/bias", "copy")]
    names += [(prefix + "layernorm.weight", "Transformer/encoder_norm/scale", "copy"),
              (prefix + "layernorm.bias", "Transformer/encoder_norm/bias", "copy")]
    if spec["representation_size"]:
        names += [("pooler.dense.weight", "pre_logits/kernel", "linear"), ("pooler.dense.bias", "pre_logits/bias", "copy")]
    if spec["num_classes"]:
        names += [("classifier.weight", "head/kernel", "linear"), ("classifier.bias", "head/bias", "copy")]
    return names


def read_config(folder):
    """config.json of a Hugging Face folder, as a dict."""
    return json.loads((pathlib.Path(folder) / "config.json").read_text())


def load(path, overrides):
    """Builds a `ViT` from a Hugging Face ViT folder."""
    folder = pathlib.Path(path)
    config = read_config(folder)
    sd, _ = safetensors_io.read(folder / "model.safetensors")
    prefix = "vit." if "vit.embeddings.cls_token" in sd else ""
    spec = _spec(config, sd, prefix, folder)
    tensors = convert(sd, _names(spec, prefix), spec, folder, overrides)
    return build_model(spec, tensors, DEFAULTS, overrides)


def convert(sd, names, spec, folder, overrides, extra=None):
    """Checks `sd` strictly against `names` and returns the canonical tensors.

    Args:
        sd: HF name -> array, as read from the folder.
        names: [(HF name, canonical name, layout kind of `LAYOUTS`)], one per tensor.
        spec: as in `canonical.canonical_shapes`.
        extra: HF name -> expected shape, for tensors the caller converts itself.
    """
    if "source_image_size" in overrides:
        raise ValueError("source_image_size is read from config.json for Hugging Face folders")
    zeros = {k: np.broadcast_to(np.float32(0), s) for k, s in canonical_shapes(spec).items()}
    expected = {hf: LAYOUTS[kind][0](zeros[c], spec).shape for hf, c, kind in names}
    expected.update(extra or {})
    check_tensors({k: v.shape for k, v in sd.items()}, expected, str(pathlib.Path(folder) / "model.safetensors"))
    return {c: LAYOUTS[kind][1](sd[hf], spec) for hf, c, kind in names}


def attention_names(hf_block, block):
    """The names table of a ViT / DINOv2 self-attention: "attention.attention.{query,key,value}"
    and "attention.output.dense" -> the canonical block's MultiHeadDotProductAttention_1."""
    names = []
    for n in ("query", "key", "value"):
        names += [(f"{hf_block}attention.attention.{n}.weight", f"{block}{MHA}{n}/kernel", "qkv"),
                  (f"{hf_block}attention.attention.{n}.bias", f"{block}{MHA}{n}/bias", "bias")]
    return names + [(hf_block + "attention.output.dense.weight", f"{block}{MHA}out/kernel", "out"),
                    (hf_block + "attention.output.dense.bias", f"{block}{MHA}out/bias", "copy")]


def norm_names(hf_name, canonical):
    """The names table of a LayerNorm: HF ".weight" / ".bias" -> canonical "scale" / "bias"."""
    return [(hf_name + ".weight", canonical + "scale", "copy"), (hf_name + ".bias", canonical + "bias", "copy")]


def mlp_names(hf_prefix, canonical):
    """The names table of an MLP: HF "fc1" / "fc2" Linears -> canonical "Dense_0" / "Dense_1"."""
    return [(f"{hf_prefix}fc{j + 1}.weight", f"{canonical}Dense_{j}/kernel", "linear") for j in range(2)] + [
        (f"{hf_prefix}fc{j + 1}.bias", f"{canonical}Dense_{j}/bias", "copy") for j in range(2)]


def class_names(config, num_classes):
    """The label names config.json states for a head of `num_classes`, or None for none or
    transformers' placeholders ("LABEL_0", ...)."""
    labels = config.get("id2label") or {}
    names = [labels.get(str(i), labels.get(i)) for i in range(len(labels))]
    if not names or all(n == f"LABEL_{i}" for i, n in enumerate(names)) or None in names:
        return None
    return names if len(names) == num_classes else None


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
        class_names=class_names(config, num_classes),
        config=dict(layer_norm_epsilon=float(config.get("layer_norm_eps", 1e-12)), gelu_approximate=gelu_approximate(config, folder),
                    **normalization(folder)),
    )


def gelu_approximate(config, folder):
    """Whether config.json's hidden_act is the tanh GELU; other activations are refused."""
    act = config.get("hidden_act", "gelu")
    if act not in GELU:
        raise ValueError(f"hidden_act={act!r} in {folder}/config.json is not supported; use one of {sorted(GELU)}")
    return GELU[act]


def normalization(folder):
    """image_mean / image_std from preprocessor_config.json when the folder has one."""
    path = pathlib.Path(folder) / "preprocessor_config.json"
    if not path.exists():
        return {}
    pre = json.loads(path.read_text())
    if pre.get("do_normalize", True) is False:
        return dict(image_mean=(0.0, 0.0, 0.0), image_std=(1.0, 1.0, 1.0))
    return {k: tuple(pre[k]) for k in ("image_mean", "image_std") if k in pre}

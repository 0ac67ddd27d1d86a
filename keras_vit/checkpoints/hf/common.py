"""What the Hugging Face readers share: PyTorch-to-Keras layouts, the strict conversion of a
names table, and what `config.json` and `preprocessor_config.json` say (activation, label names,
normalization).

Layouts are PyTorch's: Conv2d (D, C, P, P) and Linear (out, in). Shapes: P patch, C channels,
D width, K heads, Dh = D / K.
"""

import json
import pathlib

import numpy as np

from keras_vit.checkpoints.canonical import MHA, canonical_shapes
from keras_vit.checkpoints.common import check_tensors

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


def read_config(folder):
    """config.json of a Hugging Face folder, as a dict."""
    return json.loads((pathlib.Path(folder) / "config.json").read_text())


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

"""Hugging Face folders (config.json, model.safetensors, preprocessor_config.json), by model_type:
`vit` (`ViTModel`, whose tanh "pooler" is the pre-logits layer; `ViTForImageClassification`);
`siglip` (`SiglipVisionModel`, `SiglipModel`'s vision tower, its text tower never read, and
`SiglipForImageClassification`, which averages the tokens): no class token, an `nn.Embedding`
table (N, D), a MAP head whose attention fuses q, k, v into "in_proj_weight" (3D, D); `dinov2`
(Oquab et al., 2024; with registers, Darcet et al., 2024): LayerScale "lambda1", registers added
after the positions (no table rows), features of the class token, "mask_token" not read.
transformers resizes tables bicubically (antialiased only for DINOv2 with registers), and
`resample_method` follows. Shapes: P patch, C channels, D width, N patches.
"""

import json
import pathlib
import re

from keras_vit.checkpoints import rules as r
from keras_vit.checkpoints.rules import CONV, FLAT, LINEAR, TORCH_NORM, Rule, linear, positions, reshape
from keras_vit.io import safetensors
from keras_vit.models.resize import POSITIONS

READER = safetensors
# ViTImageProcessor's defaults (mean and std 0.5, the ViT default), when no preprocessor_config.json.
DEFAULTS = dict(gelu_approximate=False, resample_method="bicubic")
# hidden_act -> gelu_approximate. gelu_new, gelu_fast and gelu_pytorch_tanh are all the tanh form.
GELU = {"gelu": False, "gelu_new": True, "gelu_fast": True, "gelu_pytorch_tanh": True}
# DINOv2's ImageNet statistics, which its BitImageProcessor configs state.
_IMAGENET = dict(image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))
_B, _N = "encoder/block_{i}/", TORCH_NORM


def claims(path, config):
    """A folder with a config.json that is not timm's, or its model.safetensors."""
    if config is not None and "architecture" not in config and (path.is_dir() or path.name == "model.safetensors"):
        return path / "model.safetensors" if path.is_dir() else path


def source(path, shapes, metadata, side, options):
    """The model of a Hugging Face folder, by its model_type."""
    if "source_image_size" in options:
        raise ValueError("source_image_size is read from config.json for Hugging Face folders")
    config, model_type = side["config.json"], side["config.json"].get("model_type", "vit")
    if model_type not in _READERS:
        raise ValueError(f"{path.parent}/config.json has model_type={model_type!r}; supported: {sorted(_READERS)}")
    return _READERS[model_type](path.parent, shapes, config, side["preprocessor_config.json"] or {})


def _vit(folder, shapes, config, pre):
    if not config.get("qkv_bias", True):
        raise ValueError(f"{folder}/config.json has qkv_bias=false; keras_vit's attention always has biases")
    e = "vit." if "vit.embeddings.cls_token" in shapes else ""
    d, c, p, _ = shapes[e + "embeddings.patch_embeddings.projection.weight"]
    num_classes = shapes["classifier.weight"][0] if "classifier.weight" in shapes else 0
    model = dict(
        _common(folder, config, pre, p, shapes[e + "embeddings.position_embeddings"][1] - 1, 1e-12, 224), patch_size=p,
        num_channels=c, hidden_dim=d, num_heads=config["num_attention_heads"], class_token=True,
        num_layers=r.count(shapes, re.escape(e) + r"encoder\.layer\.(\d+)\."),
        mlp_dim=shapes[e + "encoder.layer.0.intermediate.dense.weight"][0], num_classes=num_classes,
        representation_size=shapes["pooler.dense.weight"][0] if "pooler.dense.weight" in shapes else None,
        class_names=_class_names(config, num_classes), dropout_rate=config.get("hidden_dropout_prob", 0.0),
        attention_dropout_rate=config.get("attention_probs_dropout_prob", 0.0),
    )
    return r.Source(r.with_saved(model, config.get(r.SAVED)), vit_rules(e))


def vit_rules(e):
    """The table of a `ViTModel` (`e` "") or `ViTForImageClassification` (`e` "vit.")."""
    h = e + "encoder.layer.{i}."
    return [
        *_embeddings(e + "embeddings.", "patch_embeddings.projection", "position_embeddings", r.COPY), *_attention(h),
        Rule(_B + "{m:norm1=layernorm_before|norm2=layernorm_after}/" + _N, h + "{m}.{w}"),
        *linear(_B + "{m:fc1=intermediate|fc2=output}", h + "{m}.dense"),
        Rule("encoder/norm/" + _N, e + "layernorm.{w}"),
        *linear("head/pre_logits", "pooler.dense"), *linear("head/classifier", "classifier"),
    ]


def _siglip(folder, shapes, config, pre):
    vision = config.get("vision_config", {}) if config.get("model_type") == "siglip" else config
    p = "vision_model." if any(k.startswith("vision_model.") for k in shapes) else ""
    h, a = p + "encoder.layers.{i}.", "head/map_head/attn/"
    d, c, patch, _ = shapes[p + "embeddings.patch_embedding.weight"]
    num_classes = shapes["classifier.weight"][0] if "classifier.weight" in shapes else 0
    pooling = "gap" if num_classes or not vision.get("vision_use_head", True) else "map"
    model = dict(
        _common(folder, {"hidden_act": "gelu_pytorch_tanh", **vision}, pre, patch,
                shapes[p + "embeddings.position_embedding.weight"][0], 1e-6, 224),
        resample_method="bicubic_no_antialias", patch_size=patch, num_channels=c, hidden_dim=d,
        num_heads=vision.get("num_attention_heads", 12),
        num_layers=r.count(shapes, re.escape(p) + r"encoder\.layers\.(\d+)\."),
        mlp_dim=shapes[p + "encoder.layers.0.mlp.fc1.weight"][0], num_classes=num_classes, class_token=False,
        pooling=pooling, class_names=_class_names(config, num_classes),
    )
    table = reshape(lambda s: s[1:])  # (1, N, D) <-> (N, D)
    return r.Source(model, [
        *_embeddings(p + "embeddings.", "patch_embedding", "position_embedding.weight", table),
        *linear(_B + "attn/{p:query=q|key=k|value=v}", h + "self_attn.{p}_proj"),
        *linear(_B + "attn/attention_output", h + "self_attn.out_proj", inputs=2),
        Rule(_B + "{m:norm1=layer_norm1|norm2=layer_norm2}/" + _N, h + "{m}.{w}"),
        *linear(_B + "{m:fc1|fc2}", h + "mlp.{m}"),
        Rule("encoder/norm/" + _N, p + "post_layernorm.{w}"), Rule("head/map_head/probe", p + "head.probe"),
        Rule(a + "{p:query|key|value}/kernel", p + "head.attention.in_proj_weight", LINEAR),  # rows [q; k; v]
        Rule(a + "{p:query|key|value}/bias", p + "head.attention.in_proj_bias", FLAT),
        *linear(a + "attention_output", p + "head.attention.out_proj", inputs=2),
        Rule("head/map_head/norm/" + _N, p + "head.layernorm.{w}"),
        *linear("head/map_head/{m:fc1|fc2}", p + "head.mlp.{m}"),
        *linear("head/classifier", "classifier"),
    ], lambda k: k.startswith("classifier.") or k.startswith(p) and (pooling == "map" or not k.startswith(p + "head.")))


def _dinov2(folder, shapes, config, pre):
    if any(k.startswith("dinov2") for k in shapes) or config.get("use_swiglu_ffn"):
        raise ValueError(f"{folder} is a DINOv2 classifier or uses a SwiGLU MLP (DINOv2-g); keras_vit reads the "
                         "Dinov2Model / Dinov2WithRegistersModel backbones with a GELU MLP (sizes S, B, L)")
    h = "encoder.layer.{i}."
    d, c, p, _ = shapes["embeddings.patch_embeddings.projection.weight"]
    registers = shapes["embeddings.register_tokens"][1] if "embeddings.register_tokens" in shapes else 0
    model = dict(
        {**_IMAGENET, **_common(folder, config, pre, p, shapes["embeddings.position_embeddings"][1] - 1, 1e-6, 518)},
        resample_method="bicubic" if config.get("model_type") == "dinov2_with_registers" else "bicubic_no_antialias",
        patch_size=p, num_channels=c, hidden_dim=d, num_heads=config.get("num_attention_heads", 12),
        num_layers=r.count(shapes, r"encoder\.layer\.(\d+)\."), mlp_dim=shapes["encoder.layer.0.mlp.fc1.weight"][0],
        num_classes=0, class_token=True, pooling="token", num_register_tokens=registers, layer_scale_init=1.0,
    )
    return r.Source(model, [
        *_embeddings("embeddings.", "patch_embeddings.projection", "position_embeddings", positions(1, 1 + registers)),
        Rule("registers/tokens", "embeddings.register_tokens"), *_attention(h),
        Rule(_B + "{m:norm1|norm2}/" + _N, h + "{m}.{w}"),
        Rule(_B + "{m:ls1=layer_scale1|ls2=layer_scale2}/gamma", h + "{m}.lambda1"),
        *linear(_B + "{m:fc1|fc2}", h + "mlp.{m}"), Rule("encoder/norm/" + _N, "layernorm.{w}"),
    ], lambda k: k != "embeddings.mask_token")


def _embeddings(e, patch, table, layout):
    """The patch embedding, class token and position table `table` (laid out as `layout`)."""
    return [Rule("patch_embedding/conv/kernel", e + patch + ".weight", CONV),
            Rule("patch_embedding/conv/bias", e + patch + ".bias"), Rule("class_token/token", e + "cls_token"),
            Rule(POSITIONS, e + table, layout)]


def _attention(h):
    """A ViT / DINOv2 self-attention: "attention.attention.{query,key,value}", "attention.output.dense"."""
    return [*linear(_B + "attn/{p:query|key|value}", h + "attention.attention.{p}"),
            *linear(_B + "attn/attention_output", h + "attention.output.dense", inputs=2)]


def _common(folder, config, pre, patch, rows, epsilon, size):
    """What config.json (epsilon, activation, input size) and `pre`, preprocessor_config.json
    (normalization), say; `epsilon` and `size` are the model type's defaults."""
    act = config.get("hidden_act", "gelu")
    if act not in GELU:
        raise ValueError(f"hidden_act={act!r} in {folder}/config.json is not supported; use one of {sorted(GELU)}")
    grid = r.table_grid(rows, r.size_grid(config.get("image_size", size), patch))
    return dict(DEFAULTS, image_size=(grid[0] * patch, grid[1] * patch), gelu_approximate=GELU[act],
                layer_norm_epsilon=float(config.get("layer_norm_eps", epsilon)), **_preprocessing(pre))


def _class_names(config, num_classes):
    """The label names config.json states for a head of `num_classes`, or None for none or
    transformers' placeholders ("LABEL_0", ...)."""
    labels = config.get("id2label") or {}
    names = [labels.get(str(i), labels.get(i)) for i in range(num_classes)]
    placeholders = all(n == f"LABEL_{i}" for i, n in enumerate(names))
    return None if len(labels) != num_classes or not names or placeholders or None in names else names


def _preprocessing(pre):
    """The `ViT` arguments of its preprocessing that preprocessor_config.json states: the mean and
    std, and how the image processor resizes (Pillow's filter, so antialiased; `do_center_crop`
    takes the crop, else the whole image is resized)."""
    found = {k: tuple(pre[k]) for k in ("image_mean", "image_std") if k in pre}
    if pre.get("do_normalize", True) is False:
        found = dict(image_mean=(0.0, 0.0, 0.0), image_std=(1.0, 1.0, 1.0))
    if pre.get("resample") in _RESIZE:
        found.update(image_resize=_RESIZE[pre["resample"]], image_antialias=True,
                     image_crop="center" if pre.get("do_center_crop") else "none")
    return found


# What transformers' ViT cannot hold, with the value it can.
_CANNOT_HOLD = {
    "class_token": (True, "ViT pools its class token"), "pooling": ("token", "ViT pools its class token"),
    "num_register_tokens": (0, "ViT has no registers"), "layer_scale_init": (None, "ViT has no LayerScale"),
    "qk_norm": (False, "ViT has no QK-norm"), "use_bias": (True, "ViT's layer norms have biases"),
    "fc_norm": (False, "ViT has no fc_norm"), "parallel_block": (False, "ViT's blocks are sequential"),
    "stem": (None, "ViT has no ResNet stem; transformers' ViTHybrid is another model"),
}
# Pillow's resampling filters, which the image processors' "resample" names by number.
_PIL = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4}
_RESIZE = {number: name for name, number in _PIL.items()}


def write(model, path):
    """Writes `model` as a transformers folder: config.json (and every `ViT` argument, which
    `keras_vit.load` restores), model.safetensors, preprocessor_config.json; see
    `keras_vit.save_checkpoint`."""
    config, head = model.get_config(), model.num_classes > 0
    pre_logits = (None, "ViTForImageClassification has no pre-logits layer; ViTModel's pooler is one, without a head")
    r.refuse(config, {**_CANNOT_HOLD, **({"representation_size": pre_logits} if head else {})}, "transformers")
    folder = pathlib.Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = r.tensors(vit_rules("vit." if head else ""), model, "the transformers format")
    safetensors.write(folder / "model.safetensors", tensors, {"format": "pt"})
    names = dict(enumerate(model.class_names)) if model.class_names else {}
    (folder / "config.json").write_text(json.dumps({
        "model_type": "vit", "architectures": ["ViTForImageClassification" if head else "ViTModel"],
        "image_size": list(model.image_size), "patch_size": model.patch_size, "num_channels": model.num_channels,
        "hidden_size": model.hidden_dim, "num_hidden_layers": model.num_layers, "num_attention_heads": model.num_heads,
        "intermediate_size": model.mlp_dim, "hidden_act": "gelu_pytorch_tanh" if model.gelu_approximate else "gelu",
        "layer_norm_eps": model.layer_norm_epsilon, "hidden_dropout_prob": model.dropout_rate,
        "attention_probs_dropout_prob": model.attention_dropout_rate, "qkv_bias": True,
        "pooler_output_size": model.representation_size or model.hidden_dim, "pooler_act": "tanh",
        # Without names, transformers would build its default of 2 labels: num_labels sets the count.
        **({"id2label": names, "label2id": {n: i for i, n in names.items()}} if names
           else {"num_labels": model.num_classes} if head else {}),
        r.SAVED: config,
    }, indent=2))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "do_resize": True,
        "size": {"height": model.image_size[0], "width": model.image_size[1]}, "resample": _PIL[model.image_resize],
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": list(model.image_mean), "image_std": list(model.image_std),
    }, indent=2))


_READERS = {"vit": _vit, "siglip": _siglip, "siglip_vision_model": _siglip, "dinov2": _dinov2,
            "dinov2_with_registers": _dinov2}

"""keras-hub ViT presets: a folder with config.json (a `ViTBackbone`), model.weights.h5 (its
weights), and for an image classifier task.json (a `ViTImageClassifier`: pooling, a tanh
pre-logits layer of `intermediate_dim`, the classes) with task.weights.h5 (the head), and
preprocessor.json or image_converter.json (a `ViTImageConverter`: pixels x `scale` + `offset`).

The `.weights.h5` files name each variable by the path of Keras' saving: the layer's attribute,
its class name in snake case ("vi_t_encoder_block", then "_1", "_2", ... for the next ones in a
list), and "vars/0", "vars/1" in the order the layer made them (kernel or gamma, then bias or
beta). keras-hub's layouts are keras_vit's: a (p, p, C, D) conv, (D, K, Dh) attention kernels;
its position table is an `Embedding` (R + N, D).

Two vision towers read as `ViT`s too. A `SigLIPBackbone`'s `SigLIPVisionEncoder` (or that encoder
saved alone): no class token, an `Embedding` table (N, D), blocks of a `MultiHeadAttention`, and
MAP pooling (`pooling="map"`); the text tower, the logit scale and bias are never read. A
`DINOV2Backbone` (Oquab et al., 2024; registers, Darcet et al., 2024): LayerScale, registers added
after the positions (no table rows), its features those of the class token (`num_classes=0`);
its table (1, 1 + N, D) is at `position_embedding_shape`, resampled to `image_shape` as keras-hub
does it on the torch backend (torch's bicubic, antialiased when `antialias_in_interpolation`;
keras-hub on TF and JAX uses their bicubic, a = -0.5), and neither its mask token nor the table it
saves at `image_shape` is read.

Shapes: D width, R prefix rows, N patches.
"""

import json
import pathlib
from types import SimpleNamespace

import h5py

from keras_vit.checkpoints import rules as r
from keras_vit.checkpoints.rules import Rule
from keras_vit.io import h5
from keras_vit.models.resize import POSITIONS

_TASK = "task/"  # names of task.weights.h5, beside the backbone's model.weights.h5
_E, _ENC = "layers/vi_t_patching_and_embedding/", "layers/vi_t_encoder/"
_VARS = "{w:gamma=0|beta=1|kernel=0|bias=1}"
_MHA = "{p:query=query_dense|key=key_dense|value=value_dense|attention_output=output_dense}/" + _VARS  # keras' MHA
_TABLE = r.reshape(lambda s: s[1:])  # an `Embedding` table: (1, R + N, D) <-> (R + N, D)


def _headers(path):
    """({name: shape}, {}) of model.weights.h5 and, under "task/", of task.weights.h5 beside it."""
    shapes, _ = h5.headers(path)
    task = path.parent / "task.weights.h5"
    return {**shapes, **({_TASK + k: s for k, s in h5.headers(task)[0].items()} if task.is_file() else {})}, {}


def _read(path, names):
    task = [n.removeprefix(_TASK) for n in names if n.startswith(_TASK)]
    out = h5.read(path, [n for n in names if not n.startswith(_TASK)])
    return {**out,
            **({_TASK + k: v for k, v in h5.read(path.parent / "task.weights.h5", task).items()} if task else {})}


READER = SimpleNamespace(headers=_headers, read=_read)


def rules(pre_logits):
    """The table of a `ViTBackbone`, and of a `ViTImageClassifier`'s head (with a pre-logits layer
    or not: Keras names the head's Dense layers "dense", "dense_1" in the order they were made)."""
    head = {"pre_logits": "dense", "classifier": "dense_1"} if pre_logits else {"classifier": "dense"}
    return [
        Rule("patch_embedding/conv/" + _VARS, _E + "patch_embedding/vars/{w}"),
        Rule("class_token/token", _E + "vars/0"),
        Rule(POSITIONS, _E + "position_embedding/vars/0", _TABLE),
        *_blocks(_ENC + "encoder_layers/vi_t_encoder_block", ("layer_norm_1", "layer_norm_2"), "mha",
                 ("dense_1", "dense_2")),
        Rule("encoder/norm/" + _VARS, _ENC + "layer_norm/vars/{w}"),
        *[Rule(f"head/{k}/" + _VARS, f"{_TASK}layers/{v}/vars/{{w}}") for k, v in head.items()],
    ]


def siglip_rules(p):
    """The table of a `SigLIPVisionEncoder` whose names begin with `p`."""
    e, m = p + "layers/sig_lip_vision_embedding/", p + "layers/sig_lip_multi_head_attention_pooling/"
    return [
        Rule("patch_embedding/conv/" + _VARS, e + "patch_embedding/vars/{w}"),
        Rule(POSITIONS, e + "position_embedding/vars/0", _TABLE),
        *_blocks(p + "layers/sig_lip_encoder_layer", ("layer_norm1", "layer_norm2"), "self_attn", ("fc1", "fc2")),
        Rule("encoder/norm/" + _VARS, p + "layers/layer_normalization/vars/{w}"),
        Rule("head/map_head/probe", m + "vars/0"), Rule("head/map_head/attn/" + _MHA, m + "attention/{p}/vars/{w}"),
        Rule("head/map_head/norm/" + _VARS, m + "layer_norm/vars/{w}"),
        Rule("head/map_head/{m:fc1|fc2}/" + _VARS, m + "mlp/{m}/vars/{w}"),
    ]


def dinov2_rules(registers, mask_token):
    """The table of a `DINOV2Backbone`. Its embedding's variables are numbered in the order it made
    them: the class token, the mask token, the registers, then the table at `image_shape` (trainable)
    and the table at `position_embedding_shape`."""
    e, tables = "layers/dinov2_embedding/", 1 + mask_token + (registers > 0)
    return [
        Rule("patch_embedding/conv/" + _VARS, e + "patch_embeddings/projection/vars/{w}"),
        Rule("class_token/token", e + "vars/0"), Rule("registers/tokens", f"{e}vars/{1 + mask_token}"),
        Rule(POSITIONS, f"{e}vars/{tables + 1}", r.positions(1, 1 + registers)),
        *_blocks("layers/dinov2_encoder/layers/dinov2_layer", ("norm1", "norm2"), "attention/attention", ("fc1", "fc2"),
                 ("layer_scale1", "layer_scale2")),
        Rule("encoder/norm/" + _VARS, "layers/layer_normalization/vars/{w}"),
    ]


def _blocks(f, norms, attention, mlp, scales=None):
    """Every block's rules; `f` names the first block's layer, `f`_1, `f`_2, ... the next ones (Keras'
    names), and the words its sublayers: `norms`, the `attention`'s MHA, the `mlp`'s Dense layers
    and, with LayerScale, its `scales`."""
    out = []
    for b, g in (("encoder/block_0/", f + "/"), ("encoder/block_{i}/", f + "_{i}/")):
        out += [Rule(b + "{m:norm1=%s|norm2=%s}/" % norms + _VARS, g + "{m}/vars/{w}"),
                Rule(b + "attn/" + _MHA, g + attention + "/{p}/vars/{w}"),
                Rule(b + "{m:fc1=%s|fc2=%s}/" % mlp + _VARS, g + "mlp/{m}/vars/{w}")]
        out += [Rule(b + "{m:ls1=%s|ls2=%s}/gamma" % scales, g + "{m}/vars/0")] if scales else []
    return out


def claims(path, config):
    """A folder (or its model.weights.h5) whose config.json is a keras-hub object's."""
    if config is not None and str(config.get("registered_name", "")).startswith("keras_hub>"):
        if path.is_dir() or path.name == "model.weights.h5":
            return path / "model.weights.h5" if path.is_dir() else path


def source(path, shapes, metadata, side, options):
    """The model of a keras-hub preset, by its backbone's class; see the module doc."""
    kind = side["config.json"].get("class_name")
    if kind not in _READERS:
        raise ValueError(f"{path.parent} holds a keras-hub {kind}; keras_vit reads the presets of {sorted(_READERS)} "
                         "(and ViTImageClassifier)")
    return _READERS[kind](path, side)


def _vit(path, side):
    backbone, task = side["config.json"], side["task.json"] or {}
    c = backbone["config"]
    off = [k for k in ("use_mha_bias", "use_mlp_bias", "use_patch_bias") if not c.get(k, True)]
    patch = c["patch_size"] if isinstance(c["patch_size"], int) else c["patch_size"][0]
    if off or patch != (c["patch_size"] if isinstance(c["patch_size"], int) else c["patch_size"][1]):
        raise ValueError(f"{path.parent}/config.json has patch_size={c['patch_size']} {off or ''}; keras_vit reads "
                         "square patches with every bias")
    head = task.get("config", {}) if task.get("class_name") == "ViTImageClassifier" else None
    class_token, pooling = c.get("use_class_token", True), (head or {}).get("pooling", "token")
    if head and (pooling not in ("token", "gap") or pooling == "gap" and class_token or head.get("activation")
                 not in (None, "linear")):
        raise ValueError(f"{path.parent}/task.json has pooling={pooling!r}, activation={head.get('activation')!r} "
                         f"with use_class_token={class_token}; keras_vit reads token pooling, or gap without a "
                         "class token, and logits (activation None)")
    model = dict(
        image_size=tuple(c["image_shape"][:2]), num_channels=c["image_shape"][2], patch_size=patch,
        hidden_dim=c["hidden_dim"], num_layers=c["num_layers"], num_heads=c["num_heads"], mlp_dim=c["mlp_dim"],
        dropout_rate=c.get("dropout_rate", 0.0), attention_dropout_rate=c.get("attention_dropout", 0.0),
        layer_norm_epsilon=c.get("layer_norm_epsilon", 1e-6), gelu_approximate=False, class_token=class_token,
        pooling=pooling if head or class_token else "gap", num_classes=head["num_classes"] if head else 0,
        representation_size=(head or {}).get("intermediate_dim"), class_names=(head or {}).get("class_names"),
        **_preprocessing(side),
    )
    scope = ("layers/", _TASK + "layers/") if head else ("layers/",)
    saved = (side["metadata.json"] or {}).get(r.SAVED)
    return r.Source(r.with_saved(model, saved), rules(model["representation_size"]), lambda k: k.startswith(scope))


def _siglip(path, side):
    """A `SigLIPBackbone`'s vision tower, or a `SigLIPVisionEncoder` alone."""
    config = side["config.json"]
    both = config["class_name"] == "SigLIPBackbone"
    c, p = (config["config"]["vision_encoder"] if both else config)["config"], "layers/sig_lip_vision_encoder/" * both
    act, epsilon = c.get("intermediate_activation", "gelu_approximate"), c.get("layer_norm_epsilon", 1e-6)
    # The final norm's epsilon is 1e-6 whatever layer_norm_epsilon says; keras_vit has one epsilon.
    bad = {k: v for k, v, ok in (("intermediate_activation", act, act in _GELU),
                                 ("layer_norm_epsilon", epsilon, epsilon == 1e-6)) if not ok}
    _refuse(path, bad, f"intermediate_activation one of {sorted(_GELU)} and layer_norm_epsilon=1e-6 (its final norm's)")
    model = dict(
        image_size=tuple(c["image_shape"][:2]), num_channels=c["image_shape"][2], patch_size=c["patch_size"],
        hidden_dim=c["hidden_dim"], num_layers=c["num_layers"], num_heads=c["num_heads"], mlp_dim=c["intermediate_dim"],
        num_classes=0, class_token=False, pooling="map", layer_norm_epsilon=1e-6, gelu_approximate=_GELU[act],
        resample_method="bicubic_no_antialias", **_preprocessing(side),
    )
    embedding = p + "layers/sig_lip_vision_embedding/"
    return r.Source(model, siglip_rules(p),
                    lambda k: k.startswith(p) and k != embedding + "vars/0")  # not its position ids


def _dinov2(path, side):
    """A `DINOV2Backbone`: built at its table's size (`position_embedding_shape`), taking `image_shape`."""
    c = side["config.json"]["config"]
    _refuse(path, {"use_swiglu_ffn": True} if c.get("use_swiglu_ffn") else {}, "a GELU MLP (use_swiglu_ffn=False)")
    p, registers, mask = c["patch_size"], c.get("num_register_tokens", 0), c.get("use_mask_token", True)
    table = c.get("position_embedding_shape", (518, 518))
    model = dict(
        image_size=(table[0] // p * p, table[1] // p * p), num_channels=c["image_shape"][2], patch_size=p,
        hidden_dim=c["hidden_dim"], num_layers=c["num_layers"], num_heads=c["num_heads"], mlp_dim=c["intermediate_dim"],
        num_classes=0, class_token=True, pooling="token", num_register_tokens=registers, layer_norm_epsilon=1e-6,
        layer_scale_init=c.get("layer_scale_init_value", 1.0), gelu_approximate=False,
        dropout_rate=c.get("dropout_rate", 0.0), attention_dropout_rate=c.get("dropout_rate", 0.0),
        drop_path_rate=c.get("drop_path_rate", 0.0), **_preprocessing(side),
        resample_method="bicubic" if c.get("antialias_in_interpolation") else "bicubic_no_antialias",
    )
    e = "layers/dinov2_embedding/vars/"
    unread = {f"{e}{1 + mask + (registers > 0)}",  # the table at image_shape
              *([e + "1"] if mask else [])}  # the mask token
    return r.Source(model, dinov2_rules(registers, mask), lambda k: k not in unread, tuple(c["image_shape"][:2]))


# A SigLIP MLP's intermediate_activation -> gelu_approximate.
_GELU = {"gelu_approximate": True, "gelu": False}


def _refuse(path, found, reads):
    """Raises one ValueError naming each option of config.json in `found` ({option: value}),
    which keras_vit cannot express; `reads` says what it reads instead."""
    if found:
        bad = ", ".join(f"{k}={v!r}" for k, v in found.items())
        raise ValueError(f"{path.parent}/config.json has {bad}; keras_vit reads {reads}")


def _preprocessing(side):
    """The `ViT` arguments of the `ViTImageConverter`'s preprocessing: image_mean / image_std (x *
    scale + offset on [0, 255] pixels), and how it resizes (`interpolation`, `antialias`,
    `crop_to_aspect_ratio`, `pad_to_aspect_ratio`, with keras-hub's defaults)."""
    pre = (side["preprocessor.json"] or {}).get("config", {}).get("image_converter") or side["image_converter.json"]
    converter = (pre or {}).get("config", {})
    if not converter:
        return {}
    flags = (converter.get("crop_to_aspect_ratio", True), converter.get("pad_to_aspect_ratio", False))
    crop = next((c for c, f in _CROPS.items() if f == flags), "center")
    resize = {v: k for k, v in _INTERPOLATION.items()}.get(converter.get("interpolation", "bilinear"))
    found = dict(image_crop=crop, image_antialias=bool(converter.get("antialias", False)),
                 **({"image_resize": resize} if resize else {}))
    return {**found, **_normalization(converter)}


def _normalization(converter):
    """image_mean / image_std of a `ViTImageConverter` config (x * scale + offset on [0, 255] pixels)."""
    scale, offset = converter.get("scale"), converter.get("offset")
    if scale is None and offset is None:
        return {}
    channels = next((len(v) for v in (scale, offset) if isinstance(v, list)), 3)
    scale, offset = (list(v) if isinstance(v, list) else [d if v is None else v] * channels
                     for v, d in ((scale, 1.0), (offset, 0.0)))
    std = [1 / (255 * s) for s in scale]  # x * scale + offset = (x / 255 - mean) / std
    return dict(image_mean=tuple(round(-o * s, 6) for o, s in zip(offset, std)),
                image_std=tuple(round(s, 6) for s in std))


# `keras_vit.preprocessing` names -> keras-hub's image converter's: its interpolation, and
# (crop_to_aspect_ratio, pad_to_aspect_ratio) of each crop.
_INTERPOLATION = {"nearest": "nearest", "bilinear": "bilinear", "bicubic": "bicubic", "lanczos": "lanczos3",
                  "box": "area"}
_CROPS = {"center": (True, False), "none": (False, False), "pad": (False, True)}
_READERS = {"ViTBackbone": _vit, "SigLIPBackbone": _siglip, "SigLIPVisionEncoder": _siglip, "DINOV2Backbone": _dinov2}
# What keras-hub's ViT cannot hold, with the value it can.
_CANNOT_HOLD = {
    "num_register_tokens": (0, "ViTBackbone has no registers"), "layer_scale_init": (None, "no LayerScale"),
    "qk_norm": (False, "no QK-norm"), "use_bias": (True, "its layer norms have biases"),
    "fc_norm": (False, "no fc_norm"),
    "parallel_block": (False, "its blocks are sequential"), "stem": (None, "no ResNet stem"),
    "gelu_approximate": (False, "its MLP uses the exact GELU"),
}


def write(model, path):
    """Writes `model` as a keras-hub preset folder: a `ViTBackbone`, and a `ViTImageClassifier` when
    it has a head; metadata.json keeps every `ViT` argument, which `keras_vit.load` restores."""
    config, head = model.get_config(), model.num_classes > 0
    cannot = dict(_CANNOT_HOLD)
    if not (model.pooling == "token" or model.pooling == "gap" and not model.class_token):
        cannot["pooling"] = ("token", "ViTImageClassifier pools the first token, or all tokens: "
                                      "gap without a class token")
    if not head:
        cannot["representation_size"] = (None, "ViTBackbone has no pre-logits layer")
    r.refuse(config, cannot, "keras_hub")
    folder = pathlib.Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = r.tensors(rules(model.representation_size), model, "the keras_hub format")
    for name, task in (("model.weights.h5", False), ("task.weights.h5", True)):
        part = {k.removeprefix(_TASK): v for k, v in tensors.items() if k.startswith(_TASK) == task}
        if part:
            with h5py.File(folder / name, "w") as f:
                for k, v in part.items():
                    f[k] = v
    backbone = _object("vit_backbone", "ViTBackbone", dict(
        image_shape=[*model.image_size, model.num_channels], patch_size=[model.patch_size] * 2,
        num_layers=model.num_layers, num_heads=model.num_heads, hidden_dim=model.hidden_dim, mlp_dim=model.mlp_dim,
        dropout_rate=model.dropout_rate, attention_dropout=model.attention_dropout_rate,
        layer_norm_epsilon=model.layer_norm_epsilon, use_class_token=model.class_token))
    converter = _object("vit_image_converter", "ViTImageConverter", dict(
        image_size=list(model.image_size), scale=[1 / (255 * s) for s in model.image_std],
        offset=[-m / s for m, s in zip(model.image_mean, model.image_std)],
        interpolation=_INTERPOLATION[model.image_resize], antialias=model.image_antialias,
        crop_to_aspect_ratio=_CROPS[model.image_crop][0], pad_to_aspect_ratio=_CROPS[model.image_crop][1]))
    files = {"config.json": backbone, "metadata.json": {r.SAVED: config, "tasks": ["ImageClassifier"] if head else []}}
    if head:
        preprocessor = _object("vit_image_classifier_preprocessor", "ViTImageClassifierPreprocessor",
                               dict(image_converter=converter, config_file="preprocessor.json"))
        files["preprocessor.json"] = preprocessor
        files["task.json"] = _object("vit_image_classifier", "ViTImageClassifier", dict(
            backbone=backbone, preprocessor=preprocessor, num_classes=model.num_classes, pooling=model.pooling,
            intermediate_dim=model.representation_size))
    else:
        files["image_converter.json"] = converter
    for name, value in files.items():
        (folder / name).write_text(json.dumps(value, indent=2))


def _object(module, name, config):
    """A keras-hub object as Keras serializes it."""
    return {"module": f"keras_hub.src.models.vit.{module}", "class_name": name, "config": config,
            "registered_name": f"keras_hub>{name}"}

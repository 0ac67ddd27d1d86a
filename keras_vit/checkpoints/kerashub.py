"""keras-hub ViT presets: a folder with config.json (a `ViTBackbone`), model.weights.h5 (its
weights), and for an image classifier task.json (a `ViTImageClassifier`: pooling, a tanh
pre-logits layer of `intermediate_dim`, the classes) with task.weights.h5 (the head), and
preprocessor.json or image_converter.json (a `ViTImageConverter`: pixels x `scale` + `offset`).

The `.weights.h5` files name each variable by the path of Keras' saving: the layer's attribute,
its class name in snake case ("vi_t_encoder_block", then "_1", "_2", ... for the next ones in a
list), and "vars/0", "vars/1" in the order the layer made them (kernel or gamma, then bias or
beta). keras-hub's layouts are keras_vit's: a (p, p, C, D) conv, (D, K, Dh) attention kernels;
its position table is an `Embedding` (R + N, D). Shapes: D width, R prefix rows, N patches.
"""

import json
import pathlib
from types import SimpleNamespace

import h5py

from keras_vit.checkpoints import rules as r
from keras_vit.checkpoints.rules import Rule
from keras_vit.io import h5
from keras_vit.models.resize import POSITIONS

NAME, SIDE_FILES = "keras_hub", ("task.json", "preprocessor.json", "image_converter.json", "metadata.json",
                                 "task.weights.h5")
_TASK = "task/"  # names of task.weights.h5, beside the backbone's model.weights.h5
_E, _ENC = "layers/vi_t_patching_and_embedding/", "layers/vi_t_encoder/"
_VARS = "{w:gamma=0|beta=1|kernel=0|bias=1}"


def _headers(path):
    """({name: shape}, {}) of model.weights.h5 and, under "task/", of task.weights.h5 beside it."""
    shapes, _ = h5.headers(path)
    task = path.parent / "task.weights.h5"
    return {**shapes, **({_TASK + k: s for k, s in h5.headers(task)[0].items()} if task.is_file() else {})}, {}


def _read(path, names):
    task = [n.removeprefix(_TASK) for n in names if n.startswith(_TASK)]
    out = h5.read(path, [n for n in names if not n.startswith(_TASK)])
    return {**out, **({_TASK + k: v for k, v in h5.read(path.parent / "task.weights.h5", task).items()} if task else {})}


READER = SimpleNamespace(headers=_headers, read=_read)


def rules(pre_logits):
    """The table of a `ViTBackbone`, and of a `ViTImageClassifier`'s head (with a pre-logits layer
    or not: Keras names the head's Dense layers "dense", "dense_1" in the order they were made)."""
    head = {"pre_logits": "dense", "classifier": "dense_1"} if pre_logits else {"classifier": "dense"}
    return [
        Rule("patch_embedding/conv/" + _VARS, _E + "patch_embedding/vars/{w}"),
        Rule("class_token/token", _E + "vars/0"),
        Rule(POSITIONS, _E + "position_embedding/vars/0", r.reshape(lambda s: s[1:])),  # (1, R + N, D) <-> (R + N, D)
        *_block("encoder/block_0/", _ENC + "encoder_layers/vi_t_encoder_block/"),  # the first has no number
        *_block("encoder/block_{i}/", _ENC + "encoder_layers/vi_t_encoder_block_{i}/"),
        Rule("encoder/norm/" + _VARS, _ENC + "layer_norm/vars/{w}"),
        *[Rule(f"head/{k}/" + _VARS, f"{_TASK}layers/{v}/vars/{{w}}") for k, v in head.items()],
    ]


def _block(b, f):
    return [Rule(b + "{m:norm1=layer_norm_1|norm2=layer_norm_2}/" + _VARS, f + "{m}/vars/{w}"),
            Rule(b + "attn/{p:query=query_dense|key=key_dense|value=value_dense|attention_output=output_dense}/" + _VARS,
                 f + "mha/{p}/vars/{w}"),
            Rule(b + "{m:fc1=dense_1|fc2=dense_2}/" + _VARS, f + "mlp/{m}/vars/{w}")]


def claims(path, config):
    """A folder (or its model.weights.h5) whose config.json is a keras-hub object's."""
    if config is not None and str(config.get("registered_name", "")).startswith("keras_hub>"):
        if path.is_dir() or path.name == "model.weights.h5":
            return path / "model.weights.h5" if path.is_dir() else path


def source(path, shapes, metadata, side, options):
    """The model of a keras-hub ViT preset; see the module doc."""
    backbone, task = side["config.json"], side["task.json"] or {}
    if backbone.get("class_name") != "ViTBackbone":
        raise ValueError(f"{path.parent} holds a keras-hub {backbone.get('class_name')}; keras_vit reads ViTBackbone "
                         "and ViTImageClassifier presets")
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
        **_normalization(side),
    )
    saved = r.saved_config((side["metadata.json"] or {}).get(r.SAVED))
    if any(saved.get(k, model[k]) != model[k] for k in ("hidden_dim", "num_layers", "num_classes", "patch_size")):
        saved = {}  # the preset changed since keras_vit wrote it
    scope = ("layers/", _TASK + "layers/") if head else ("layers/",)
    return r.Source({**model, **saved}, rules(model["representation_size"]), lambda k: k.startswith(scope))


def _normalization(side):
    """image_mean / image_std of the `ViTImageConverter` (x * scale + offset on [0, 255] pixels)."""
    pre = (side["preprocessor.json"] or {}).get("config", {}).get("image_converter") or side["image_converter.json"]
    converter = (pre or {}).get("config", {})
    scale, offset = converter.get("scale"), converter.get("offset")
    if scale is None and offset is None:
        return {}
    channels = next((len(v) for v in (scale, offset) if isinstance(v, list)), 3)
    scale, offset = (list(v) if isinstance(v, list) else [d if v is None else v] * channels
                     for v, d in ((scale, 1.0), (offset, 0.0)))
    std = [1 / (255 * s) for s in scale]  # x * scale + offset = (x / 255 - mean) / std
    return dict(image_mean=tuple(round(-o * s, 6) for o, s in zip(offset, std)), image_std=tuple(round(s, 6) for s in std))


WRITES = "keras_hub"
# What keras-hub's ViT cannot hold, with the value it can.
_CANNOT_HOLD = {
    "num_register_tokens": (0, "ViTBackbone has no registers"), "layer_scale_init": (None, "no LayerScale"),
    "qk_norm": (False, "no QK-norm"), "use_bias": (True, "its layer norms have biases"), "fc_norm": (False, "no fc_norm"),
    "parallel_block": (False, "its blocks are sequential"), "stem": (None, "no ResNet stem"),
    "gelu_approximate": (False, "its MLP uses the exact GELU"),
}


def write(model, path):
    """Writes `model` as a keras-hub preset folder: a `ViTBackbone`, and a `ViTImageClassifier` when
    it has a head; metadata.json keeps every `ViT` argument, which `load_checkpoint` restores."""
    config, head = model.get_config(), model.num_classes > 0
    cannot = dict(_CANNOT_HOLD)
    if not (model.pooling == "token" or model.pooling == "gap" and not model.class_token):
        cannot["pooling"] = ("token", "ViTImageClassifier pools the first token, or all tokens: gap without a class token")
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
        offset=[-m / s for m, s in zip(model.image_mean, model.image_std)], interpolation="bilinear"))
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

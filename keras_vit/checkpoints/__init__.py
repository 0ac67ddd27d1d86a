"""The one way from a source to a model, `load` (`keras_vit.load`): `.keras` files, Google's `.npz`,
timm `.safetensors`, Hugging Face folders and keras-hub presets in, by path, handle or catalog name;
timm, transformers and keras-hub out (`save_checkpoint`). One module per format family (`google`,
`timm`, `transformers`, `kerashub`), each a table of rules in the vocabulary of `rules`, which
interprets them; `formats` lists them and detects a path's."""

import inspect
import os
import pathlib

from keras_vit import hub
from keras_vit.checkpoints import formats, rules
from keras_vit.io.arrays import check_finite, check_tensors
from keras_vit.layers import POOLING_MODES, RESAMPLE_METHODS
from keras_vit.models import ViT, adapt, new_head_config, variable_shapes, weights
from keras_vit.preprocessing import CROPS, RESIZE


def _number(low=0.0, kind=(int, float), high=float("inf")):
    return lambda v: isinstance(v, kind) and not isinstance(v, bool) and low <= v < high


def _sequence(item, lengths=None):
    return lambda v: isinstance(v, (tuple, list)) and len(v) in (lengths or [len(v)]) and all(map(item, v))


_SIZE, _BOOL, _TEXT = _sequence(_number(1, int), [2]), (lambda v: isinstance(v, bool)), (lambda v: isinstance(v, str))
# Every option of load_checkpoint: name -> (whether a value is allowed, what is allowed). Those that
# are ViT arguments (`OVERRIDES`) go to the model; none of them changes a stored tensor's shape but
# image_size (the position table is resampled) and num_classes (a new head).
OPTIONS = {
    "image_size": (lambda v: _number(1, int)(v) or _SIZE(v), "an int or (H, W)"),
    "num_classes": (_number(0, int), "an int >= 0"), "gelu_approximate": (_BOOL, "True or False"),
    "resample_method": (RESAMPLE_METHODS.__contains__, f"one of {RESAMPLE_METHODS}"),
    "image_mean": (_sequence(_number(-1e9)), "one number per channel"),
    "image_std": (_sequence(_number(1e-12)), "one number > 0 per channel"),
    "image_resize": (RESIZE.__contains__, f"one of {tuple(RESIZE)}"), "image_antialias": (_BOOL, "True or False"),
    "image_crop": (CROPS.__contains__, f"one of {CROPS}"),
    "layer_norm_epsilon": (_number(1e-30), "a number > 0"),
    "pooling": (POOLING_MODES.__contains__, f"one of {POOLING_MODES}"),
    **dict.fromkeys(("dropout_rate", "attention_dropout_rate", "drop_path_rate"),
                    (_number(0, high=1), "a rate in [0, 1)")),
    "class_names": (lambda v: v is None or _sequence(_TEXT)(v), "a list of names"),
    "dtype": (_TEXT, "a dtype policy name, e.g. 'float16'"), "name": (_TEXT, "a string"),
    "labels": (os.path.isfile, "a text file of class names, one per line"),
    "num_heads": (_number(1, int), "an int >= 1 (timm files)"),
    "source_image_size": (lambda v: _number(1, int)(v) or _SIZE(v), "an int or (H, W), the size it was trained at"),
    "filename": (_TEXT, "the name of a file of an hf:// repo"), "allow_nonfinite": (_BOOL, "True or False"),
    "dynamic_image_size": (_BOOL, "True or False"),
    "new_head": (_BOOL, "True or False"),
    "max_seq_len": (lambda v: v is None or _number(1, int)(v), "None or a token budget, an int >= 1"),
    "resample_keep_aspect": (_BOOL, "True or False"),
}
# The options that only some formats' files have a use for: a .keras file refuses them.
WEIGHTS_ONLY = ("num_heads", "source_image_size", "allow_nonfinite")
OVERRIDES = tuple(k for k in OPTIONS if k in {*inspect.signature(ViT).parameters, "dtype", "name"} - {"num_heads"})


def load(source, **options):
    """The `ViT` that `source` holds: the one function that turns a source into a model, which the
    training CLI, the demo and the studies call.

    Sources: a local file or folder; a handle, `hf://org/repo[@revision]`, `gs://bucket/object` or
    `https://...`, downloaded once into a cache and checked (see `keras_vit.hub`); a name of
    `keras_vit.list_pretrained()`. Formats, detected from the file (docs/checkpoints.md has the
    details and defaults): a `.keras` file (Keras' own, read in safe mode: no code is
    deserialized); Google vit_jax, AugReg and big_vision `.npz` (SigLIP image towers and R50
    hybrids included); timm state dicts as `.safetensors` (heads from `num_heads=`, timm's
    config.json beside the file, or the standard widths); Hugging Face ViT, SigLIP and DINOv2
    folders; keras-hub ViT presets (`ViTBackbone`, `ViTImageClassifier`) and the vision towers of
    its SigLIP (`SigLIPBackbone`, whose text tower is never read) and DINOv2 (`DINOV2Backbone`)
    presets. A file that `save_checkpoint` wrote restores every argument of its model.

    One pass: the options are checked (a typo fails before anything is read or downloaded); the
    headers give the architecture, and the names and shapes the file must hold, compared once
    (one ValueError names each missing, unexpected or mis-shaped tensor); only the tensors the
    model uses are read (a SigLIP file's text tower never is), and refused if NaN or Inf; the
    model is built once. A `.keras` model is loaded whole, then rebuilt with its weights only
    when an option changes it.

    Args:
        source: the file, the folder, a handle or a catalog name.
        **options: the keys of `OPTIONS`. `image_size` (the position table is resampled with
            `resample_method`); `num_classes` (another count gets the paper's new head, §3.2:
            no pre-logits layer, a zero-initialized classifier); `gelu_approximate`,
            `image_mean`, `image_std`, `image_resize`, `image_antialias`, `image_crop` (the
            model's `preprocessing`), `layer_norm_epsilon`, `pooling` ("token" without a class
            token reads the first token, big_vision's pool_type "0"), the dropout rates,
            `class_names`, `name` and `dtype` (half-precision files load into float32 unless
            asked); `labels`: a file of class names, one per line (else ImageNet's for 1000
            classes); `num_heads` (timm); `source_image_size` (the size a non-square checkpoint
            was trained at); `filename` (a file of an hf:// repo); `allow_nonfinite=True`;
            `dynamic_image_size=True`: the model takes any multiple of the patch size (see `ViT`);
            `new_head=True`: the paper's new head even for the same `num_classes`;
            `max_seq_len`: the token budget of the patch sequences the model is served with (any
            checkpoint: the same variables take patch sequences; a NaFlexVit file's default is its
            position table's size); `resample_keep_aspect` (timm's `pos_embed_ar_preserving`,
            which a NaFlexVit state dict does not store).

    A source that is none of these is refused in one ValueError naming it and what was tried;
    download failures raise `keras_vit.DownloadError` (a ConnectionError) naming the URL tried.
    """
    _check(options)
    path = hub.locate(source, options.get("filename"))
    if path.suffix == ".keras":
        return _from_keras_file(path, options)
    return _from_weights(path, options)


load_checkpoint = load  # its name before `load` read .keras files too


def _from_keras_file(path, options):
    """A `.keras` file's ViT (safe mode), rebuilt by `adapt` when `options` change its config."""
    import keras

    refused = sorted(set(options) & set(WEIGHTS_ONLY))
    if refused:
        raise ValueError(f"{path} is a .keras file, which holds its whole model; {refused} apply only to the "
                         "weights files of other formats")
    if not path.is_file():
        raise ValueError(f"{path} is a folder; a .keras model is one file")
    model = keras.saving.load_model(path, safe_mode=True, compile=False)
    if not isinstance(model, ViT):
        raise ValueError(f"{path} holds a {type(model).__name__}, not a keras_vit.ViT")
    config, new_head = _config(model.get_config(), options)
    if config == model.get_config() and not new_head:
        return model
    return adapt(weights(model), model.grid_size, config, new_head)


def _from_weights(path, options):
    """The ViT of a weights file or folder of one of `formats.FORMATS`, built from its tensors."""
    fmt, weights_file, side = formats.detect(path)
    if not weights_file.is_file():
        raise ValueError(f"{path} has no {weights_file.name}")
    shapes, metadata = fmt.reader.READER.headers(weights_file)
    source = fmt.reader.source(weights_file, shapes, metadata, side, options)
    config, new_head = _config({**source.config, **({"image_size": source.image_size} if source.image_size else {})},
                               options)
    built, expected = variable_shapes(source.config)
    plan = rules.plan(source.rules, expected, f"the {fmt.name} format")
    check_tensors({k: s for k, s in shapes.items() if source.scope is None or source.scope(k)},
                  rules.expected(plan), str(weights_file))
    tensors = fmt.reader.READER.read(weights_file, list(plan))
    if not options.get("allow_nonfinite"):
        check_finite(tensors)
    return adapt(rules.to_model(plan, tensors), built.grid_size, config, new_head)


def _check(options):
    """Raises a ValueError for an option `load` does not take, or a value it does not."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"keras_vit.load got {unknown}; it reads the architecture from the file and takes only "
                         f"{sorted(OPTIONS)}")
    for key, value in options.items():
        allowed, what = OPTIONS[key]
        if not allowed(value):
            raise ValueError(f"keras_vit.load got {key}={value!r}; use {what}")


def _config(source, options):
    """(the loaded model's arguments, whether its head is new) from the file's and the options."""
    if options.get("pooling") == "map" and source["pooling"] != "map":
        raise ValueError("pooling='map' needs the checkpoint's MAP head, and this checkpoint has none; "
                         f"it pools with {source['pooling']!r}")
    config = {**source, **{k: v for k, v in options.items() if k in OVERRIDES}}
    new_head = options.get("new_head", False) or config["num_classes"] != source["num_classes"]
    if new_head:
        config = new_head_config(config, config["num_classes"], options.get("class_names"))
    if "labels" in options:
        config["class_names"] = read_labels(options["labels"], config["num_classes"])
    elif config.get("class_names") is None and config["num_classes"] == 1000:
        config["class_names"] = imagenet_classes()
    return config, new_head


def save_checkpoint(model, path, format="timm"):
    """Writes `model` to `path` in the layout of `format`.

    "timm": a safetensors state dict that timm's `VisionTransformer` loads (`load_state_dict`)
    when built with the same architecture (`img_size`, `patch_size`, `embed_dim`, `depth`,
    `num_heads`, `mlp_ratio`, `num_classes`; `class_token=False, global_pool="avg",
    fc_norm=False` for GAP; a tanh-GELU `act_layer`; `reg_tokens`, `init_values`, `qk_norm`,
    `global_pool="map"`, a `HybridEmbed` ResNet as the model has them); a sin-cos table is its
    `pos_embed`. The metadata keeps every `ViT` argument: `load_checkpoint` restores the model's
    `get_config()` exactly, as well as its weights.

    "transformers": a folder (`path`) with config.json, model.safetensors and
    preprocessor_config.json that `transformers.ViTForImageClassification.from_pretrained` loads
    (`ViTModel` when `num_classes=0`; its pooler is the pre-logits layer); `id2label` holds the
    class names, and `AutoImageProcessor` applies the model's size, mean and std. config.json keeps
    every `ViT` argument under "keras_vit", which `load_checkpoint` restores.

    "keras_hub": a keras-hub preset folder (`path`) that `keras_hub.models.ViTImageClassifier
    .from_preset` loads (`ViTBackbone` when `num_classes=0`), its image converter applying the
    model's size, mean and std; metadata.json keeps every `ViT` argument for `load_checkpoint`.

    A model that the format cannot hold (e.g. registers in a transformers folder) is refused in one
    ValueError naming each such argument.
    """
    if not isinstance(model, ViT):
        raise ValueError(f"save_checkpoint takes a keras_vit.ViT, got {type(model).__name__}")
    if format not in formats.WRITERS:
        raise ValueError(f"format={format!r} is not supported; use one of {sorted(formats.WRITERS)}")
    if model.quantization is not None:
        raise ValueError(f"save_checkpoint writes float weights, and this model is quantized to "
                         f"{model.quantization['mode']!r}; save it with model.save('....keras'), or write the float "
                         "model it was quantized from")
    formats.WRITERS[format].reader.write(model, path)


def read_labels(path, num_classes):
    """Class names from a text file, one per line."""
    names = [line.strip() for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(names) != num_classes:
        raise ValueError(f"labels file {path} has {len(names)} labels but the model has num_classes={num_classes}")
    return tuple(names)


def imagenet_classes():
    """The 1000 ImageNet-1k class names in label order (WordNet lemmas, from timm's data files)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "data" / "imagenet_classes.txt"
    return tuple(path.read_text().splitlines())


__all__ = ["OPTIONS", "OVERRIDES", "imagenet_classes", "load", "load_checkpoint", "read_labels", "save_checkpoint"]

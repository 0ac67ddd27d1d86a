"""Keras' weight quantization (`keras.Model.quantize`) of a ViT, and how a quantized ViT is saved.

Keras quantizes the Dense and EinsumDense layers of a model in place: each keeps an int8 (or
packed int4, or float8) kernel and its scales instead of the float kernel. A `.keras` file stores
those variables, but a ViT rebuilds its sublayers from its own arguments when the file loads, as
float layers, which cannot take them. So the ViT records which of its layers are quantized, and
how, in its `quantization` argument; building a ViT with that record quantizes the same layers
again (on its fresh weights), and the file's variables then load into them.

The record is a dict: {"mode": "int8", "layers": [layer paths under the model], "config": the
serialized `keras.quantizers.QuantizationConfig` or None}.
"""

import contextlib
import json
import warnings

import keras

from keras_vit import upstream

# The modes of `keras.Model.quantize` that a ViT takes. Keras' GPTQ and AWQ calibrate block by
# block on text: their configs need a tokenizer and a dataset of strings (`GPTQConfig(dataset,
# tokenizer)`), which a model of images does not have.
MODES = ("int8", "int4", "float8")
REFUSED = {
    "gptq": "Keras' GPTQ calibrates on tokenized text (GPTQConfig needs a tokenizer), and a ViT takes images",
    "awq": "Keras' AWQ calibrates on tokenized text (AWQConfig needs a tokenizer), and a ViT takes images",
}


def check_mode(model, mode, config):
    """The mode of a `quantize(mode, config)` call on `model`, or a ValueError naming why not.
    (Keras resolves `mode` into a config first, and refuses "gptq" or "awq" without one.)"""
    if mode is None and config is not None:
        mode = getattr(config, "mode", None)
    if mode in REFUSED:
        raise ValueError(f"quantize(mode={mode!r}) is not supported: {REFUSED[mode]}; use one of {MODES}, or "
                         "keras_vit.serving.quantize_int8 for int8 calibrated on images")
    if mode not in MODES:
        raise ValueError(f"quantize(mode={mode!r}) is not supported; use one of {MODES}")
    done = model.quantization
    if done is not None and done["mode"] != mode:
        raise ValueError(f"this model is already quantized to {done['mode']!r}; quantize a float model to {mode!r} "
                         "(e.g. the checkpoint it was loaded from)")
    if lora_layers(model):
        raise ValueError(f"quantize(mode={mode!r}) after enable_lora is not supported: merge the LoRA weights first "
                         "(model.merge_lora()), then quantize the merged model")
    return mode


def check_record(record):
    """A `quantization` argument, checked: None or {"mode", "layers", "config"}."""
    if record is None:
        return None
    if not isinstance(record, dict) or set(record) != {"mode", "layers", "config"}:
        raise ValueError(f"quantization={record!r} is not allowed; use None or the dict that quantize() records, "
                         '{"mode": ..., "layers": [...], "config": ...}')
    if record["mode"] not in MODES:
        raise ValueError(f"quantization mode {record['mode']!r} is not allowed; use one of {MODES}")
    # As JSON holds it (lists, not tuples), so that a record equals its reloaded copy.
    return json.loads(json.dumps({"mode": record["mode"], "layers": sorted(str(p) for p in record["layers"]),
                                  "config": record["config"]}))


@contextlib.contextmanager
def quiet_unsupported_layers():
    """Keras warns once per layer that has no `quantize` (every LayerNorm, Dropout, ...); those
    layers hold no kernel to quantize, so the warnings say nothing about the result."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Layer \w+ does not have a `quantize` method implemented")
        yield


def relative_path(model, path):
    """A layer's or variable's `path` below the model: "encoder/block_0/attn/query" (None stays None,
    for a layer never built)."""
    return path[len(model.path) + 1:] if path and path.startswith(model.path + "/") else path


def quantized_layers(model):
    """{path below the model: layer} of the quantized layers."""
    return {relative_path(model, layer.path): layer for layer in model._flatten_layers(include_self=False)
            if getattr(layer, "quantization_mode", None) is not None}


def record(model, mode, config):
    """The `quantization` record of `model` after `quantize(mode, config)`."""
    serialized = None if config is None else upstream.serialize(config)
    return check_record({"mode": mode, "layers": sorted(quantized_layers(model)), "config": serialized})


def apply(model, record):
    """Quantizes the layers named in `record` (a fresh model's, whose weights are then loaded)."""
    config = None if record["config"] is None else keras.saving.deserialize_keras_object(record["config"])
    layers = {relative_path(model, layer.path): layer for layer in model._flatten_layers(include_self=False)
              if layer.path}
    missing = sorted(set(record["layers"]) - set(layers))
    if missing:
        raise ValueError(f"quantization names layers that this model does not have: {missing}")
    for path in record["layers"]:
        layers[path].quantize(record["mode"], config=config)
    model._post_quantize(record["mode"])  # torch: track the new variables


def lora_layers(model):
    """{path below the model: layer} of the layers with LoRA enabled."""
    return {relative_path(model, layer.path): layer for layer in model._flatten_layers(include_self=False)
            if getattr(layer, "lora_enabled", False)}


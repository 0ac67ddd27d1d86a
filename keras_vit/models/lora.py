"""LoRA (Hu et al., 2022) on a ViT, with Keras' own `enable_lora` of Dense and EinsumDense layers.

Keras adds two float32 factors A, B to each chosen layer, with B zero-initialized, so the output is
unchanged when LoRA is enabled; the layer's `kernel` is then W + (alpha / r) A B, which the fused
attention path reads like any kernel. Keras' `.keras` files store that merged kernel (a reloaded
model computes the same outputs, without LoRA factors); `save_weights` here stores the factors
alone (a .safetensors file, with the head when it was trained too), to be loaded onto the base
checkpoint.

Layer names: "query", "key", "value" and "attention_output" in each block's attention, "fc1" and
"fc2" in its MLP (see `keras_vit.layers.TransformerBlock`).
"""

import json

import numpy as np

from keras_vit.io import safetensors
from keras_vit.models import quantization

# The LoRA paper's choice for attention (§7.1): the query and value projections.
DEFAULT_TARGETS = ("query", "value")
FACTORS = ("lora_kernel_a", "lora_kernel_b")
_HEADER = "keras_vit_lora"  # the metadata key of the rank, alpha and target names (JSON)


def _candidates(model):
    """{path below the model: layer} of the layers that have Keras' `enable_lora`, head excluded."""
    return {path: layer for path, layer in
            ((quantization.relative_path(model, layer.path), layer)
             for layer in model._flatten_layers(include_self=False))
            if hasattr(layer, "enable_lora") and layer.weights and not path.startswith("head/")}


def enable(model, rank, target_layer_names=None, train_head=True):
    """Enables LoRA of `rank` on the layers named `target_layer_names`; freezes everything else
    (but the classifier head when `train_head`). Returns the paths of the LoRA layers."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank={rank!r} is not allowed; use a positive integer")
    names = DEFAULT_TARGETS if target_layer_names is None else tuple(target_layer_names)
    candidates = _candidates(model)
    known = sorted({path.rsplit("/", 1)[-1] for path in candidates})
    unknown = sorted(set(names) - set(known))
    if not names or unknown:
        raise ValueError(f"target_layer_names={list(names)!r}: {unknown or 'none'} are not layers of this ViT that "
                         f"take LoRA; use names from {known}")
    if quantization.lora_layers(model):
        raise ValueError("LoRA is already enabled on this model; enable_lora can be called once")
    if model.quantization is not None:
        raise ValueError(f"enable_lora on a model quantized to {model.quantization['mode']!r} is not supported; "
                         "enable LoRA on the float model, fine-tune, merge_lora(), then quantize")
    chosen = {path: layer for path, layer in candidates.items() if path.rsplit("/", 1)[-1] in names}
    for layer in chosen.values():
        layer.enable_lora(rank)
    head = {id(v) for v in model.head.weights} if train_head else set()
    factors = {id(getattr(layer, f)) for layer in chosen.values() for f in FACTORS}
    for variable in model.weights:
        variable.trainable = id(variable) in factors or id(variable) in head
    return sorted(chosen)


def merge(model, cls):
    """A new `cls` (the ViT class) with every LoRA layer's W + (alpha / r) A B as its kernel."""
    layers = quantization.lora_layers(model)
    if not layers:
        raise ValueError("this model has no LoRA weights to merge; call enable_lora first")
    merged = {quantization.relative_path(model, layer._kernel.path): layer.kernel for layer in layers.values()}
    source = {quantization.relative_path(model, v.path): v for v in model.weights}
    plain = cls.from_config(model.get_config())
    for variable in plain.weights:
        path = quantization.relative_path(plain, variable.path)
        variable.assign(merged[path] if path in merged else source[path])
    return plain


def save_weights(model, path):
    """Writes the LoRA factors of `model` to the .safetensors `path`, with their rank and targets,
    and the classifier head's weights when they were trained with them (`train_head`)."""
    layers = quantization.lora_layers(model)
    if not layers:
        raise ValueError("this model has no LoRA weights to save; call enable_lora first")
    first = next(iter(layers.values()))
    head = _trained_head(model)
    header = {"rank": first.lora_rank, "alpha": first.lora_alpha,
              "target_layer_names": sorted({p.rsplit("/", 1)[-1] for p in layers}), "head": bool(head)}
    tensors = {f"{p}/{f}": np.asarray(getattr(layer, f)) for p, layer in layers.items() for f in FACTORS}
    tensors.update({path: np.asarray(v) for path, v in head.items()})
    safetensors.write(path, tensors, {_HEADER: json.dumps(header)})


def load_weights(model, path):
    """Loads LoRA factors (and a trained head) written by `save_weights` onto `model` (its base
    weights), enabling LoRA with the file's rank and targets if it is not enabled. Names and
    shapes are checked before any tensor is read."""
    found, metadata = safetensors.headers(path)
    if _HEADER not in (metadata or {}):
        raise ValueError(f"{path} holds no keras_vit LoRA weights (no {_HEADER!r} metadata); write it with "
                         "ViT.save_lora_weights")
    header = json.loads(metadata[_HEADER])
    if not quantization.lora_layers(model):
        enable(model, int(header["rank"]), header["target_layer_names"], train_head=bool(header["head"]))
    layers = quantization.lora_layers(model)
    head = _trained_head(model) if header["head"] else {}
    expected = {f"{p}/{f}": tuple(getattr(layer, f).shape) for p, layer in layers.items() for f in FACTORS}
    expected.update({path: tuple(v.shape) for path, v in head.items()})
    found = {k: tuple(v) for k, v in found.items()}
    if found != expected:
        wrong = sorted(set(found) ^ set(expected)) or sorted(k for k in found if found[k] != expected[k])
        raise ValueError(f"{path} does not fit this model's LoRA layers (rank {next(iter(layers.values())).lora_rank},"
                         f" {sorted({p.rsplit('/', 1)[-1] for p in layers})}): these tensors differ in name or "
                         f"shape: {wrong[:6]}")
    values = safetensors.read(path, sorted(expected))
    for p, layer in layers.items():
        for f in FACTORS:
            getattr(layer, f).assign(values[f"{p}/{f}"])
    for path, variable in head.items():
        variable.assign(values[path])


def _trained_head(model):
    """{path below the model: variable} of the classifier head's weights, when they train beside
    the LoRA factors (a new head for the fine-tuning task is part of what was learned)."""
    weights = {quantization.relative_path(model, v.path): v for v in model.head.weights}
    return weights if weights and all(v.trainable for v in weights.values()) else {}

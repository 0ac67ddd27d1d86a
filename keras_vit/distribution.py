"""Model-parallel layouts for ViT on `keras.distribution` (JAX backend).

Megatron-style tensor parallelism (Shoeybi et al., 2019) mapped onto Keras' variable names:
attention is split over heads and the MLP over its hidden units, so each block needs one
all-reduce after attention and one after the MLP, and every device holds 1/m of each block.

Shapes: D model width, K heads, Dh head width, M MLP width, m the size of the "model" mesh axis.

    q, k, v kernels   (D, K, Dh)  -> (None, "model", None)   heads split
    q, k, v biases    (K, Dh)     -> ("model", None)
    output kernel     (K, Dh, D)  -> ("model", None, None)   its input (heads) split
    fc1 kernel, bias  (D, M), (M,) -> column-wise: (None, "model"), ("model",)
    fc2 kernel        (M, D)      -> row-wise: ("model", None)
    everything else (patch and position embeddings, class token, LayerNorms, output and fc2
    biases, head) is replicated.
"""

import re

import keras
import numpy as np

MODEL_AXIS = "model"

# Regexes are matched by `LayoutMap` with `re.fullmatch` against the variable path, e.g.
# "vit/encoder/block_3/attn/query/kernel"; the leading ".*/" makes them independent of the
# model's name.
RULES = {
    r".*/attn/(query|key|value)/kernel": (None, MODEL_AXIS, None),
    r".*/attn/(query|key|value)/bias": (MODEL_AXIS, None),
    r".*/attn/attention_output/kernel": (MODEL_AXIS, None, None),
    r".*/fc1/kernel": (None, MODEL_AXIS),
    r".*/fc1/bias": (MODEL_AXIS,),
    r".*/fc2/kernel": (MODEL_AXIS, None),
}
# Models built with `use_bias=False` (ViT-22B) have no q, k, v biases; every other rule must match.
OPTIONAL_RULES = (r".*/attn/(query|key|value)/bias",)


def replicated(x):
    """`x` laid out whole on every device of the Keras distribution in effect, when one is (JAX);
    `x` itself otherwise. Inside a compiled function this lets every process read the whole
    result, where the compiler could otherwise leave it split across the processes' devices."""
    dist = keras.distribution.distribution() if keras.backend.backend() == "jax" else None
    if dist is None:
        return x
    return keras.distribution.distribute_tensor(x, keras.distribution.TensorLayout([None] * len(x.shape),
                                                                                    dist.device_mesh))


def layout_map(model, mesh):
    """A `keras.distribution.LayoutMap` that shards `model`'s blocks over the "model" axis of `mesh`.

    Args:
        model: a built `keras_vit.ViT` (it may be built under `keras.StatelessScope()` so that a
            large one costs no memory); only its variable paths and shapes are read.
        mesh: a `keras.distribution.DeviceMesh` with an axis named "model" (e.g. axes
            ("batch", "model")).

    Returns:
        A `LayoutMap` to pass to `keras.distribution.ModelParallel(layout_map=...,
        batch_dim_name="batch")`; build the model again inside that distribution's scope.

    Raises:
        ValueError: if the mesh has no "model" axis, a rule matches no variable of the model
            (Keras would silently replicate it), or a sharded dimension (heads, MLP width) is
            not divisible by the size of the "model" axis.
    """
    check_layouts(model.weights, mesh)
    return rules_layout_map(mesh)


def rules_layout_map(mesh):
    """The `RULES` as a `LayoutMap` on `mesh`, without checking them against a model."""
    model_axis_size(mesh)
    layouts = keras.distribution.LayoutMap(mesh)
    for pattern, axes in RULES.items():
        layouts[pattern] = axes
    return layouts


def model_axis_size(mesh):
    """m, the number of devices along the "model" axis of `mesh`."""
    if MODEL_AXIS not in mesh.axis_names:
        raise ValueError(
            f"the device mesh has axes {tuple(mesh.axis_names)}; ViT model parallelism needs an "
            f"axis named {MODEL_AXIS!r}, e.g. DeviceMesh((2, 4), ('batch', 'model'), devices)"
        )
    return mesh.shape[list(mesh.axis_names).index(MODEL_AXIS)]


def matching_rule(path):
    """The `RULES` key that `path` fully matches, or None (replicated)."""
    matches = [pattern for pattern in RULES if re.fullmatch(pattern, path)]
    return matches[0] if matches else None


def check_variable(path, shape, mesh):
    """Raises a ValueError when a dimension of the variable that its rule shards over the
    "model" axis does not divide by that axis' size. Returns the matched rule or None."""
    pattern = matching_rule(path)
    if pattern is None:
        return None
    size = model_axis_size(mesh)
    for dim, axis in zip(shape, RULES[pattern]):
        if axis == MODEL_AXIS and dim % size:
            what = "MLP width mlp_dim" if "/fc" in path else "num_heads"
            raise ValueError(
                f"{what}={dim} (variable {path!r}, shape {tuple(shape)}) is not divisible by the "
                f"{MODEL_AXIS!r} mesh axis of size {size}; use a model axis that divides both "
                "num_heads and mlp_dim"
            )
    return pattern


def check_layouts(variables, mesh):
    """Checks every variable against `RULES` and that every rule matched at least one of them."""
    matched = {check_variable(v.path, v.shape, mesh) for v in variables}
    unmatched = [pattern for pattern in RULES if pattern not in matched and pattern not in OPTIONAL_RULES]
    if unmatched:
        raise ValueError(
            f"layout rules {unmatched} match no variable of the model, so those weights would be "
            "silently replicated; is this a keras_vit.ViT? Variable paths look like "
            "'vit/encoder/block_0/attn/query/kernel'"
        )


def spans_processes(model):
    """True when some of `model`'s or its optimizer's variables are sharded over devices of
    several processes (multi-host `ModelParallel` on JAX). Keras cannot save such a model as it
    is: its saving converts each variable to one NumPy array, and JAX refuses that for an array
    with shards on other hosts."""
    optimizer = getattr(model, "optimizer", None)
    variables = list(model.variables) + (list(optimizer.variables) if optimizer is not None else [])
    return any(not getattr(v.value, "is_fully_addressable", True) for v in variables)


def host_copy(model):
    """An unsharded copy of `model`, with its optimizer state, in this process' memory.

    A collective under multi-host JAX: every process must call it, in the same order. Each
    sharded variable is gathered whole (`jax.experimental.multihost_utils.process_allgather`),
    then a new model is built from `model.get_config()` with no distribution active, so that
    its variables are plain local arrays, and compiled from `model.get_compile_config()`. The
    whole model must fit in one host's memory; beyond that, an Orbax checkpoint that writes
    each process' shards is the tool (`training.train --checkpoint-format orbax`, the default
    of multi-process JAX runs; docs/distributed.md).
    """
    values = [host_value(v) for v in model.variables]
    optimizer = getattr(model, "optimizer", None)
    optimizer_values = ([host_value(v) for v in optimizer.variables]
                        if optimizer is not None and optimizer.built else None)
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        copy = type(model).from_config(model.get_config())
        compile_config = model.get_compile_config()
        if compile_config is not None:
            copy.compile_from_config(compile_config)
        _assign_all(copy.variables, values, "model")
        if optimizer_values is not None:
            if not copy.optimizer.built:
                copy.optimizer.build(copy.trainable_variables)
            _assign_all(copy.optimizer.variables, optimizer_values, "optimizer")
    finally:
        keras.distribution.set_distribution(previous)
    return copy


def host_value(variable):
    """`variable`'s whole value as a NumPy array, gathered from every process when it is sharded
    over devices of several processes (then a collective); a plain conversion otherwise."""
    value = variable.value
    if getattr(value, "is_fully_addressable", True):
        return keras.ops.convert_to_numpy(value)
    from jax.experimental import multihost_utils  # only JAX arrays span processes

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def _assign_all(variables, values, what):
    shapes = [tuple(v.shape) for v in variables], [tuple(x.shape) for x in values]
    if shapes[0] != shapes[1]:
        raise RuntimeError(f"the {what} rebuilt from its config has variables of shapes {shapes[0]}, not {shapes[1]}")
    for variable, value in zip(variables, values):
        variable.assign(value)


class ModelParallel(keras.distribution.ModelParallel):
    """Keras' `ModelParallel` with `RULES` on `mesh` (axes ("batch", "model")), checked as the
    variables appear.

    A model built inside the distribution's scope (as `model.fit` scripts and the training CLI do)
    cannot be checked in advance as `layout_map(model, mesh)` does; this checks each variable's
    divisibility when Keras places it, and `check_all_rules_matched` (at the end of the scope)
    that every rule matched a variable, so that none replicates silently.
    """

    def __init__(self, mesh):
        super().__init__(layout_map=rules_layout_map(mesh), batch_dim_name="batch", auto_shard_dataset=False)
        self._matched = set()

    def get_variable_layout(self, variable):
        self._matched.add(check_variable(variable.path, variable.shape, self.device_mesh))
        return super().get_variable_layout(variable)

    def check_all_rules_matched(self):
        """Raises ValueError when a rule of `RULES` (other than `OPTIONAL_RULES`) matched no variable."""
        unmatched = [p for p in RULES if p not in OPTIONAL_RULES and p not in self._matched]
        if self._matched and unmatched:
            raise ValueError(f"model_parallel: layout rules {unmatched} matched no variable; "
                             "they would replicate silently")

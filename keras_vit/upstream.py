"""Every private part of Keras and Orbax that keras_vit and its training code rely on, in one list.

Each entry names the attribute, who uses it and why no public API does the same. `changes()` checks
them all against the installed versions (`tests/meta/test_upstream.py`), so that an upstream rename
fails one test that names it, not a training run hours later. A use of a private attribute
anywhere else in the project is a bug: add it here first.

    MultiHeadAttention settings  keras_vit.layers.Attention reads `_output_shape`, `_use_gate`,
                                 `_sliding_window` and `_use_bias`: Keras keeps them only there,
                                 and the fused path must know them to compute what Keras would.
    MultiHeadAttention methods   Attention overrides `_compute_attention` (QK-norm; Keras documents
                                 it for overriding), `_make_output_dense` (the output bias) and
                                 `_masked_softmax` (class relevance's probability offset).
    NAMES                        the other private modules, functions and attributes.
    serialize                    Keras' serialize_keras_object without its import of TensorFlow.
"""

import importlib
import inspect
import sys
import tempfile

# keras.layers.MultiHeadAttention(**KERAS_PROBE) and the value each private setting has in it.
KERAS_PROBE = dict(num_heads=2, key_dim=4, use_bias=False, output_shape=8, use_gate=True, sliding_window=3)
MHA_ATTRIBUTES = {"_output_shape": (8,), "_use_gate": True, "_sliding_window": 3, "_use_bias": False}
# The MultiHeadAttention methods that keras_vit.layers.Attention overrides, with their leading parameters.
MHA_METHODS = {
    "_compute_attention": ("self", "query", "key", "value", "attention_mask", "training", "return_attention_scores"),
    "_make_output_dense": ("self", "query_shape", "common_kwargs", "name"),
    "_masked_softmax": ("self", "attention_scores", "attention_mask"),
}

# (owner, attribute, parameters or None, who uses it and why). The owner is a module path,
# or a module path and a class name joined by ":"; an attribute that a class sets in its __init__
# is checked on an instance (see `_instance`). A function or method must take the parameters given,
# in that order (others may come between them).
NAMES = (
    ("keras.src.backend.common.global_state", "get_global_attribute", ("name",),
     "keras_vit.models.resize: drops shape-only variables from the list that a stateless scope "
     "initializes when it ends (Keras has no public way to build a model without allocating it)"),
    ("keras.callbacks:ModelCheckpoint", "_save_model", ("self", "epoch", "batch", "logs"),
     "training.checkpointing.AtomicModelCheckpoint: the one hook of a save, overridden to write "
     "model.partial.keras and rename it into place"),
    ("keras.callbacks:ModelCheckpoint", "_is_improvement", ("self", "monitor_value", "reference_value"),
     "training.best_epoch.KeepBest: whether an epoch is saved, overridden to break a tie on the monitored "
     "metric by val_loss (Keras counts a tie as no improvement and passes only the monitored value)"),
    ("keras.callbacks:OrbaxCheckpoint", "_is_improvement", ("self", "monitor_value", "reference_value"),
     "training.best_epoch.KeepBest: the same rule for the Orbax best-model checkpoint"),
    ("keras:Model", "_initial_epoch", None,
     "training.checkpointing.OrbaxBackup: the epoch that fit() starts at after a restore, set as "
     "Keras' own BackupAndRestore sets it"),
    ("keras.callbacks:OrbaxCheckpoint", "checkpointer", None,
     "training.checkpointing.OrbaxBackup: the newest committed step of the callback's own Orbax "
     "checkpointer"),
    ("orbax.checkpoint._src.serialization.tensorstore_utils", "build_zarr_shard_and_chunk_metadata",
     ("global_shape", "shard_shape", "use_zarr3"),
     "training.checkpoint_files.add_chunk_checksums: wrapped to add zarr v3's crc32c codec to every "
     "chunk (Orbax has no option for the chunk codecs)"),
    ("keras.src.backend.common.symbolic_scope", "in_symbolic_scope", (),
     "keras_vit.naflex.concrete: a call that Keras makes only to infer shapes (on torch, with placeholder "
     "tensors of ones) must not have its values checked; Keras has no public way to tell"),
    ("keras.src.saving.serialization_lib", "tf", None,
     "keras_vit.upstream.serialize: Keras' lazy handle on TensorFlow, marked unavailable while a "
     "config is serialized in a process that has not imported TensorFlow"),
)


def serialize(obj):
    """`keras.saving.serialize_keras_object(obj)`, without importing TensorFlow.

    Keras' function first asks whether `obj` is a `tf.TensorShape`, which imports TensorFlow
    wherever it is installed, on every backend. In a JAX process that has imported TensorFlow,
    importing torch afterwards (transformers loading a checkpoint that was just saved) dies with a
    segmentation fault. No object can be a TensorShape while TensorFlow is not imported, so the
    question is answered "no" for the call instead; once TensorFlow is loaded, Keras asks it as usual.
    """
    import keras
    from keras.src.saving import serialization_lib

    handle = serialization_lib.tf
    if "tensorflow" in sys.modules or handle._available is not None:
        return keras.saving.serialize_keras_object(obj)
    handle._available = False
    try:
        return keras.saving.serialize_keras_object(obj)
    finally:
        handle._available = None


def resolve(owner):
    """The module or class that `owner` (a NAMES entry's first field) names; raises ImportError or
    AttributeError when the installed version has no such thing."""
    module, _, cls = owner.partition(":")
    found = importlib.import_module(module)
    return getattr(found, cls) if cls else found


def changes():
    """What the installed Keras and Orbax no longer have of the private parts listed in this module,
    as one message per change, naming the attribute and its user; empty when all is as expected."""
    import keras

    found = _attention_changes(keras)
    for owner, name, expected, user in NAMES:
        where = f"{owner.replace(':', '.')}.{name}"
        try:
            target = resolve(owner)
            if inspect.isclass(target) and not hasattr(target, name):
                target = _instance(keras, target)
            value = getattr(target, name)
        except (ImportError, AttributeError) as error:
            found.append(f"{where} is gone ({type(error).__name__}: {error}); {user}")
            continue
        if expected is not None:
            params = tuple(inspect.signature(value).parameters)
            rest = iter(params)
            if not all(param in rest for param in expected):  # a subsequence, in order
                found.append(f"{where} takes {params}, where {expected} is expected; {user}")
    return found


def _attention_changes(keras):
    mha = keras.layers.MultiHeadAttention
    try:
        probe = mha(**KERAS_PROBE)
    except (TypeError, ValueError) as e:
        return [f"keras {keras.__version__}: MultiHeadAttention(**{KERAS_PROBE}) fails: {e}"]
    found = [f"keras {keras.__version__}: MultiHeadAttention(**{KERAS_PROBE}).{name} is "
             f"{getattr(probe, name, 'missing')!r}, where keras_vit.layers.Attention expects {value!r}"
             for name, value in MHA_ATTRIBUTES.items() if getattr(probe, name, None) != value]
    for name, leading in MHA_METHODS.items():
        params = tuple(inspect.signature(getattr(mha, name)).parameters) if hasattr(mha, name) else ()
        if params[: len(leading)] != leading:
            found.append(f"keras {keras.__version__}: MultiHeadAttention.{name} takes {params or 'nothing'}; "
                         f"keras_vit.layers.Attention overrides it as {leading}")
    return found


def _instance(keras, cls):
    """An instance of `cls`, to read the attributes that its __init__ sets."""
    if issubclass(cls, keras.Model):
        return keras.Sequential()
    if issubclass(cls, keras.callbacks.OrbaxCheckpoint):
        with tempfile.TemporaryDirectory() as directory:
            return cls(directory)
    raise AttributeError(f"{cls.__name__} has no class attribute to check, and no instance is made for it here")

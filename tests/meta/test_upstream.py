"""keras_vit.upstream: the one list of the private Keras and Orbax parts that the project uses."""

import re

import keras
import pytest
from tests import ROOT
from tests.conftest import images

from keras_vit import layers, upstream

SOURCES = [p for folder in ("keras_vit", "commands", "training", "apps", "benchmarks", "experiments", "scripts")
           for p in (ROOT / folder).rglob("*.py")]


def test_the_private_keras_and_orbax_parts_the_project_uses_are_unchanged():
    changes = upstream.changes()
    assert not changes, "\n".join(changes)


def test_every_private_module_the_project_imports_is_listed():
    listed = {owner.partition(":")[0] for owner, *_ in upstream.NAMES}
    imported = {}
    for path in SOURCES:
        for module, name in re.findall(r"^\s*from ((?:keras|orbax|jax)\S*\._src\S*|keras\.src\S*) import (\w+)",
                                       path.read_text(), re.MULTILINE):
            imported.setdefault(f"{module}.{name}", path.relative_to(ROOT))
    assert imported, "the scan found no private import at all: its pattern is wrong"
    unlisted = {module: str(path) for module, path in imported.items() if module not in listed}
    assert not unlisted, f"private modules imported but not listed in keras_vit.upstream.NAMES: {unlisted}"


def test_every_listed_attribute_is_used_where_the_list_says():
    for owner, name, _, user in upstream.NAMES:
        module = user.split(":")[0].split(".")
        path = ROOT.joinpath(*module[:-1], module[-1] + ".py")
        if not path.exists():  # the user is a class in a module: keras_vit.x.Class
            path = ROOT.joinpath(*module[:-2], module[-2] + ".py")
        assert name in path.read_text(), f"{owner}.{name}: listed as used by {user}, but {path.name} does not use it"


def test_a_private_attribute_that_is_gone_is_named(monkeypatch):
    monkeypatch.delattr(keras.callbacks.ModelCheckpoint, "_save_model")
    changes = upstream.changes()
    assert len(changes) == 1
    assert changes[0].startswith("keras.callbacks.ModelCheckpoint._save_model is gone")
    assert "AtomicModelCheckpoint" in changes[0]


def test_a_changed_signature_is_named(monkeypatch):
    # As if a Keras release had renamed a parameter: the list expects one that is not there.
    (entry,) = [e for e in upstream.NAMES if e[1] == "get_global_attribute"]
    monkeypatch.setattr(upstream, "NAMES", ((*entry[:2], ("key",), entry[3]),))
    (change,) = upstream.changes()
    assert "get_global_attribute takes ('name', 'default', 'set_to_default'), where ('key',) is expected" in change
    assert "keras_vit.models.resize" in change


def test_a_changed_attention_setting_is_named(monkeypatch):
    original = keras.layers.MultiHeadAttention.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        del self._use_gate  # as if a Keras release had renamed it

    monkeypatch.setattr(keras.layers.MultiHeadAttention, "__init__", init)
    (change,) = upstream.changes()
    assert "._use_gate is 'missing', where keras_vit.layers.Attention expects True" in change


def test_a_private_keras_attribute_that_is_gone_is_named_when_attention_runs():
    attn = layers.Attention(num_heads=3, key_dim=4)
    x = keras.ops.convert_to_tensor(images((2, 5, 12)))
    attn.build(x.shape, x.shape)
    del attn._use_gate  # as if a Keras release had renamed it
    with pytest.raises(AttributeError, match=r"MultiHeadAttention has no attribute '_use_gate'.*upstream\.changes"):
        attn(x, x)


@pytest.mark.parametrize("obj", ["float32", "bfloat16", "int8_from_float32", "float8_from_float32", "glorot_uniform",
                                 "zeros", keras.initializers.TruncatedNormal(stddev=0.02, seed=3)])
def test_serialize_gives_what_keras_gives(obj):
    if isinstance(obj, str):
        obj = keras.dtype_policies.get(obj) if "float" in obj else keras.initializers.get(obj)
    assert upstream.serialize(obj) == keras.saving.serialize_keras_object(obj)

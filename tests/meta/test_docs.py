"""The README and the docs pages against the code: length, the API table, docstrings, no machine paths.

The pages' examples run in tests/meta/test_readme.py, tests/checkpoints/test_checkpoints_docs.py
and tests/model/test_variants_docs.py;
`mkdocs build --strict` (run by scripts/test) fails on a broken link or reference.
"""

import importlib
import inspect
import pathlib
import re

import pytest

import keras_vit
from tests import ROOT

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once

README = (ROOT / "README.md").read_text()
API_PAGES = "\n".join(p.read_text() for p in sorted((ROOT / "docs" / "api").glob("*.md")))
# Modules whose public functions the API reference shows besides keras_vit.__all__ and layers.__all__.
DOCUMENTED_MODULES = ("keras_vit.serving", "keras_vit.artifacts", "keras_vit.io.images", "keras_vit.ood.scores",
                      "keras_vit.ood.features", "keras_vit.ood.stats_file")


def _resolve(dotted):
    """keras_vit.serving.load -> the function; keras_vit.layers -> the module."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


def _public_entries():
    """(name, object) of every public API entry: keras_vit.__all__, keras_vit.layers.__all__ and
    the public functions of DOCUMENTED_MODULES."""
    entries = [(f"keras_vit.{n}", getattr(keras_vit, n)) for n in keras_vit.__all__]
    entries += [(f"keras_vit.layers.{n}", getattr(keras_vit.layers, n)) for n in keras_vit.layers.__all__]
    for module_name in DOCUMENTED_MODULES:
        module = importlib.import_module(module_name)
        entries += [(f"{module_name}.{n}", f) for n, f in vars(module).items()
                    if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == module_name]
    return [(n, o) for n, o in entries if inspect.isclass(o) or inspect.isfunction(o) or inspect.ismodule(o)]


def test_readme_is_a_front_page_of_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_the_readme_api_table_names_each_entry_and_its_source_file():
    table = README.split("<!-- api -->")[1].split("<!-- /api -->")[0].strip().splitlines()[2:]
    rows = [re.findall(r"`([^`]+)`", line)[:2] for line in table]
    assert len(rows) >= 15
    for entry, source in rows:
        obj = _resolve(entry)
        path = inspect.getsourcefile(obj)
        assert pathlib.Path(path).resolve() == (ROOT / source).resolve(), f"{entry} is defined in {path}, not {source}"


@pytest.mark.parametrize("name,obj", _public_entries(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_public_entry_has_a_docstring(name, obj):
    assert (inspect.getdoc(obj) or "").strip(), f"{name} has no docstring"
    if inspect.isclass(obj):  # its own public methods, not those inherited from Keras
        for attr, member in vars(obj).items():
            function = getattr(member, "__func__", member)
            if not attr.startswith("_") and inspect.isfunction(function) and not _overrides_keras(obj, attr):
                assert (function.__doc__ or "").strip(), f"{name}.{attr} has no docstring"


def _overrides_keras(cls, attr):
    """Whether `attr` overrides a method of a Keras base class (call, build, get_config, ...),
    whose docstring Keras documents."""
    return any(attr in vars(base) for base in cls.__mro__[1:] if base.__module__.startswith("keras."))


def test_the_api_reference_shows_every_entry_of_keras_vit_all():
    shown = set(re.findall(r"^::: (keras_vit\.[\w.]+)", API_PAGES, flags=re.M))
    missing = [n for n in keras_vit.__all__ if f"keras_vit.{n}" not in shown]
    assert not missing, f"docs/api/*.md does not show {missing}"


MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|tmp|home|root)/")


def _repo_texts():
    """README, docs pages, mkdocs.yml and the benchmarks' and experiments' results: the repository's
    published text."""
    yield ROOT / "README.md"
    yield ROOT / "mkdocs.yml"
    yield from sorted((ROOT / "docs").rglob("*.md"))
    for suffix in ("md", "json"):
        yield from sorted((ROOT / "benchmarks" / "results").rglob(f"*.{suffix}"))
        yield from sorted((ROOT / "experiments" / "results").rglob(f"*.{suffix}"))


def test_published_text_names_no_machine_paths():
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in _repo_texts() for m in MACHINE_PATH.finditer(p.read_text())]
    assert not hits, hits

"""pyproject.toml's requirements: each has a lower bound (the version the tests ran on, see the comment
there) or a pin, and the packages installed for the tests satisfy them."""

import importlib.metadata
import tomllib

from packaging.requirements import Requirement
import pytest

from tests import ROOT

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements():
    """Every requirement of the project and its extras, except the extras' references to each other."""
    listed = PROJECT["dependencies"] + [r for extra in PROJECT["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in listed if Requirement(r).name != PROJECT["name"]]


def test_every_requirement_has_a_lower_bound():
    unbounded = [str(r) for r in requirements() if not any(s.operator in (">=", "==") for s in r.specifier)]
    assert not unbounded, f"requirements without a tested lower bound: {unbounded}"


def test_the_installed_packages_satisfy_the_requirements():
    wrong = {}
    for r in requirements():
        try:
            installed = importlib.metadata.version(r.name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed is None or not r.specifier.contains(installed, prereleases=True):
            wrong[str(r)] = installed
    assert not wrong, f"installed versions outside pyproject.toml's requirements: {wrong}"

"""The wheel: `pip wheel .` packs the `keras_vit` library only, so installing it puts no `commands`,
`training`, `apps`, `benchmarks` or `experiments` package into site-packages, and no console script."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from tests import ROOT

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once

# Everything that setuptools could pick up as a package, copied so the build leaves the checkout clean.
SOURCES = ("pyproject.toml", "README.md", "keras_vit", "commands", "training", "apps", "benchmarks", "experiments",
           "scripts")


def build_wheel(tmp_path):
    src = tmp_path / "src"
    for name in SOURCES:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(path, src / name)
    # --no-build-isolation: the setuptools already installed builds it, with no download.
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
           "-w", str(tmp_path / "dist")]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    return wheel


def test_the_wheel_holds_only_keras_vit(tmp_path):
    with zipfile.ZipFile(build_wheel(tmp_path)) as zf:
        names = zf.namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"keras_vit"}, sorted(tops)
    assert "keras_vit/data/imagenet_classes.txt" in names  # package data still ships
    assert "keras_vit/hub/hf.py" in names and "keras_vit/io/npz.py" in names  # subpackages too
    assert not [n for n in names if n.endswith("entry_points.txt")], "the wheel installs a console script"

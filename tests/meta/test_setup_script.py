"""scripts/setup-tests without root: it stops before installing anything and prints the command."""

import os
import subprocess

import pytest
from tests import ROOT

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once



def fake_command(folder, name, body):
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_setup_tests_prints_the_apt_command_when_not_root(tmp_path):
    fake_command(tmp_path, "id", "echo 1000")
    fake_command(tmp_path, "dpkg-query", 'case "$*" in *chromium*) printf "install ok installed";; *) exit 1;; esac')
    fake_command(tmp_path, "pip", "echo pip ran; exit 1")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    out = subprocess.run(["scripts/setup-tests"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "pip ran" not in out.stdout
    assert "sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist libtcmalloc-minimal4" in out.stderr

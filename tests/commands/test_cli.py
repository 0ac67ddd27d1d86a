"""The library settings of keras_vit's own processes (commands/cli.py `LIBRARY_ENV`)."""

import os
import subprocess
import sys

import pytest

from commands import cli
from tests import ROOT

pytestmark = pytest.mark.one_backend  # the settings of processes that this test's own process starts

# Whether TensorFlow's oneDNN kernels are on, in a process that loads TensorFlow as the tools do.
ONEDNN_STATE = ("import os; from commands import cli; cli.import_tensorflow(); "
                "from tensorflow.python.util import _pywrap_util_port; "
                "print(os.environ['TF_ENABLE_ONEDNN_OPTS'], _pywrap_util_port.IsMklEnabled())")


def test_the_defaults_fill_in_what_is_unset_and_keep_what_the_user_set():
    assert cli.library_defaults({}) == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    given = {"TF_ENABLE_ONEDNN_OPTS": "0", "OTHER": "x"}
    assert cli.library_defaults(dict(given)) == given


@pytest.mark.parametrize("given, on", [(None, ["1", "True"]), ("0", ["0", "False"])])
def test_a_tool_loads_tensorflow_with_its_onednn_kernels_on_unless_the_user_said_no(given, on):
    # On by TensorFlow's own choice only on a CPU with VNNI, AVX-512 bf16 or AMX; the tools turn
    # it on everywhere, and a user's TF_ENABLE_ONEDNN_OPTS=0 still wins.
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if given is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = given
    out = subprocess.run([sys.executable, "-c", ONEDNN_STATE], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.split()[-2:] == on

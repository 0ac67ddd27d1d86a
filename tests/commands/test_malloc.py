"""The allocator choice of training and benchmark processes (commands/malloc.py).

.ci/run installs tcmalloc (Debian's libtcmalloc-minimal4); these tests need it.
"""

import os
import subprocess
import sys

import pytest

from commands import malloc
from tests import ROOT


# Allocates and frees a 256 MB block 5 times in a thread (as XLA's workers do), then prints the
# minor page faults of the last 4 rounds and the allocator in use.
FAULTS = """
import ctypes, resource, threading
from commands import malloc
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []
def rounds():
    for i in range(5):
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        p = libc.malloc(256 << 20)
        ctypes.memset(p, 1, 256 << 20)  # touch every page
        libc.free(p)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
t = threading.Thread(target=rounds); t.start(); t.join()
print(malloc.in_use(), sum(faults[1:]))
"""


def run_python(code, env):
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.split()


def test_an_unknown_choice_names_itself_and_the_choices():
    with pytest.raises(ValueError, match=r"malloc='jemalloc'.*auto, tcmalloc, system"):
        malloc.resolve("jemalloc")


def test_insisting_on_a_missing_tcmalloc_names_the_package(monkeypatch):
    monkeypatch.setattr(malloc, "find_tcmalloc", lambda: None)
    with pytest.raises(RuntimeError, match="libtcmalloc-minimal4"):
        malloc.resolve("tcmalloc")
    assert malloc.resolve("auto") == ("system", None)


def test_environ_adds_or_removes_only_tcmalloc():
    path = malloc.find_tcmalloc()
    assert path, "tcmalloc is not installed: apt-get install libtcmalloc-minimal4 (.ci/run does)"
    env = malloc.environ("tcmalloc", {"LD_PRELOAD": "/opt/other.so"})
    assert env["LD_PRELOAD"] == f"{path} /opt/other.so"
    assert malloc.environ("system", env)["LD_PRELOAD"] == "/opt/other.so"
    assert "LD_PRELOAD" not in malloc.environ("system", {"LD_PRELOAD": path})


def test_tcmalloc_keeps_a_freed_large_block_where_glibc_faults_it_back_in():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    system = run_python(FAULTS, malloc.environ("system", env))
    tc = run_python(FAULTS, malloc.environ("tcmalloc", env))
    pages = 4 * (256 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert system[0] == "system" and int(system[1]) > 0.9 * pages  # every round faults it all again
    assert tc[0] == "tcmalloc" and int(tc[1]) < 0.1 * pages


@pytest.mark.parametrize("start, choice", [("system", "tcmalloc"), ("tcmalloc", "system"), ("system", "auto")])
def test_reexec_restarts_the_process_with_the_chosen_allocator(start, choice):
    env = malloc.environ(start, {**os.environ, "PYTHONPATH": str(ROOT)})
    code = f"from commands import malloc; malloc.reexec({choice!r}); print(malloc.in_use())"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == [choice if choice != "auto" else "tcmalloc"]
    assert ("restarting" in out.stderr) == (start != (choice if choice != "auto" else "tcmalloc"))

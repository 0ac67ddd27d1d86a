"""The memory allocator of a training or benchmark process: tcmalloc or the system's malloc.

Why this module exists: on a CPU, XLA (jaxlib 0.10) allocates the scratch buffer of each compiled
step with `posix_memalign` from one of its worker threads. For the benchmark's small ViT
train step (batch 128) that buffer is 1.4 GB. glibc serves a block that large from a thread arena
with a fresh `mmap` and returns it with `munmap`, so every step faults the whole 1.4 GB back in:
about 375,000 minor page faults and 0.7-0.9 s of kernel time in a 1.6-1.9 s step. glibc's tunables
cannot change that (with `mmap_threshold`, `mmap_max=0` or `trim_threshold` set, a thread
arena still maps any block over 64 MB afresh), and jemalloc's defaults still fault. tcmalloc keeps freed
spans and hands them out again: no faults, and the step takes 1.34 s. The numbers and commands are in
docs/performance.md.

An allocator can only be chosen before a process starts (`LD_PRELOAD`), so `python -m
training.train` re-executes itself once with it, and `benchmarks.run` starts every worker with it.
`--malloc auto` (the default) takes tcmalloc where it is installed and says so; `tcmalloc` insists
on it; `system` keeps glibc's malloc.

Known conflict (tensorflow 2.21, torch 2.14.1): under tcmalloc, loading triton (torchvision and
torch.compile import it) after TensorFlow aborts with "src/tcmalloc.cc:333] Attempt to free invalid
pointer"; the other order works. The CLIs here never load both.
"""

import os
import subprocess
import sys

CHOICES = ("auto", "tcmalloc", "system")
PACKAGE = "libtcmalloc-minimal4"  # Debian and Ubuntu; Fedora: gperftools-libs
_LIBRARY = "libtcmalloc_minimal.so.4"
_REEXEC_MARK = "KERAS_VIT_MALLOC_REEXEC"  # set in the re-executed process, so it never loops


def add_argument(parser, whose="the process's"):
    """Adds `--malloc auto|tcmalloc|system` to an argparse parser."""
    parser.add_argument("--malloc", default="auto", choices=CHOICES,
                        help=f"{whose} memory allocator: tcmalloc where installed (auto), or the system's; "
                             "see commands/malloc.py")


def find_tcmalloc():
    """Path of tcmalloc's shared library from the loader's cache (`ldconfig -p`), or None."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:  # no ldconfig: not a glibc Linux system
        return None
    for line in listing.splitlines():
        name, _, path = line.partition("=>")
        if name.split()[:1] == [_LIBRARY] and os.path.exists(path.strip()):
            return path.strip()
    return None


def in_use():
    """'tcmalloc' when tcmalloc is loaded into this process, else 'system'."""
    try:
        with open("/proc/self/maps") as f:
            return "tcmalloc" if "libtcmalloc" in f.read() else "system"
    except OSError:
        return "system"


def resolve(choice):
    """(allocator, library path or None) for `choice`, one of CHOICES."""
    if choice not in CHOICES:
        raise ValueError(f"malloc={choice!r} is not an allocator choice; use one of {', '.join(CHOICES)}")
    if choice == "system":
        return "system", None
    path = find_tcmalloc()
    if path is None and choice == "tcmalloc":
        raise RuntimeError(f"malloc='tcmalloc' but {_LIBRARY} is not installed; install it (apt-get install "
                           f"{PACKAGE}) or pass --malloc system (or auto) to keep the system's malloc")
    return ("tcmalloc", path) if path else ("system", None)


def environ(choice, env=None):
    """A copy of `env` (default os.environ) whose LD_PRELOAD gives a new process the allocator of `choice`."""
    env = dict(os.environ if env is None else env)
    allocator, path = resolve(choice)
    kept = [p for p in env.get("LD_PRELOAD", "").split() if "libtcmalloc" not in p]
    kept = [path, *kept] if allocator == "tcmalloc" else kept
    if kept:
        env["LD_PRELOAD"] = " ".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def reexec(choice, quiet=False):
    """Restarts this process with the allocator of `choice` when it is not already the one in use.

    Call it first thing in a command-line entry point, before anything starts threads or opens
    files that a restart would lose. Returns only when no restart is needed (or after one).
    `quiet` leaves out the notes on stderr (the demo prints one startup line only).
    """
    restarted = os.environ.pop(_REEXEC_MARK, None)  # popped: this process's children start afresh
    allocator, path = resolve(choice)
    if choice == "auto" and allocator == "system" and not quiet:
        print(f"malloc: the system's malloc ({_LIBRARY} not found; install {PACKAGE} for faster JAX steps "
              "on a CPU, see commands/malloc.py)", file=sys.stderr)
    if allocator == in_use():
        return
    if restarted:
        raise RuntimeError(f"restarted with LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r} for {allocator}, "
                           f"but the process runs {in_use()}'s malloc; check {path} or pass --malloc system")
    if not quiet:
        print(f"malloc: restarting with {allocator}", file=sys.stderr, flush=True)
    env = dict(environ(choice), **{_REEXEC_MARK: "1"})
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)

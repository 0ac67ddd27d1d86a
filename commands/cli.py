"""What every command-line tool here shares: help text that shows defaults, library log noise
turned off before the libraries load, and one-line errors.

No heavy imports: the tools call `quiet_logs` before TensorFlow, JAX or Keras is imported, because
those read their logging settings from the environment once, at import.
"""

import argparse
import contextlib
import errno
import logging
import os
import re
import sys

# Environment settings that silence the C++ and absl logs of TensorFlow, XLA and gRPC (oneDNN
# notes, cuInit errors on machines without a GPU, "Unable to register cuDNN factory" lines).
QUIET_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TF_ENABLE_ONEDNN_OPTS_LOG": "0",
    "GRPC_VERBOSITY": "ERROR",
    "GLOG_minloglevel": "3",
    "ABSL_MIN_LOG_LEVEL": "3",
}


# What keras_vit's own processes ask of the libraries, through the environment, before those load:
# the tools that load TensorFlow through `import_tensorflow` (the training CLI, the demo, the
# evaluation and export tools) and the benchmark workers. `import keras_vit` sets none of it, so a
# user's own process keeps the libraries' choices (docs/performance.md says what to set there).
# TF_ENABLE_ONEDNN_OPTS=1: on Linux, TensorFlow 2.21 turns its oneDNN kernels on by itself only on a
# CPU with VNNI, AVX-512 bf16 or AMX. On an AVX2-only CPU (AMD EPYC Zen 3) its own executor, which
# Keras' jit_compile="auto" picks on a CPU, otherwise runs Eigen's kernels; docs/performance.md
# times both in one run (`python -m benchmarks.run --only "ViT-S/16 224 b16 fp32"`).
LIBRARY_ENV = {
    "TF_ENABLE_ONEDNN_OPTS": "1",
}


def library_defaults(environ=None):
    """Puts `LIBRARY_ENV` into `environ` (default os.environ), keeping any value already set there;
    returns `environ`. Call it before TensorFlow is imported: TensorFlow reads it once, at import."""
    environ = os.environ if environ is None else environ
    for key, value in LIBRARY_ENV.items():
        environ.setdefault(key, value)
    return environ


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default, and keeps the description's line breaks (its usage examples).
    A help text that already says "default:" (a default that depends on other flags) is kept as is."""

    def _get_help_string(self, action):
        if "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def parser(prog, description):
    """An ArgumentParser with `HelpFormatter`."""
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)


def quiet_logs(verbose=False):
    """Turns library log noise off (unless `verbose`) for this process and the ones it starts.
    Values the user set in the environment are kept."""
    if verbose:
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning, module="keras")
    # JAX's note that no CUDA jaxlib is installed, on a machine with an NVIDIA driver.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)
    # Orbax's notes on every save and load, through absl's logger (whose records all name absl's
    # own file, so they cannot be told apart by library) and the root logger; errors stay.
    logging.getLogger("absl").setLevel(logging.ERROR)
    logging.getLogger().addFilter(_below_error_from_orbax)


def _below_error_from_orbax(record):
    return record.levelno >= logging.ERROR or f"{os.sep}orbax{os.sep}" not in record.pathname


def import_tensorflow(verbose=False):
    """Imports TensorFlow, with its import-time log lines hidden unless `verbose`.

    TensorFlow 2.21 writes its oneDNN and CUDA notes to file descriptor 2 before absl's logging is
    initialized, so TF_CPP_MIN_LOG_LEVEL does not reach them; they are hidden by pointing the
    descriptor at /dev/null for the import only (later logs honour TF_CPP_MIN_LOG_LEVEL).
    `LIBRARY_ENV`'s settings are put into the environment first (a value already set is kept); they
    take effect when this import is TensorFlow's first.
    """
    if "tensorflow" not in sys.modules:
        library_defaults()
    _import_triton_first()
    if verbose or "tensorflow" in sys.modules:
        import tensorflow
        return tensorflow
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        import tensorflow
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
    return tensorflow


def _import_triton_first():
    """On the torch backend, imports triton (where installed) before TensorFlow: with TensorFlow 2.21
    and triton 3.8, `import tensorflow; import triton` ends in a segmentation fault in triton's
    extension module, while the other order loads both. Keras' torch backend imports torch._dynamo,
    which loads triton later, so a torch run of a tool that reads data through tf.data crashed."""
    if os.environ.get("KERAS_BACKEND") == "torch" and "tensorflow" not in sys.modules:
        import importlib.util

        if importlib.util.find_spec("triton") is not None:
            import triton  # noqa: F401


# The errors that the tools raise on purpose, for input they refuse: a bad flag value, a missing
# file or dataset, a checkpoint that could not be downloaded (keras_vit.DownloadError is a
# ConnectionError), a run that cannot go on. Anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, ConnectionError)


@contextlib.contextmanager
def one_line_errors(prog, errors=USER_ERRORS, status=2, writing_to=None):
    """Turns `errors` raised inside the block into one line on stderr and exit status `status`
    (2, as argparse uses for a bad flag). Set KERAS_VIT_TRACEBACK=1 to see the traceback instead.
    `writing_to` is the folder the block writes in, named when a full disk's error names no file."""
    try:
        yield
    except Exception as e:
        full = disk_full(e)
        if not (full or isinstance(e, errors)) or os.environ.get("KERAS_VIT_TRACEBACK"):
            raise
        text = " ".join(str(e).split())
        if full:  # the one fault that freeing space cures; what was saved before the failed save is kept
            text = full_disk_message(e, writing_to)
        print(f"{prog}: error: {text}", file=sys.stderr)
        sys.exit(status)


def full_disk_message(error, folder=None):
    """The line for a write that found no space left: the disk (its mount point) and the file.
    A write to an open file fails with an OSError that names no file: then `folder`, the folder
    being written in, is named instead."""
    path = getattr(error, "filename", None) if isinstance(error, OSError) else None
    if path is None:  # tensorstore names the file in its text: Failed writing: "PATH"
        found = re.search(r'Failed writing: "([^"]+)"', str(error)) or re.search(r'local file "([^"]+)"', str(error))
        path = found.group(1) if found else None
    if path is None and folder is not None:
        path = os.path.join(os.path.abspath(folder), "")  # "RUN/": a file in the run folder
    if path is None:
        return (f"no space left on the disk ({' '.join(str(error).split())[:300]}). The epochs saved before are "
                "kept: free space and run the same command to resume")
    mount = os.path.abspath(path)
    while not os.path.ismount(mount) and mount != os.path.dirname(mount):
        mount = os.path.dirname(mount)
    return (f"no space left on the disk mounted at {mount}, while writing {path}. The epochs saved before are "
            "kept: free space there and run the same command to resume")


def disk_full(error):
    """Whether `error` is a write that found no space left: an OSError with ENOSPC, or
    tensorstore's error (a ValueError, as Orbax raises it) that carries the same code."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    return isinstance(error, ValueError) and f"[os_error_code='{errno.ENOSPC}']" in str(error)

"""Write a single-file model from an Orbax checkpoint folder of a training run.

    python -m training.export_checkpoint runs/big --to model.keras         # the best epoch (runs/big/model)
    python -m training.export_checkpoint runs/big --backup --to last.keras  # the last epoch (runs/big/backup)
    python -m training.export_checkpoint runs/big/model --to model.safetensors   # timm's layout

A run with `--checkpoint-format orbax` keeps its best epoch in OUT/model and its last epochs in
OUT/backup, as shards written by every process. This reads the newest committed step into one
process (the weights only: the optimizer state stays on disk) and writes a `.keras` model or a
`.safetensors` state dict that timm's VisionTransformer loads (`keras_vit.save_checkpoint`).
Before reading any array it compares the memory the export needs with the memory this machine
has available and refuses, in one line that gives both and with exit status 3, when it would
not fit.
"""

import importlib.util
import os

from commands import cli
from training import checkpoint_files, runs

PROG = "python -m training.export_checkpoint"
SUFFIXES = (".keras", ".safetensors")
GIB = 1024**3
# Peak memory of an export, in multiples of the weights' bytes. The model built from its config
# holds initial values (1x) until the arrays read from the checkpoint (1x) replace them, and the
# writer converts every weight once more (1x for .keras, 2x for .safetensors); with glibc's malloc
# and the libraries' fixed costs, `python -m benchmarks.studies.save_memory` measured 5.18x (.keras) and
# 5.73x (.safetensors) for 163 MiB of weights. The factor keeps a margin above both.
MEMORY_FACTOR = 7
TOO_BIG = checkpoint_files.EXPORT_TOO_BIG  # the exit status of a refusal for memory


def checkpoint_folder(path, backup=False):
    """The Orbax checkpoint folder that `path` names: `path` itself, or for a run folder (one with
    recipe.json) its `model` folder (the best epoch), or `backup` (the last epochs) with `backup`.
    FileNotFoundError or ValueError, naming what is there, for anything else."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a folder; give a run folder (--out of an --checkpoint-format orbax "
                                "run) or one of its Orbax checkpoint folders, RUN/model or RUN/backup")
    if not os.path.isfile(os.path.join(path, runs.RECIPE)):
        if backup:
            raise ValueError(f"--backup takes a run folder (one with {runs.RECIPE}); {path} is not one")
        return path
    name = "backup" if backup else "model"
    folder = os.path.join(path, name)
    if not os.path.isdir(folder):
        stored = runs.read_recipe(path) or {}
        if stored.get("checkpoint_format", "keras") != "orbax":
            raise ValueError(f"{path} is a run with --checkpoint-format keras: its model.keras is already one file "
                             "(keras_vit.save_checkpoint converts it to other formats)")
        raise FileNotFoundError(f"{path} holds no {name} folder yet: the run finished no epoch")
    return folder


def check_arguments(checkpoint, to):
    """ValueError or FileNotFoundError for a bad checkpoint folder or target, before any import."""
    if not os.path.isdir(checkpoint):
        raise FileNotFoundError(f"{checkpoint} is not a folder; give the Orbax checkpoint folder of a run, "
                                "e.g. runs/NAME/model or runs/NAME/backup")
    if not str(to).endswith(SUFFIXES):
        raise ValueError(f"--to={to!r} is not allowed; use a path ending in {' or '.join(SUFFIXES)}")
    parent = os.path.dirname(os.path.abspath(to))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"--to={to!r}: the folder {parent} does not exist")


def available_bytes():
    """Memory this machine can give a new allocation now without swapping (psutil's "available")."""
    import psutil

    return psutil.virtual_memory().available


def needed_bytes(step_dir):
    """(bytes the export needs, bytes of the weights) for an Orbax step, from its metadata only."""
    import numpy as np

    from training import checkpointing

    weights = sum(int(np.prod(meta.shape)) * np.dtype(meta.dtype).itemsize
                  for path, meta in checkpointing.saved_arrays(step_dir).items()
                  if path.split("/")[0] in ("trainable_variables", "non_trainable_variables"))
    return MEMORY_FACTOR * weights, weights


def export(checkpoint, to, max_memory=None):
    """Writes the model of the newest step of `checkpoint` to `to` (.keras or .safetensors).

    Raises MemoryError, before reading any array, when the export needs more than `max_memory`
    bytes (default: the memory available now)."""
    check_arguments(checkpoint, to)
    import keras_vit
    from training import checkpointing

    step_dir = checkpointing.latest_step(checkpoint)
    needed, weights = needed_bytes(step_dir)
    available = available_bytes() if max_memory is None else max_memory
    if needed > available:
        raise MemoryError(f"{checkpoint}: writing one file needs about {_gib(needed)} in one process "
                          f"({MEMORY_FACTOR} x {_gib(weights)} of weights); {_gib(available)} is available. Run "
                          "this on a host with more memory; the sharded checkpoint itself resumes and restores "
                          "on any topology")
    model = checkpointing.load_model(checkpoint, compile=False)
    if str(to).endswith(".keras"):
        model.save(to)
    else:
        keras_vit.save_checkpoint(model, to)
    return step_dir


def _gib(size):
    return f"{size / GIB:.3g} GiB"


def main(argv=None):
    parser = cli.parser(PROG, __doc__)
    parser.add_argument("checkpoint",
                        help="the folder of an --checkpoint-format orbax run (its best epoch, OUT/model), "
                        "or one of its Orbax checkpoint folders (OUT/model or OUT/backup)")
    parser.add_argument("--backup", action="store_true", help="of a run folder, export the last epoch (OUT/backup) "
                        "instead of the best")
    parser.add_argument("--to", required=True, metavar="PATH", help="the file to write: NAME.keras or NAME.safetensors")
    parser.add_argument("--max-memory", type=float, default=None, metavar="GIB",
                        help="refuse when the export needs more than this many GiB (default: the memory "
                        "available now)")
    parser.add_argument("--verbose", action="store_true", help="show the libraries' logs")
    args = parser.parse_args(argv)
    with cli.one_line_errors(PROG, (MemoryError,), status=TOO_BIG), cli.one_line_errors(PROG):
        folder = checkpoint_folder(args.checkpoint, args.backup)
        check_arguments(folder, args.to)
        # Orbax reads into JAX arrays; the files it writes load on every backend.
        os.environ["KERAS_BACKEND"] = "jax"
        cli.quiet_logs(args.verbose)
        if args.to.endswith(".keras") and importlib.util.find_spec("tensorflow"):
            cli.import_tensorflow(args.verbose)  # Keras' .keras writer imports it; hide its import notes
        limit = None if args.max_memory is None else int(args.max_memory * GIB)
        step_dir = export(folder, args.to, limit)
    print(f"wrote {args.to} from {step_dir}")


if __name__ == "__main__":
    main()

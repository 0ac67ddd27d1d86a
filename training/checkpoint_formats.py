"""Where a training run keeps its checkpoints: one object per `--checkpoint-format`.

Each object owns the files it writes into the run folder (`files`), makes the callbacks that write
them (`callbacks`: the best epoch, and the backup that the same command resumes from), reads the
best epoch back after training (`load_best`) and writes what is left once the reports are done
(`finish`). `training.loop` drives whichever the run uses, and `training.runs` removes exactly the
formats' `files` on `--overwrite` and on the undo of a failed start.

    keras   model.keras (the best epoch, replaced in one rename), backup/ (`BackupAndRestore`) and,
            for a LoRA run, lora.safetensors. Under multi-process JAX the non-chief processes write
            their copies outside the run folder (`training.distribute.Distribution.checkpoint_dir`).
    orbax   model/ (the best epoch) and backup/ (the last epochs), written as shards by every
            process (`training.checkpointing`); then model.keras when one process can hold the model.

This module imports no deep-learning library until a method runs, so that `training.runs` (and the
CLI's checks before Keras loads) can ask which files a run holds.
"""

import importlib.util
import os


class RunCheckpointFormat:
    """A format of a training run's checkpoints (what `--checkpoint-format` chooses); what the formats
    share: the run folder and its distribution.

    Args:
        out_dir: the run folder, seen by every process.
        dist: the run's `training.distribute.Distribution`.
    """

    name = None
    files = ()

    def __init__(self, out_dir, dist):
        self.out_dir, self.dist = out_dir, dist


class KerasCheckpoints(RunCheckpointFormat):
    """`--checkpoint-format keras`: the best epoch as model.keras, the backup by BackupAndRestore."""

    name = "keras"
    files = ("model.keras", "model.partial.keras", "backup", "lora.safetensors")

    def callbacks(self, monitor, mode):
        """(best, backup): the callbacks that write the best epoch and the resumable backup."""
        import keras

        from training import checkpointing

        best = checkpointing.AtomicModelCheckpoint(self._path("model.keras"), monitor=monitor, mode=mode,
                                                   save_best_only=True)
        backup = keras.callbacks.BackupAndRestore(self._path("backup"), delete_checkpoint=False,
                                                  double_checkpoint=True)
        return best, backup

    def load_best(self):
        """The best epoch's model (compiled as saved). A collective under multi-process JAX."""
        import keras

        return keras.saving.load_model(self._path("model.keras"), safe_mode=True)

    def finish(self):
        """Nothing is left to write: model.keras is the best epoch already."""

    def _path(self, name):
        return os.path.join(self.dist.checkpoint_dir(self.out_dir), name)


class OrbaxCheckpoints(RunCheckpointFormat):
    """`--checkpoint-format orbax`: the best epoch in model/ and the backup in backup/, as shards that
    every process writes into the run folder; model.keras is written from model/ at the end."""

    name = "orbax"
    files = ("model", "backup", "model.keras", "model.partial.keras")

    def callbacks(self, monitor, mode):
        """(best, backup): `OrbaxCheckpoint` for the best epoch, `checkpointing.OrbaxBackup` for the last."""
        from training import checkpointing

        return checkpointing.orbax_callbacks(self.out_dir, monitor, mode)

    def load_best(self):
        """The best epoch in the current distribution's layout, without its optimizer (a collective)."""
        from training import checkpointing

        return checkpointing.load_model(os.path.join(self.out_dir, "model"), compile=False)

    def finish(self):
        """Writes model.keras from model/ when one process can hold the model (every process calls it)."""
        from training import checkpointing

        checkpointing.write_model_file(self.out_dir, self.dist)


FORMATS = {kind.name: kind for kind in (KerasCheckpoints, OrbaxCheckpoints)}  # --checkpoint-format's choices
# Every name that a format can write into a run folder, in a stable order.
FILES = tuple(dict.fromkeys(name for kind in FORMATS.values() for name in kind.files))


def resolve(name, dist):
    """The checkpoint format a run uses, by name: `name`, or the default for `dist` when None
    (orbax for multi-process JAX runs, keras otherwise). Raises ValueError for an unknown name, or
    orbax on another backend than JAX or without orbax-checkpoint installed."""
    import keras

    backend = keras.backend.backend()
    if name is None:
        return "orbax" if dist.num_processes > 1 and backend == "jax" else "keras"
    if name not in FORMATS:
        raise ValueError(f"--checkpoint-format={name!r} is not allowed; use one of {tuple(FORMATS)}")
    if name == "orbax" and backend != "jax":
        raise ValueError(f"--checkpoint-format=orbax runs on KERAS_BACKEND=jax; this process uses {backend} "
                         "(use --checkpoint-format keras)")
    if name == "orbax" and not _installed("orbax.checkpoint"):
        raise ValueError('--checkpoint-format=orbax needs orbax-checkpoint, which is not installed; run pip install '
                         '-e ".[train]" in the repository\'s root, or use --checkpoint-format keras')
    return name


def _installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or blocked in sys.modules
        return False


def for_run(name, out_dir, dist):
    """The checkpoints object of the run in `out_dir`: format `name` as `resolve` decides it."""
    return FORMATS[resolve(name, dist)](out_dir, dist)

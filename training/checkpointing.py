"""Sharded, asynchronous checkpoints of a training run, written by `keras.callbacks.OrbaxCheckpoint`.

`--checkpoint-format keras` (the default on one process) keeps a run's checkpoints as Keras files:
`model.keras` (the best epoch) and `backup/` (`BackupAndRestore`). Under multi-process JAX
`ModelParallel` those are gathered whole into every process first (`keras_vit.distribution.host_copy`).

`--checkpoint-format orbax` (the default for multi-process JAX runs) writes both through Orbax:
`model/` (the best epoch) and `backup/` (the last two epochs, resumed from). Each process writes
only the shards it holds, in the background while training goes on; Orbax's commit protocol
writes a step into a temporary folder and renames it only once every process has finished, so a
save cut short by a kill is never the one restored. Every chunk carries a CRC-32C checksum
(`checkpoint_files.add_chunk_checksums`). Every process must see `--out` (the same folder on a
shared file system, or a `gs://` bucket).

Restoring reads each variable straight into the layout of the model that restores it, so a run
resumes on another topology (another mesh, device count or process count). Every variable of the
model must be found in the checkpoint with its shape, and every array in the checkpoint must be
readable: otherwise `restore` raises `CheckpointError` naming the variable or file; it never
restores part of a model silently (Keras' own `load_weights` skips variables whose paths differ).
"""

import inspect
import json
import logging
import os
import subprocess
import sys

import keras

import keras_vit
from training import best_epoch, checkpoint_files
from training.checkpoint_files import CheckpointError

SECTIONS = ("trainable_variables", "non_trainable_variables", "optimizer_variables")
KEEP_BACKUPS = 2  # like BackupAndRestore(double_checkpoint=True)
EXPORT_TIMEOUT_S = 6 * 3600  # how long the other processes wait for the chief's model.keras


class AtomicModelCheckpoint(best_epoch.KeepBest, keras.callbacks.ModelCheckpoint):
    """`keras.callbacks.ModelCheckpoint` whose file is replaced in one rename. Keras writes the zip in
    place, so a kill while it saves would tear model.keras; here it leaves the previous one whole.
    Which epoch is saved: `training.best_epoch` (ties on the monitored metric go to the lower val_loss)."""

    def _save_model(self, epoch, batch, logs):  # Keras' hook for one save (private: keras_vit.upstream)
        final = self.filepath
        self.filepath = final.removesuffix(".keras") + ".partial.keras"
        try:
            if os.path.exists(self.filepath):  # torn by a kill: never renamed into place
                os.remove(self.filepath)
            super()._save_model(epoch, batch, logs)
            if os.path.exists(self.filepath):  # saved: this epoch was the best so far
                # A LoRA run's adapter alone beside it (model.keras holds the merged kernels), for
                # `ViT.load_lora_weights` onto --weights: the same epoch's, renamed into place first.
                if keras_vit.models.quantization.lora_layers(self.model):
                    adapter = os.path.join(os.path.dirname(final), "lora.safetensors")
                    self.model.save_lora_weights(adapter.removesuffix(".safetensors") + ".partial.safetensors")
                    os.replace(adapter.removesuffix(".safetensors") + ".partial.safetensors", adapter)
                os.replace(self.filepath, final)
        finally:
            self.filepath = final


def orbax_callbacks(out_dir, monitor, mode):
    """(best, backup): the best epoch's state in `out_dir/model`, and the last epochs' in
    `out_dir/backup`, which the same command resumes from. The backup of an epoch starts only
    once the best model's save of that epoch is committed, so a resumed run never finds a
    backup newer than the best model it names; and the best model's save of an epoch starts only
    once the backup of the epoch before is committed. One save at a time: two in flight at once
    enter the same Orbax barrier ("ThreadSaveMultiHostValueHolder:set_value_start") from two
    threads, which the JAX coordination service refuses as "already ongoing" and then aborts."""
    checkpoint_files.add_chunk_checksums()
    _drop_reports_of_failed_background_saves()
    best = BestOrbaxCheckpoint(absolute(os.path.join(out_dir, "model")), monitor=monitor, mode=mode,
                               save_best_only=True, max_to_keep=1)
    backup = OrbaxBackup(os.path.join(out_dir, "backup"), wait_for=(best,))
    best.wait_for = (backup,)
    return best, backup


def absolute(path):
    """`path` made absolute, as Orbax requires of a local folder (it refuses "runs/x" when it
    writes); a URL such as gs://bucket/run is kept."""
    return str(path) if "://" in str(path) else os.path.abspath(path)


class OrderedOrbaxCheckpoint(keras.callbacks.OrbaxCheckpoint):
    """`keras.callbacks.OrbaxCheckpoint` whose save of an epoch starts once the saves of the
    callbacks in `wait_for` are committed."""

    wait_for = ()

    def on_epoch_end(self, epoch, logs=None):
        for callback in self.wait_for:
            callback.wait_until_finished()
        super().on_epoch_end(epoch, logs)


class BestOrbaxCheckpoint(best_epoch.KeepBest, OrderedOrbaxCheckpoint):
    """The best epoch by `training.best_epoch`'s rule, saved in order with the backups."""


class OrbaxBackup(OrderedOrbaxCheckpoint):
    """`BackupAndRestore` on Orbax: saves the whole training state after every epoch, in the
    background, keeps the last `KEEP_BACKUPS`, and at the start of `fit` restores the latest
    committed one (weights, optimizer state, epoch) into the model's current layout.

    Args:
        directory: the backup folder, seen by every process.
        wait_for: OrbaxCheckpoint callbacks whose saves must be committed before each backup.
    """

    def __init__(self, directory, wait_for=()):
        checkpoint_files.add_chunk_checksums()
        super().__init__(absolute(directory), save_freq="epoch", max_to_keep=KEEP_BACKUPS)
        self.wait_for = tuple(wait_for)

    def on_train_begin(self, logs=None):
        latest = self.checkpointer.latest
        self._drop_steps_from(0 if latest is None else latest.step + 1)
        if latest is None:
            return
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        try:
            restore(self.model, str(latest.path))
        except CheckpointError as error:
            older = [c.step for c in self.checkpointer.checkpoints if c.step < latest.step]
            instead = f"remove {latest.path} to resume after epoch {max(older) + 1}, or " if older else ""
            raise CheckpointError(f"the run cannot resume: {error}. To go on, {instead}start again with "
                                  "--overwrite") from None
        # As BackupAndRestore does: fit() starts at the epoch after the restored one (private:
        # keras_vit.upstream lists `_initial_epoch` and `checkpointer`).
        self.model._initial_epoch = latest.step + 1

    def _drop_steps_from(self, start):
        """Removes the steps of epoch `start` and later from the folders of `wait_for`: a best-model
        save that was committed before its backup was (a kill, a full disk, a backup removed as
        damaged). The resumed run trains that epoch again, and Orbax refuses a step that exists."""
        from etils import epath  # Orbax's path library: local folders and gs:// alike
        from orbax.checkpoint import multihost

        for callback in self.wait_for:
            newer = [c.path for c in callback.checkpointer.checkpoints if c.step >= start]
            if not newer:
                continue
            if multihost.process_index() == 0:
                for path in newer:
                    epath.Path(path).rmtree()
            multihost.sync_global_processes("keras_vit_drop_steps_to_train_again")
            callback.checkpointer.reload()


def write_model_file(out_dir, dist):
    """Writes the best epoch of an orbax run, `out_dir/model`, also as `out_dir/model.keras` when
    one process can hold it; where it cannot, says so, and the sharded checkpoint stays the run's
    model. The chief runs `training.export_checkpoint` in a process of its own, on the CPU and
    outside the multi-process job; the other processes wait for it at a barrier, so that none
    leaves the job (whose shutdown is a collective with a timeout) while the export runs."""
    if dist.is_chief:
        _export_in_new_process(os.path.join(out_dir, "model"), os.path.join(out_dir, "model.keras"))
    if dist.num_processes > 1:
        from orbax.checkpoint import multihost

        multihost.sync_global_processes("keras_vit_model_file", timeout=EXPORT_TIMEOUT_S)


def _export_in_new_process(checkpoint, target):
    """Runs `python -m training.export_checkpoint CHECKPOINT --to TARGET`. Prints its one-line
    refusal when the model would not fit in memory; raises RuntimeError on any other failure."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "-m", "training.export_checkpoint", os.path.abspath(checkpoint),
               "--to", os.path.abspath(target)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # the accelerators stay with the training processes
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        return
    if proc.returncode == checkpoint_files.EXPORT_TOO_BIG:
        print(f"{target} not written: {proc.stderr.strip()}", file=sys.stderr)
        return
    raise RuntimeError(f"{' '.join(command)} failed with exit status {proc.returncode}: {proc.stderr[-2000:]}")


def latest_step(directory):
    """The path of the newest committed step of the Orbax checkpoint folder `directory`.

    Raises CheckpointError when there is none (a folder of torn saves counts as none)."""
    from orbax.checkpoint import v1 as ocp  # Orbax's v1 API, the one Keras' OrbaxCheckpoint uses

    if "://" not in directory and not os.path.isdir(directory):
        raise CheckpointError(f"{directory} is not a folder; give an Orbax checkpoint folder such as RUN/model")
    with ocp.training.Checkpointer(absolute(directory)) as checkpointer:
        latest = checkpointer.latest
    if latest is None:
        raise CheckpointError(f"{directory} holds no committed Orbax checkpoint step (folders named 0, 1, ...); "
                              f"found {sorted(os.listdir(directory))[:8]}")
    return str(latest.path)


def saved_arrays(step_dir):
    """{"section/variable path": metadata with .shape and .dtype} of the arrays of an Orbax step,
    read from its metadata only; sections are those of `keras.Model.get_state_tree`."""
    return dict(_flatten(_saved_tree(step_dir)))


def _saved_tree(step_dir):
    """The nested dict of array metadata (.shape, .dtype) of a step, keyed by section and path."""
    from orbax.checkpoint import v1 as ocp

    try:
        return ocp.pytree_metadata(step_dir, checkpointable_name="pytree").metadata
    except (FileNotFoundError, ValueError, OSError) as error:
        raise CheckpointError(f"{step_dir}: its array index cannot be read ({_first_line(error)})") from None


def restore(model, step_dir, sections=SECTIONS):
    """Reads the variables of `sections` of `model` from the Orbax step folder `step_dir`, each
    into the variable's own sharding, and assigns them once all are read.

    A collective under multi-process JAX: every process calls it, and each reads the shards its
    devices hold. Raises CheckpointError, before assigning anything, when a variable is not in
    the checkpoint or has another shape there, or when an array's files are missing or damaged
    (the message names the file).
    """
    tree = _saved_tree(step_dir)
    saved = dict(_flatten(tree))
    variables = {f"{s}/{v.path}": v for s in sections for v in _section_variables(model, s)}
    _check_match(variables, saved, step_dir, sections)
    pytree_dir = os.path.join(step_dir, "pytree")
    local = os.path.isdir(pytree_dir)  # not a gs:// bucket: its data files can be checked first
    if local:
        checkpoint_files.check(pytree_dir)
    hook = sys.unraisablehook
    _drop_reports_of_abandoned_reads()
    try:
        values = _read(step_dir, tree, variables)
    except Exception as error:  # Orbax wraps tensorstore's error, which names the chunk it could not read
        cause = _first_line(_root_cause(error))
        path = checkpoint_files.file_of_error(pytree_dir, cause) if local else None
        where = f"{path} is damaged" if path else f"{step_dir} cannot be read whole"
        raise CheckpointError(f"{where}, so nothing was restored ({cause})") from None
    sys.unraisablehook = hook
    for path, variable in variables.items():
        variable.assign(values[path])


def _drop_reports_of_abandoned_reads():
    """Keeps the error of a failed restore the only one printed. Why by hand: when one array fails,
    Orbax's `asyncio.run` cancels the other reads and closes its event loop while tensorstore
    still completes them, and each completion then reports "Event loop is closed", or an exception
    of its abandoned coroutine, as a traceback printed by `sys.unraisablehook` around the error
    that names the damaged file. Only those two reports are dropped, while the read runs and, when
    it fails, to the end of the process; every other one still goes to the hook."""
    unraisablehook = sys.unraisablehook

    def quiet_unraisablehook(report):
        closed = report.exc_type is RuntimeError and str(report.exc_value) == "Event loop is closed"
        abandoned = inspect.iscoroutine(report.object) and "orbax" in report.object.cr_code.co_filename
        if not (closed or abandoned):
            unraisablehook(report)

    sys.unraisablehook = quiet_unraisablehook


class _FailedBackgroundSave(logging.Filter):
    """Drops Orbax's own reports of a background save that failed. Why by hand: each thread of
    the save logs the same error with its traceback (six for one full disk), and
    `wait_until_finished` then raises that error in the main thread, which the CLI prints as
    its one line. Orbax's records reach absl's logger naming absl's file, so they are told by
    Orbax's "[process=N]" prefix; its other records, and errors of other libraries, still print."""

    def filter(self, record):
        message = record.getMessage()
        failed = record.exc_info is not None or "background save thread" in message or (
            "(save_finalize) failed" in message)
        return not (record.levelno >= logging.ERROR and message.startswith("[process=") and failed)


def _drop_reports_of_failed_background_saves():
    logger = logging.getLogger("absl")  # Orbax logs through absl, whose records go to this logger
    if not any(isinstance(f, _FailedBackgroundSave) for f in logger.filters):
        logger.addFilter(_FailedBackgroundSave())


def _read(step_dir, tree, variables):
    """{path: array} of `variables` (path -> variable) read from a step in their shardings; the
    other arrays of the step stay unread (Orbax skips PLACEHOLDER leaves)."""
    import jax
    from orbax.checkpoint import v1 as ocp

    def target(path, meta):
        variable = variables.get(path)
        if variable is None:
            return ocp.PLACEHOLDER
        return jax.ShapeDtypeStruct(tuple(variable.shape), meta.dtype, sharding=variable.value.sharding)

    with ocp.Context():
        loaded = ocp.load_checkpointables(step_dir, {"pytree": _map_leaves(target, tree)})["pytree"]
    return {path: value for path, value in _flatten(loaded) if path in variables}


def load_model(directory, compile=True, sections=SECTIONS):
    """The model of the newest step of an Orbax checkpoint folder written by `OrbaxCheckpoint`
    (with its config), built in the current distribution's layout and restored by `restore`."""
    from orbax.checkpoint import v1 as ocp

    step_dir = latest_step(directory)
    with ocp.Context():
        config = json.loads(ocp.load_checkpointables(step_dir, {"model_config": None})["model_config"]["config"])
    if not compile:
        config["compile_config"] = None
        sections = [s for s in sections if s != "optimizer_variables"]
    model = keras.saving.deserialize_keras_object(config, safe_mode=True)
    if compile and model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    restore(model, step_dir, sections)
    return model


def _section_variables(model, section):
    if section == "optimizer_variables":
        return list(model.optimizer.variables) if model.optimizer is not None else []
    return list(getattr(model, section))


def _check_match(variables, saved, step_dir, sections):
    missing = [path for path in variables if path not in saved]
    if missing:
        section = missing[0].split("/")[0]
        sample = [path for path in saved if path.startswith(section + "/")][:3]
        raise CheckpointError(f"{step_dir} has no array for {len(missing)} variables of the model, e.g. "
                              f"{missing[:3]}; it holds e.g. {sample}. Restore into the model that wrote it "
                              "(same config and layer names)")
    extra = [path for path in saved if path.split("/")[0] in sections and path not in variables]
    if extra:
        raise CheckpointError(f"{step_dir} holds {len(extra)} arrays that no variable of the model takes, e.g. "
                              f"{extra[:3]}; restoring the rest would be partial. Restore into the model that "
                              "wrote it (same config)")
    for path, variable in variables.items():
        if tuple(saved[path].shape) != tuple(variable.shape):
            raise CheckpointError(f"{step_dir}: {path} has shape {tuple(saved[path].shape)} there, "
                                  f"the model's is {tuple(variable.shape)}")


def _flatten(tree, prefix=""):
    """((path, leaf), ...) of a nested dict, paths joined by "/" as Keras' variable paths are."""
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value


def _map_leaves(fn, tree, prefix=""):
    """The nested dict `tree` with each leaf replaced by fn(path, leaf); empty dicts are kept."""
    return {key: _map_leaves(fn, value, f"{prefix}{key}/") if isinstance(value, dict) else fn(f"{prefix}{key}", value)
            for key, value in tree.items()}


def _root_cause(error):
    """The innermost exception of a chain: Orbax's outer ones only say which handler failed."""
    while error.__cause__ is not None or (error.__context__ is not None and not error.__suppress_context__):
        error = error.__cause__ or error.__context__
    return error


def _first_line(error):
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text[:400]}"

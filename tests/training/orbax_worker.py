"""Epochs of a tiny ViT with `training.checkpointing.OrbaxBackup`, for the Orbax checkpoint tests.

Run as a subprocess (one per JAX process) with its own environment, e.g.

    KERAS_BACKEND=jax python -m tests.training.orbax_worker --distribution model_parallel --mesh 1x2 \
        --coordinator 127.0.0.1:PORT --num-processes 2 --process-id 0 --backup DIR --out RUN

Each epoch trains the same `--steps` global batches (SGD with momentum, as in
tests/training/distribute_worker.py, whose initial weights and data it uses), so an epoch's losses
depend only on the state it starts from. The chief writes RUN/restored.npz (the state after
OrbaxBackup's restore, when there was one to restore), RUN/epoch_E.npz (the state and the
per-step losses after epoch E) and RUN/run.json. `--kill-in-save E` kills every process right
after the backup of epoch E has started in the background, and before Orbax has committed it.
"""

import argparse
import json
import os
import signal
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tests.training import distribute_worker  # noqa: E402
import keras  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import distribution  # noqa: E402
from training import checkpointing, distribute  # noqa: E402


def state(model):
    """{path: whole value} of every weight and optimizer variable (gathered: a collective)."""
    variables = model.weights + model.optimizer.variables
    return {v.path: distribution.host_value(v) for v in variables}


class Recorder(keras.callbacks.Callback):
    """Writes the state after a restore and after each epoch, with the epoch's per-step losses."""

    def __init__(self, out, is_chief):
        super().__init__()
        self.out, self.is_chief, self.means = out, is_chief, []

    def save(self, name, **extra):
        values = state(self.model)  # every process takes part in the gather
        if self.is_chief:
            np.savez(os.path.join(self.out, name), **{f"v:{k}": v for k, v in values.items()}, **extra)

    def on_train_begin(self, logs=None):
        if self.model._initial_epoch:  # OrbaxBackup restored a checkpoint just before
            self.save("restored.npz", epoch=self.model._initial_epoch)

    def on_epoch_begin(self, epoch, logs=None):
        self.means = []

    def on_train_batch_end(self, batch, logs=None):
        self.means.append(float(logs["loss"]))

    def on_epoch_end(self, epoch, logs=None):
        # Keras logs the running mean of the epoch; step k's loss is k*m_k - (k-1)*m_(k-1).
        totals = np.asarray(self.means, "float64") * np.arange(1, len(self.means) + 1)
        self.save(f"epoch_{epoch}.npz", losses=np.diff(totals, prepend=0.0))


def hold_commit(final):
    """Keeps Orbax from committing the step folder `final` (it never renames the step's temporary
    folder to it), so that a kill at the end of that epoch always lands between the start of the
    save and its commit; a real kill can land there, and this makes the test's kill land there
    every time instead of racing a fast background save. Orbax's private temporary-path classes:
    test-only."""
    import asyncio

    from orbax.checkpoint._src.path import atomicity

    for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
        original = cls.finalize

        async def finalize(self, _original=original):
            if os.path.abspath(str(self._final_path)) == final:
                await asyncio.sleep(3600)
            return await _original(self)

        cls.finalize = finalize


class KillInSave(keras.callbacks.Callback):
    """SIGKILLs this process at the end of epoch `epoch`, after the backup save has started and
    before it is committed; the chief records what the backup folder held at that moment."""

    def __init__(self, epoch, backup, out, is_chief):
        super().__init__()
        self.epoch, self.backup, self.out, self.is_chief = epoch, backup, out, is_chief
        hold_commit(os.path.join(os.path.abspath(backup), str(epoch)))

    def on_epoch_end(self, epoch, logs=None):
        if epoch != self.epoch:
            return
        # The save runs in the background: wait until its temporary folder exists (its commit is held).
        deadline = time.time() + 120
        while not any(n.startswith(f"{epoch}.orbax-checkpoint-tmp") for n in os.listdir(self.backup)):
            if time.time() > deadline:
                break
            time.sleep(0.05)
        names = sorted(os.listdir(self.backup))
        if self.is_chief:
            with open(os.path.join(self.out, "killed.json"), "w") as f:
                json.dump({"epoch": epoch, "backup": names, "time": time.time()}, f)
        os.kill(os.getpid(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    distribute.add_arguments(parser)
    parser.add_argument("--backup", required=True, help="the OrbaxBackup folder")
    parser.add_argument("--out", required=True, help="folder for the chief's records")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2, help="global batches per epoch")
    parser.add_argument("--batch-size", type=int, default=16, help="global batch")
    parser.add_argument("--kill-in-save", type=int, default=None, help="epoch whose backup save is cut short")
    args = parser.parse_args()
    dist = distribute.from_args(args)
    os.makedirs(args.out, exist_ok=True)
    keras.utils.set_random_seed(0)
    with dist.scope():
        model = keras_vit.ViT(**distribute_worker.CONFIG, name="vit")
        model.set_weights(distribute_worker.initial_weights(model))
        model.compile(optimizer=distribute_worker.optimizer("sgd"),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [checkpointing.OrbaxBackup(args.backup), Recorder(args.out, dist.is_chief)]
    if args.kill_in_save is not None:
        callbacks.append(KillInSave(args.kill_in_save, args.backup, args.out, dist.is_chief))
    data = dist.shard(distribute_worker.dataset(args.steps, args.batch_size)).repeat()
    model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps, verbose=0, callbacks=callbacks)
    if dist.is_chief:
        info = dict(num_processes=dist.num_processes, devices=len(keras.distribution.list_devices()),
                    initial_epoch=model._initial_epoch or 0)
        with open(os.path.join(args.out, "run.json"), "w") as f:
            json.dump(info, f)


if __name__ == "__main__":
    main()

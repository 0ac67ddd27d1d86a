"""Which epoch a run keeps as its model, and the line that says so.

The rule: the best value of the monitored metric (`val_accuracy` with a validation split, else the
training `loss`); among epochs that tie on it, the lowest `val_loss`. On a small validation split
accuracy moves in steps of 1/N and often stays at its best for many epochs while the loss keeps
falling, and the later epoch is the better model: `experiments.best_epoch` measured it
(docs/training.md, "Which epoch is kept").

`better` is the rule, used by the callback while the run trains (`KeepBest`), by a resumed run to
find the epoch kept before the kill (`training.loop.ResumeLog`), and by the summary at the end
(`kept`), so the three never disagree.
"""

import csv
import math
import os

TIE_BREAK = "val_loss"


def tie_break(monitor):
    """The logged value that decides between epochs that tie on `monitor` (None: no second key)."""
    return TIE_BREAK if monitor != TIE_BREAK and monitor.startswith("val_") else None


def better(row, kept, monitor, mode):
    """Whether the epoch logged in `row` beats the kept one (`kept` None: nothing kept yet).

    `row` and `kept` map logged names to numbers; `mode` is "max" or "min" for `monitor`."""
    if kept is None:
        return True
    value, best = float(row[monitor]), float(kept[monitor])
    if value != best:
        return value > best if mode == "max" else value < best
    tie = tie_break(monitor)
    return tie is not None and float(row.get(tie, math.inf)) < float(kept.get(tie, math.inf))


def best_row(rows, monitor, mode):
    """The row of `rows` (dicts of logged numbers, in epoch order) that the rule keeps, or None."""
    kept = None
    for row in rows:
        if _finite(row.get(monitor)) and better(row, kept, monitor, mode):
            kept = row
    return kept


def _finite(value):
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):  # None, or CSVLogger's "NA" for a value that epoch did not log
        return False


class KeepBest:
    """Mixin for Keras' `ModelCheckpoint` and `OrbaxCheckpoint` with `save_best_only=True`: an epoch
    is saved when `better` says so, ties on the monitored metric included.

    Keras counts a tie as no improvement, so a run whose validation accuracy saturates kept the first
    epoch that reached it. Keras' `_is_improvement(current, best)` sees only the monitored value, so
    `on_epoch_end` keeps the epoch's logs for it (private hook: keras_vit.upstream). `kept` holds the
    logs of the saved epoch, with its 1-based "epoch".
    """

    kept = None

    def on_epoch_end(self, epoch, logs=None):
        self._row = {**(logs or {}), "epoch": epoch + 1}
        super().on_epoch_end(epoch, logs)

    def _is_improvement(self, monitor_value, reference_value):
        row = {**self._row, self.monitor: monitor_value}
        if not better(row, self.kept, self.monitor, self.mode):
            return False
        self.kept = {key: float(value) for key, value in row.items() if _finite(value)}
        return True

    def resume_from(self, rows):
        """Takes the kept epoch of a resumed run from its log rows (`rows` as `best_row` reads them)."""
        self.kept = best_row(rows, self.monitor, self.mode)
        if self.kept is not None:
            self.best = float(self.kept[self.monitor])


def read_rows(path):
    """log.csv's rows as dicts of floats ("epoch" 1-based), the last row of a repeated epoch kept."""
    if not os.path.exists(path):
        return []
    rows = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            epoch = int(row.pop("epoch"))
            rows[epoch] = {"epoch": epoch + 1, **{k: float(v) for k, v in row.items() if _finite(v)}}
    return [rows[epoch] for epoch in sorted(rows)]


def kept(log_path, monitor, epochs):
    """The record of the kept epoch for the run's summary (metrics.json "kept"), or None when the
    log has no epoch with `monitor`: epoch, of how many, the monitor and the values that decided."""
    mode = "max" if "accuracy" in monitor else "min"
    row = best_row(read_rows(log_path), monitor, mode)
    if row is None:
        return None
    names = [monitor] + [name for name in (tie_break(monitor),) if name and name in row]
    return {"epoch": int(row["epoch"]), "epochs": epochs, "monitor": monitor, **{name: row[name] for name in names}}


def line(record):
    """"kept epoch 27 of 30 (val_accuracy 1.000, val_loss 0.401): the highest val_accuracy, and the
    lowest val_loss of the epochs that tie on it" for a `kept` record."""
    monitor = record["monitor"]
    values = ", ".join(f"{name} {record[name]:.3f}" for name in (monitor, tie_break(monitor)) if name in record)
    why = f"the {'highest' if 'accuracy' in monitor else 'lowest'} {monitor}"
    if tie_break(monitor):
        why += f", and the lowest {tie_break(monitor)} of the epochs that tie on it"
    return f"kept epoch {record['epoch']} of {record['epochs']} ({values}): {why}"

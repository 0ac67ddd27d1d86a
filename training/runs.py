"""A run folder (`--out`) across re-runs: what a re-run may change, and an order of writes that never
leaves the folder holding one model's checkpoint beside another model's recipe.json.

`plan` reads the folder (nothing is written, no deep-learning library is needed) and decides:

- new        nothing of a run is there: start one.
- resume     the same configuration, or one that differs only in `COMPATIBLE` fields (say, more
             epochs): go on from the last finished epoch ("resuming at epoch N of M").
- restart    a run is there but finished no epoch (it failed or was killed in its first): start
             over with the requested configuration; nothing trained is lost.
- overwrite  asked for with `overwrite=True` (--overwrite): replace the run.

Any other difference is refused in one line that names the fields, since resuming would train one
model and record another (or mix two recipes in one record).

`commit` makes the folder and writes recipe.json once the start is known good (data found, model
built and compiled): first it removes what a replaced run left, then it replaces recipe.json in one
rename, so a kill at any point leaves either the old recipe with no checkpoint or the new one.
`undo` removes what a start wrote when training fails before its first epoch is finished.
"""

import dataclasses
import glob
import json
import os
import shutil

from training import checkpoint_formats

RECIPE = "recipe.json"
# Everything that a run writes into its folder: its checkpoints in every format (the objects of
# training.checkpoint_formats say which are theirs; an Orbax run's "model" steps must not outlive
# it, since loading takes the newest step), then training.loop's, training.reports' and
# training.examples' files.
RUN_FILES = (RECIPE, *checkpoint_formats.FILES, "log.csv", "tensorboard", "metrics.json", "curves.png",
             "confusion.png", "examples", "ood.npz")
# Fields that a re-run may change and still resume: how long to train (the cosine schedule
# stretches to the new length), what to evaluate at the end, whether steps are XLA-compiled, and
# whether unreadable images are refused rather than skipped.
COMPATIBLE = ("epochs", "test_split", "jit_compile", "strict_data", "ood_method", "ood_blocks")
# recipe.json's notes on where the run ran, not part of its configuration.
ENVIRONMENT = ("name", "backend", "dtype_policy_used", "jit_compile_used", "malloc")
SHOWN = 6  # differing fields named in a refusal; the rest are counted


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a start does with `out`: `action` is "new", "resume", "restart" or "overwrite"; `done`
    is the number of finished epochs, `epochs` the number asked for; `before` the names that were
    in `out` (None when `out` did not exist)."""

    out: str
    action: str
    done: int = 0
    epochs: int = 0
    before: frozenset | None = None

    def message(self):
        """The line that the CLI prints before it starts, or None for a new run."""
        if self.action == "resume" and self.done >= self.epochs:
            return (f"{self.out} has finished its {self.epochs} epochs; evaluating its best checkpoint again "
                    "(ask for more --epochs to train longer)")
        if self.action == "resume":
            return f"resuming at epoch {self.done + 1} of {self.epochs} in {self.out}"
        if self.action == "restart":
            return f"{self.out} holds a run that finished no epoch; starting it again with these settings"
        if self.action == "overwrite":
            return f"replacing the run in {self.out} (--overwrite)"
        return None


def configuration(recipe, weights=None):
    """The configuration that recipe.json records and `plan` compares: the recipe's fields and the
    checkpoint that training starts from."""
    return {**dataclasses.asdict(recipe), "weights": weights}


def read_recipe(out):
    """The recipe.json of the run in `out` as a dict, or None when there is none."""
    path = os.path.join(out, RECIPE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read ({e}); pass --overwrite to replace the run in {out}, "
                         "or start a new one with another --out") from e
    if not isinstance(stored, dict):
        raise ValueError(f"{path} holds no recipe; pass --overwrite to replace the run, or use another --out")
    return stored


def finished_epochs(out):
    """Epochs that the run in `out` finished: the backup's count (BackupAndRestore's metadata, or
    the newest Orbax step, whose folder is named by its epoch from 0 once it is committed), or the
    rows of log.csv where there is no backup; 0 for none. log.csv can hold a row more than the
    backup: the row of an epoch whose save failed, which the resume trains again."""
    try:
        steps = [int(name) for name in os.listdir(os.path.join(out, "backup")) if name.isdigit()]
    except OSError:
        steps = []
    if steps:
        return max(steps) + 1
    for name in ("training_metadata.json", "training_metadata.json.bkp"):
        try:
            with open(os.path.join(out, "backup", name)) as f:
                return int(json.load(f)["epoch"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    try:
        with open(os.path.join(out, "log.csv")) as f:
            return max(0, sum(1 for line in f if line.strip()) - 1)  # less the header
    except OSError:
        return 0


def differences(stored, requested):
    """{field: (stored, requested)} for the fields that differ, less COMPATIBLE and ENVIRONMENT ones.
    A field missing from an older recipe.json is not compared."""
    skip = set(COMPATIBLE) | set(ENVIRONMENT)
    return {k: (stored[k], v) for k, v in requested.items() if k not in skip and k in stored and stored[k] != v}


def plan(out, requested, overwrite=False):
    """The `Plan` for starting the configuration `requested` (see `configuration`) in `out`.

    Raises NotADirectoryError when `out` is a file, and ValueError, naming the fields and the two
    ways on, for a configuration that the run in `out` cannot take.
    """
    if os.path.exists(out) and not os.path.isdir(out):
        raise NotADirectoryError(f"--out {out!r} is a file; give a folder (new or of an earlier run)")
    before = frozenset(os.listdir(out)) if os.path.isdir(out) else None
    epochs = requested.get("epochs", 0)
    held = sorted(set(RUN_FILES) & (before or frozenset()))
    done = finished_epochs(out)
    trained = done > 0 or "model.keras" in held
    if not held:
        return Plan(out, "new", 0, epochs, before)
    if overwrite:
        return Plan(out, "overwrite", done, epochs, before)
    if not trained:
        return Plan(out, "restart", 0, epochs, before)
    stored = read_recipe(out)
    if stored is None:
        raise ValueError(f"{out} holds a run ({', '.join(held)}) but no {RECIPE}, so its configuration is unknown; "
                         "start a new run with another --out, or pass --overwrite to replace this one")
    changed = differences(stored, requested)
    if changed:
        raise ValueError(refusal(out, changed))
    if epochs < done:
        raise ValueError(f"--epochs {epochs}: the run in {out} has already finished {done} epochs; ask for "
                         f"--epochs {done} or more to resume it, start a new run with another --out, or pass "
                         "--overwrite to replace it")
    return Plan(out, "resume", done, epochs, before)


def refusal(out, changed):
    """The one-line refusal of a re-run whose configuration differs in `changed`."""
    named = [f"{k} {old!r} -> {new!r}" for k, (old, new) in list(changed.items())[:SHOWN]]
    more = f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
    return (f"{out} holds a run with another configuration ({'; '.join(named)}{more}); resuming it would mix "
            "two runs. Start a new run with another --out, or pass --overwrite to replace this one")


def checkpoint_format(plan, requested):
    """The checkpoint format of a start: on a resume the run's own (recipe.json's
    "checkpoint_format"), which `requested` (None: not given) must not change; otherwise `requested`.
    Raises ValueError in one line for a resume in another format, which would start again from
    nothing or mix two formats in one folder."""
    if plan.action != "resume":
        return requested
    stored = (read_recipe(plan.out) or {}).get("checkpoint_format")
    if stored is None or requested in (None, stored):
        return stored or requested
    raise ValueError(f"{plan.out} holds a run with --checkpoint-format {stored}; resuming it with --checkpoint-format "
                     f"{requested} would start again from nothing. Resume with --checkpoint-format {stored}, start a "
                     "new run with another --out, or pass --overwrite to replace this one")


def write_json(path, value):
    """Writes `value` as JSON to `path` in one rename, so a kill leaves the old file or the new one."""
    partial = f"{path}.partial"
    with open(partial, "w") as f:
        json.dump(value, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def commit(plan, record):
    """Makes the run folder and writes `record` as its recipe.json; for "overwrite" and "restart",
    first removes what the earlier run wrote (its recipe.json last, by replacing it)."""
    os.makedirs(plan.out, exist_ok=True)
    if plan.action in ("overwrite", "restart"):
        for name in RUN_FILES:
            if name != RECIPE:
                _remove(os.path.join(plan.out, name))
    for leftover in glob.glob(os.path.join(glob.escape(plan.out), "*.partial")):  # a write cut short by a kill
        _remove(leftover)
    write_json(os.path.join(plan.out, RECIPE), record)


def undo(plan):
    """After a start that failed before finishing an epoch: removes what it wrote (the folder too,
    if the start made it). A resumed run, or one with a finished epoch, is left as it is."""
    if plan.action == "resume" or finished_epochs(plan.out) > 0:
        return
    if plan.before is None:
        shutil.rmtree(plan.out, ignore_errors=True)
        return
    for name in set(RUN_FILES) - plan.before:
        _remove(os.path.join(plan.out, name))


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)

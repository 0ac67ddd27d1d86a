"""Training with `model.fit`: model, optimizer, callbacks, final evaluation and reports.

`run(recipe, out_dir, weights=None)` is the whole of a training run; `training.train` only parses
arguments. The same code runs on the TensorFlow, JAX and PyTorch backends.
"""

import csv
import dataclasses
import math
import os
import time

import keras

import keras_vit
from training.datasets import naflex as naflex_data
from commands import malloc
from training import best_epoch, checkpoint_formats, datasets, distribute, examples, ood_stats, recipes, reports, runs

# Weights that get no weight decay: biases, norms, tokens and position embeddings (as in the
# official code's decay mask; decaying them hurts small ViTs).
NO_DECAY = ["bias", "gamma", "beta", "token", "embedding"]


class NaNLossError(RuntimeError):
    """Training stopped because the loss became NaN or infinite."""


class StopOnNaN(keras.callbacks.Callback):
    """Like `keras.callbacks.TerminateOnNaN`, but the run ends with an error that says what to try."""

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.model.stop_training = True
            self.bad_batch = batch
            raise NaNLossError(
                f"loss became {float(loss)} at batch {batch}; training stopped. Lower --learning-rate, "
                "keep --clipnorm at 1.0 or check the input data for NaNs."
            )


class ResumeLog(keras.callbacks.Callback):
    """Keeps `log.csv` and the best-model checkpoint in step with the backup that a run resumes from.

    BackupAndRestore runs last of the callbacks, so an epoch counts as done only once its CSV row and
    its model.keras are written. A kill in between makes the resumed run repeat that epoch: at the
    run's first epoch this drops the rows of that epoch and later ones. It also gives the best-model
    checkpoint the epoch kept among the rows kept (`training.best_epoch.KeepBest.resume_from`),
    because a new process's checkpoint starts from nothing and would replace model.keras with the
    first epoch after the resume, better or not.
    """

    def __init__(self, path, checkpoint):
        super().__init__()
        self.path, self.checkpoint, self.first = path, checkpoint, True

    def on_epoch_begin(self, epoch, logs=None):
        if not self.first:
            return
        self.first = False
        if not os.path.exists(self.path):
            return
        # In place: CSVLogger already holds the file open for appending.
        with open(self.path, "r+", newline="") as f:
            reader = csv.DictReader(f)
            kept = [row for row in reader if int(row["epoch"]) < epoch]
            if reader.fieldnames:
                f.seek(0)
                writer = csv.DictWriter(f, reader.fieldnames, delimiter=",")
                writer.writeheader()
                writer.writerows(kept)
                f.truncate()
        self.checkpoint.resume_from(best_epoch.read_rows(self.path))


class EpochTimer(keras.callbacks.Callback):
    """Seconds of each epoch's training steps (validation excluded), for metrics.json's step time."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_test_begin(self, logs=None):  # validation at an epoch's end: stop the clock there
        if getattr(self, "start", None) is not None:
            self.seconds.append(time.perf_counter() - self.start)
            self.start = None

    def on_epoch_end(self, epoch, logs=None):
        if self.start is not None:  # no validation this epoch
            self.seconds.append(time.perf_counter() - self.start)
            self.start = None


DTYPE_POLICIES = ("auto", "float32", "mixed_bfloat16", "mixed_float16")


def accelerator():
    """"gpu" or "tpu" when the current backend computes on one, else None (a CPU)."""
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        return "gpu" if torch.cuda.is_available() else None
    if backend == "jax":
        import jax

        platform = jax.default_backend()  # "cpu", "gpu" (CUDA or ROCm) or "tpu"
        return platform if platform in ("gpu", "tpu") else None
    import tensorflow as tf

    for kind in ("TPU", "GPU"):
        if tf.config.list_logical_devices(kind):
            return kind.lower()
    return None


def dtype_policy(name):
    """The Keras dtype policy a recipe's `dtype_policy` stands for ("auto": bf16 on an accelerator)."""
    if name not in DTYPE_POLICIES:
        raise ValueError(f"dtype_policy={name!r} is not allowed; use one of {list(DTYPE_POLICIES)}")
    if name != "auto":
        return name
    return "mixed_bfloat16" if accelerator() else "float32"


def jit_compile(recipe, model):
    """Whether the train step is XLA-compiled, and the line that says why not where the recipe asks
    for it (None otherwise): the recipe's `jit_compile`, but never on torch (Keras' jit_compile
    there is torch.compile, which the recipes leave off), and not for a bfloat16 policy on
    TensorFlow on a CPU. There TensorFlow's own executor (oneDNN's bf16 kernels) ran the train step
    of ViT-S/16 at 224 px, batch 16, at 1.78x XLA's speed, while in float32 the two were equal
    (`python -m benchmarks.run --only "train ViT-S/16 224 b16"`, docs/performance.md)."""
    backend = keras.backend.backend()
    if not recipe.jit_compile or backend == "torch":
        return False, None
    if backend == "tensorflow" and model.dtype_policy.compute_dtype == "bfloat16" and accelerator() is None:
        return False, (f"note: the train step runs without XLA: under {model.dtype_policy.name} on a CPU, "
                       "TensorFlow's own executor is the faster (docs/performance.md)")
    return True, None


def build_model(recipe, info, weights=None):
    """A new ViT for `recipe`, or the model in `weights` adapted to the recipe (fine-tuning), with
    LoRA on its query and value projections when `recipe.lora_rank` is set (checked with the recipe,
    `recipes.check_lora`)."""
    if weights:
        model = _from_weights(recipe, info, weights)
        if recipe.lora_rank:
            model.enable_lora(recipe.lora_rank)  # the head stays trainable: fine-tuning gives a new one
        return model
    config = keras_vit.preset_config(recipe.model)
    for key in ("hidden_dim", "num_layers", "num_heads", "mlp_dim"):
        if getattr(recipe, key) is not None:
            config[key] = getattr(recipe, key)
    datasets.check_image_size(recipe.image_size, config["patch_size"])
    return keras_vit.ViT(
        **config,
        image_size=recipe.image_size,
        max_seq_len=serving_budget(recipe, config["patch_size"]),
        num_channels=info.num_channels,
        num_classes=info.num_classes,
        pooling=recipe.pooling,
        dropout_rate=recipe.dropout_rate,
        drop_path_rate=recipe.drop_path_rate,
        dtype=dtype_policy(recipe.dtype_policy),
        # A preset name is shown to users (the app's facts), so only an unmodified preset keeps it.
        preset=recipe.model if config == keras_vit.preset_config(recipe.model) else None,
        class_names=info.class_names,
    )


def serving_budget(recipe, patch_size):
    """The model's `max_seq_len`: None without --naflex; else the recipe's, by default the square
    model's token count (image_size / patch_size)^2."""
    if not recipe.naflex:
        return None
    return recipe.max_seq_len or (recipe.image_size // patch_size) ** 2


def _from_weights(recipe, info, source):
    """The model that `keras_vit.load` reads from `source`, adapted to the recipe: its image size
    (the position embeddings resampled, §3.2), dropout, dtype, the token budget of --naflex, the
    dataset's classes, and the paper's new head (§3.2) for another number of classes or
    `zero_head`."""
    model = keras_vit.load(source, image_size=recipe.image_size, drop_path_rate=recipe.drop_path_rate,
                           dropout_rate=recipe.dropout_rate, dtype=dtype_policy(recipe.dtype_policy),
                           num_classes=info.num_classes, class_names=list(info.class_names),
                           new_head=recipe.zero_head, max_seq_len=recipe.max_seq_len if recipe.naflex else None)
    budget = serving_budget(recipe, model.patch_size)
    if model.max_seq_len == budget:
        return model
    # --naflex without --max-seq-len: the default budget needs the checkpoint's patch size. The
    # variables do not depend on the budget, so they carry over as they are.
    config = dict(model.get_config(), max_seq_len=budget)
    return keras_vit.models.adapt(keras_vit.models.weights(model), model.grid_size, config, False)


def make_optimizer(recipe, total_steps, warmup_steps):
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=max(total_steps - warmup_steps, 1),
        warmup_target=recipe.learning_rate,
        warmup_steps=warmup_steps,
    )
    if recipe.optimizer == "adamw":
        opt = keras.optimizers.AdamW(schedule, weight_decay=recipe.weight_decay, global_clipnorm=recipe.clipnorm)
        opt.exclude_from_weight_decay(var_names=NO_DECAY)
        return opt
    if recipe.optimizer == "sgd":
        return keras.optimizers.SGD(schedule, momentum=recipe.momentum, global_clipnorm=recipe.clipnorm,
                                    weight_decay=recipe.weight_decay or None)
    raise ValueError(f"optimizer={recipe.optimizer!r} is not allowed; use 'adamw' or 'sgd'")


@dataclasses.dataclass(frozen=True)
class Splits:
    """A run's data, loaded once: {split name: (raw examples, Info)}, the training split's Info and
    its number of examples."""

    raws: dict
    info: object
    n_train: int


def load_splits(recipe):
    """Every split the recipe names, loaded once (`Splits`); a misspelt split fails at once."""
    if recipe.train_split is None:
        raise ValueError("train_split=None leaves nothing to train on; name a split, or evaluate a checkpoint "
                         "with python -m training.evaluate")
    raws = {}
    for name in (recipe.test_split, recipe.val_split, recipe.train_split):
        if name and name not in raws:
            raws[name] = datasets.load(recipe.dataset, name, recipe.data_dir, recipe.manual_dir, recipe.seed,
                                   recipe.strict_data)
    train_raw, info = raws[recipe.train_split]
    n_train = int(train_raw.cardinality())
    if n_train < 0:  # unknown length (a folder's, after skipping errors): its scan's count, else count once
        n_train = info.splits.get(recipe.train_split) or int(train_raw.reduce(0, lambda n, _: n + 1))
    check_steps(n_train, recipe)
    return Splits(raws, info, n_train)


def batches(recipe, model, splits, multiple=1):
    """(train, val or None, test or None, steps_per_epoch): `splits` as batched pipelines for
    `model`, each image prepared and normalized by its `preprocessing`; with --naflex, batches of
    patch sequences (normalized by the model's mean and std) whose sizes are multiples of
    `multiple` (the replicas)."""
    n_train = splits.n_train
    steps = recipe.steps_per_epoch or n_train // recipe.batch_size
    if recipe.naflex:  # batches of patch sequences, of one size per training budget
        seq_lens = recipes.parse_seq_lens(recipe.seq_lens, model.max_seq_len)
        sizes = naflex_data.batch_sizes(seq_lens, recipe.batch_size * model.max_seq_len, multiple)
        steps = recipe.steps_per_epoch or naflex_data.steps_per_epoch(n_train, sizes)

    def prep(raw, training):
        if recipe.naflex:
            return naflex_data.pipeline(raw, splits.info, model.patch_size, model.image_mean, model.image_std,
                                        model.max_seq_len, recipe.batch_size, training, seq_lens, recipe,
                                        recipe.seed, multiple)
        return datasets.pipeline(raw, splits.info, model.preprocessing, recipe.batch_size, training, recipe=recipe,
                                 seed=recipe.seed)

    def split(name):
        return prep(splits.raws[name][0], False) if name else None

    train = prep(splits.raws[recipe.train_split][0], True).repeat()
    return train, split(recipe.val_split), split(recipe.test_split), steps


def check_steps(n_train, recipe):
    """Raises ValueError when an epoch would take no optimizer step: the training batches drop their
    remainder, so a split smaller than one batch trains nothing (and a run would save its random
    initialization as if trained). Suggests the largest power of two that gives at least 4 steps an
    epoch."""
    if n_train >= recipe.batch_size:  # with --steps-per-epoch too: an empty split repeated gives no batch
        return
    fit = 2 ** int(math.log2(max(n_train // 4, 1)))
    raise ValueError(f"the training split {recipe.train_split!r} of {recipe.dataset!r} holds {n_train} images, fewer "
                     f"than --batch-size {recipe.batch_size}, so an epoch would take no training step (the last "
                     f"incomplete batch is dropped); use --batch-size {fit} (at least 4 steps an epoch) or at "
                     f"most {n_train}")


def callbacks(out_dir, monitor, dist, checkpoints=None):
    """Progress bars come from fit(verbose=1); these add logs, checkpoints, resume and NaN checks.

    `checkpoints` (a `training.checkpoint_formats` object; Keras files in `out_dir` when None) makes
    the best-epoch and backup callbacks. Saving is a collective under multi-process JAX (it creates
    variables), so every process runs them.
    """
    mode = "max" if "accuracy" in monitor else "min"
    best, backup = (checkpoints or checkpoint_formats.KerasCheckpoints(out_dir, dist)).callbacks(monitor, mode)
    cbs = [StopOnNaN(), keras.callbacks.TerminateOnNaN(), best]
    if dist.is_chief:
        log = os.path.join(out_dir, "log.csv")
        cbs += [ResumeLog(log, best), keras.callbacks.CSVLogger(log, append=True),
                keras.callbacks.TensorBoard(os.path.join(out_dir, "tensorboard"))]
    # Last, so that an epoch is backed up only after its log row and checkpoint (callbacks run in
    # list order). The same command resumes a killed run from its last backed-up epoch. A kill while
    # the backup is being written leaves a torn file; with double_checkpoint, Keras keeps the one
    # before and resumes from it (one epoch earlier) when the latest cannot be read. Orbax never
    # commits a torn save, so its latest committed backup is always whole.
    cbs.append(backup)
    return cbs


def _step_seconds(epoch_seconds, steps):
    """Median seconds per training step over this process's epochs after its first (which compiles);
    the first epoch's when it ran only one."""
    import statistics

    later = epoch_seconds[1:] or epoch_seconds
    return round(statistics.median(later) / steps, 5) if later and steps else None


def _trainable_count(model):
    """Number of trainable weights (LoRA freezes variables one by one, so not the layers' count)."""
    return int(sum(math.prod(v.shape) for v in model.trainable_weights))


def run(recipe, out_dir, weights=None, dist=None, verbose=1, plan=None, checkpoint_format=None, extra_callbacks=(),
        ood=None):
    """Trains `recipe` (optionally from `weights`), evaluates on the test split, writes reports.

    The recipe, `weights` and `ood` (the out-of-domain (method, blocks), as `ood_stats.choice`
    returns them) were checked where they came in (`python -m training.train`); without `ood`, the
    recipe's choice is checked here. Each split is loaded once (`load_splits`).

    `plan` is what `training.runs.plan` decided for `out_dir` (decided here when not given): a re-run
    that the run in `out_dir` cannot take is refused before anything is built or written. Nothing is
    written until the data is found and the model is built and compiled, and a run that fails
    before its first epoch is finished leaves nothing behind (`training.runs`). `checkpoint_format`
    is "keras", "orbax" or None (on a resume the run's own, which a resume may not change; else
    orbax for multi-process JAX runs, see `training.checkpoint_formats`). `extra_callbacks` run
    before the run's own (an experiment that keeps every epoch's weights).

    Returns the metrics dict that is also written to `out_dir/metrics.json`; its "kept" says which
    epoch model.keras is (`training.best_epoch.kept`).
    """
    dist = dist or distribute.Distribution()
    ood = ood or ood_stats.choice(recipe.ood_method, recipe.ood_blocks)
    plan = plan or runs.plan(out_dir, runs.configuration(recipe, weights))
    checkpoints = checkpoint_formats.for_run(runs.checkpoint_format(plan, checkpoint_format), out_dir, dist)
    keras.utils.set_random_seed(recipe.seed)
    splits = load_splits(recipe)
    info = splits.info
    with dist.scope():
        model = build_model(recipe, info, weights)
        train, val, test, steps = batches(recipe, model, splits, multiple=dist.num_replicas)
        warmup = int(recipe.warmup_epochs * steps)
        xla, note = jit_compile(recipe, model)
        if note and dist.is_chief and verbose:
            print(note, flush=True)
        model.compile(
            optimizer=make_optimizer(recipe, recipe.epochs * steps, warmup),
            loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=recipe.label_smoothing),
            metrics=["accuracy"],
            jit_compile=xla,
        )
    if dist.is_chief:
        runs.commit(plan, {**runs.configuration(recipe, weights), "backend": keras.backend.backend(),
                           "dtype_policy_used": model.dtype_policy.name, "jit_compile_used": xla,
                           "malloc": malloc.in_use(),
                           "checkpoint_format": checkpoints.name})
    start, timer = time.time(), EpochTimer()
    monitor = "val_accuracy" if val is not None else "loss"
    try:
        if dist.is_chief:
            held = recipe.val_split or recipe.test_split
            examples.write(splits.raws[held][0] if held else None, info, out_dir)
        history = model.fit(dist.shard(train), epochs=recipe.epochs, steps_per_epoch=steps, validation_data=val,
                            callbacks=[timer, *extra_callbacks] + callbacks(out_dir, monitor, dist, checkpoints),
                            verbose=verbose)
    except BaseException:
        if dist.is_chief:
            runs.undo(plan)
        raise
    train_seconds = time.time() - start
    # Loading and evaluating are collectives too: every process takes part, only the chief's
    # reports land in out_dir.
    best = checkpoints.load_best()
    report_dir = dist.checkpoint_dir(out_dir)
    os.makedirs(report_dir, exist_ok=True)  # an orbax run's other processes have written nothing there yet
    # The demo's out-of-domain warning reads these statistics of the training images (keras_vit.ood).
    held = splits.raws[recipe.val_split][0] if recipe.val_split else None
    stats = ood_stats.write(best, splits.raws[recipe.train_split][0], info, held, recipe.train_split, report_dir,
                            choice=ood)
    if stats.off is not None and dist.is_chief:
        print(stats.off)
    # Which epoch model.keras is, from the log by the rule that chose it (training.best_epoch).
    kept = best_epoch.kept(os.path.join(out_dir, "log.csv"), monitor, recipe.epochs) if dist.is_chief else None
    if test is None:
        metrics = {"kept": kept}
        reports.write_json(report_dir, metrics)
    else:
        metrics = reports.write(best, test, info, recipe, report_dir, train_seconds, history,
                                trainable=_trainable_count(model), step_seconds=_step_seconds(timer.seconds, steps),
                                kept=kept)
    checkpoints.finish()
    return metrics if dist.is_chief else None

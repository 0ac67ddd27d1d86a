"""Images of many aspect ratios: resize to a square, pad to a square, aspect buckets, or NaFlex.

    KERAS_BACKEND=tensorflow python -m experiments.naflex_aspect --steps 1500 \\
        --out experiments/results/naflex_aspect.json --docs docs/naflex.md

The data is `fashion_mnist_aspect` (training.datasets.aspect): Fashion-MNIST's garments on canvases
from 1:3 to 3:1, the 10,000 test canvases drawn the same way. Four models of one architecture (the
shipped `fashion_mnist` recipe's: D 64, 6 blocks, 4 heads, MLP 128, patch 4, average pooling) train
from scratch with one recipe (AdamW, lr 3e-3, warmup then cosine, label smoothing 0.1), the same
number of steps of 128 images, at one token budget of 64 patches:

    resize   each canvas resized to 32 x 32 (an 8 x 8 grid): squashed up to 3x
    pad      padded with black to a square, then resized to 32 x 32: the garment shrinks up to 3x
    buckets  resized to the nearest of five aspect buckets within 64 patches (the budget's grids of
             1:3, 1:2, 1:1, 2:1, 3:1) with `dynamic_image_size`; one bucket a batch
    naflex   patch sequences of at most 64 patches, each canvas at its own aspect ratio

Measured: test accuracy at 64 patches; training images/s and tokens/s (patches, and every position
computed, padding included), timed over the steps after each input shape's first (which compiles);
the number of distinct input shapes trained on, each one a compilation. Then accuracy against the
inference budget (16, 36, 64 and 144 patches): the NaFlex model on patch sequences, the resize
model on squares of 4 x 4, 6 x 6, 8 x 8 and 12 x 12 patches (its position table resampled).
"""

import math
import os
import time

import numpy as np

from commands import cli

PROG = "python -m experiments.naflex_aspect"
WAYS = ("resize", "pad", "buckets", "naflex")
MODEL = dict(image_size=32, patch_size=4, hidden_dim=64, num_layers=6, num_heads=4, mlp_dim=128, pooling="gap",
             num_channels=1, num_classes=10)
BUDGET, PATCH, BATCH = 64, 4, 128
BUDGETS = (16, 36, 64, 144)
BUCKET_ASPECTS = (1 / 3, 1 / 2, 1.0, 2.0, 3.0)  # width / height
MARKERS = ("<!-- naflex-aspect -->", "<!-- /naflex-aspect -->")


def buckets():
    """[(aspect, (h, w) grid)]: each bucket's grid, the largest within the budget at its aspect."""
    from keras_vit import naflex

    return [(a, naflex.budget_grid(100, round(100 * a), PATCH, BUDGET)) for a in BUCKET_ASPECTS]


def square_inputs(way, grid=None):
    """A tf.data map: canvas uint8 (H, W, 1) -> normalized float32 (S, S, 1) for "resize" and
    "pad", at `grid` (h, w) patches (default 8 x 8)."""
    import tensorflow as tf

    h, w = grid or (8, 8)

    def prepare(image, label):
        image = tf.cast(image, tf.float32)
        if way == "pad":  # black borders to a centered square
            side = tf.reduce_max(tf.shape(image)[:2])
            image = tf.image.resize_with_crop_or_pad(image, side, side)
        image = tf.image.resize(image, (h * PATCH, w * PATCH), method="bicubic", antialias=True)
        return (tf.clip_by_value(image, 0.0, 255.0) / 255.0 - 0.5) / 0.5, tf.one_hot(label, 10)

    return prepare


def bucket_inputs():
    """A tf.data map: canvas -> (normalized image at its bucket's size, one-hot, bucket index)."""
    import tensorflow as tf

    table = buckets()
    logs = tf.constant([math.log(a) for a, _ in table], tf.float32)

    def prepare(image, label):
        shape = tf.cast(tf.shape(image), tf.float32)
        index = tf.argmin(tf.abs(logs - tf.math.log(shape[1] / shape[0])))
        branches = [lambda g=g: square_inputs("resize", g)(image, label)[0] for _, g in table]
        return tf.switch_case(tf.cast(index, tf.int32), branches), tf.one_hot(label, 10), index

    return prepare


def train_data(way, seed=0, split="train"):
    """The repeated, shuffled training batches of `way`, from `split` of the dataset."""
    import tensorflow as tf

    from training.datasets import aspect
    from training.datasets import naflex as naflex_data

    ds, info = aspect.load(split)
    autotune = tf.data.AUTOTUNE
    if way == "naflex":
        return naflex_data.pipeline(ds, info, PATCH, (0.5,), (0.5,), BUDGET, BATCH, True, seed=seed).repeat()
    if way == "buckets":
        ds = ds.map(bucket_inputs(), num_parallel_calls=autotune).cache().shuffle(20_000, seed=seed)
        ds = ds.group_by_window(key_func=lambda x, y, k: k, window_size_func=lambda k: tf.constant(BATCH, tf.int64),
                                reduce_func=lambda k, w: w.map(lambda x, y, _: (x, y)).batch(BATCH, True))
        return ds.repeat().prefetch(autotune)
    ds = ds.map(square_inputs(way), num_parallel_calls=autotune).cache().shuffle(20_000, seed=seed)
    return ds.batch(BATCH, drop_remainder=True).repeat().prefetch(autotune)


def test_data(way, budget=BUDGET, split="test"):
    """The canvases of `split` as `way` gives them to its model, at `budget` patches."""
    import tensorflow as tf

    from training.datasets import aspect
    from training.datasets import naflex as naflex_data

    ds, info = aspect.load(split)
    if way == "naflex":
        return naflex_data.pipeline(ds, info, PATCH, (0.5,), (0.5,), budget, 256, False)
    if way == "buckets":  # batches of one bucket each
        return ds.map(bucket_inputs()).group_by_window(
            key_func=lambda x, y, k: k, window_size_func=lambda k: tf.constant(256, tf.int64),
            reduce_func=lambda k, w: w.map(lambda x, y, _: (x, y)).batch(256))
    side = round(math.sqrt(budget))
    return ds.map(square_inputs(way, (side, side)), num_parallel_calls=tf.data.AUTOTUNE).batch(256)


def step_timer():
    """A Keras callback that keeps the seconds of each training step in its `times`."""
    import keras

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.start)

    return StepTimer()


def watched(ds, log):
    """`ds` whose batches append (input shape, patches) to `log` as they are drawn, in step order."""
    import tensorflow as tf

    def note(shape, patches):
        log.append((tuple(int(v) for v in shape.numpy()), int(patches)))
        return 0

    def mark(x, y):
        sequences = isinstance(x, dict)
        shape = tf.shape(x["patches"] if sequences else x)
        patches = (tf.reduce_sum(tf.cast(x["patch_valid"], tf.int32)) if sequences
                   else shape[0] * (shape[1] // PATCH) * (shape[2] // PATCH))
        done = tf.py_function(note, [shape, patches], tf.int32)
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(tf.identity, (x, y))

    return ds.map(mark).prefetch(tf.data.AUTOTUNE)  # sequential: the log keeps the steps' order


def run_way(way, steps, seed=0, split="train"):
    """Trains `way`'s model; returns (model, its record)."""
    import keras

    import keras_vit
    from training import loop, recipes

    keras.utils.set_random_seed(seed)
    model = keras_vit.ViT(**MODEL, dynamic_image_size=way != "naflex", max_seq_len=BUDGET if way == "naflex" else None)
    recipe = recipes.get("fashion_mnist")
    model.compile(optimizer=loop.make_optimizer(recipe, steps, steps // 20),
                  loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1),
                  metrics=["accuracy"], jit_compile=keras.backend.backend() != "torch")
    log, timer = [], step_timer()
    model.fit(watched(train_data(way, seed, split).take(steps), log), epochs=1, steps_per_epoch=steps,
              callbacks=[timer], verbose=2)
    log = log[:steps]
    shapes = list(dict.fromkeys(shape for shape, _ in log))
    seen, timed = set(), []
    for seconds, (shape, patches) in zip(timer.times, log):  # a shape's first step compiles: not timed
        if shape in seen:
            timed.append((seconds, shape, patches))
        seen.add(shape)
    total = sum(t for t, _, _ in timed)
    positions = [shape[0] * (shape[1] if way == "naflex" else shape[1] * shape[2] // PATCH**2) for _, shape, _ in timed]
    record = {"steps": steps, "distinct_shapes": len(shapes), "shapes": shapes, "timed_steps": len(timed),
              "images_per_s": sum(shape[0] for _, shape, _ in timed) / total,
              "patches_per_s": sum(p for _, _, p in timed) / total, "positions_per_s": sum(positions) / total,
              "final_loss": float(model.history.history["loss"][-1])}
    return model, record


def accuracy(model, data):
    correct = total = 0
    for x, y in data.as_numpy_iterator():
        correct += int(np.sum(np.argmax(model.predict_on_batch(x), -1) == np.argmax(y, -1)))
        total += len(y)
    return correct / total


def tables(result):
    """The two Markdown tables of a run's `result`."""
    rows = ["| input | test accuracy | images/s | patches/s | positions/s | distinct input shapes |",
            "|---|---:|---:|---:|---:|---:|"]
    for way in WAYS:
        r = result["ways"][way]
        rows.append(f"| {way} | {r['test_accuracy']:.4f} | {r['images_per_s']:.0f} | {r['patches_per_s']:.0f} | "
                    f"{r['positions_per_s']:.0f} | {r['distinct_shapes']} |")
    rows += ["", "| inference budget (patches) | " + " | ".join(str(b) for b in BUDGETS) + " |",
             "|---|" + "---:|" * len(BUDGETS)]
    for way in ("naflex", "resize"):
        rows.append(f"| {way} model | " + " | ".join(f"{result['budgets'][way][str(b)]:.4f}" for b in BUDGETS) + " |")
    return "\n".join(rows)


def main(argv=None):
    parser = cli.parser(PROG, __doc__)
    parser.add_argument("--steps", type=int, default=1500, help="training steps of each model")
    parser.add_argument("--ways", default=",".join(WAYS), help="the inputs compared, from " + ", ".join(WAYS))
    parser.add_argument("--images", type=int, default=None,
                        help="only the first N training and N test images (default: all; a short check)")
    parser.add_argument("--out", default=None, help="the JSON record to write (default: none)")
    parser.add_argument("--docs", default=None, help="the page whose table to replace (default: none)")
    args = parser.parse_args(argv)
    cli.quiet_logs()
    cli.import_tensorflow()
    import keras

    from benchmarks.cpu import cpu_info
    from experiments.common import publish

    start, result = time.time(), {"ways": {}, "budgets": {}}
    cut = "" if args.images is None else f"[:{args.images}]"
    train_split, test_split = "train" + cut, "test" + cut
    for way in args.ways.split(","):
        model, record = run_way(way, args.steps, split=train_split)
        record["test_accuracy"] = accuracy(model, test_data(way, split=test_split))
        result["ways"][way] = record
        if way in ("naflex", "resize"):
            result["budgets"][way] = {str(b): accuracy(model, test_data(way, b, test_split)) for b in BUDGETS}
        print(way, record, result["budgets"].get(way), flush=True)
    cpu = cpu_info()
    result.update(backend=keras.backend.backend(), cpu=cpu["model"], cores=cpu["cores"], flags=cpu["key_flags"],
                  load_average=os.getloadavg()[0], seconds=round(time.time() - start), steps=args.steps,
                  images=args.images)
    images = "" if args.images is None else f" --images {args.images}"
    text = (f"{MARKERS[0]}\n{tables(result)}\n\nMeasured with `KERAS_BACKEND={result['backend']} {PROG} --steps "
            f"{args.steps}{images}` on {cpu['model']} ({cpu['cores']} CPUs, {' '.join(cpu['key_flags'])}), "
            f"1-minute load average {result['load_average']:.1f} at the end, {result['seconds'] // 60} minutes in "
            f"all.\n{MARKERS[1]}")
    publish(text, result, args.out, args.docs, MARKERS)


if __name__ == "__main__":
    main()

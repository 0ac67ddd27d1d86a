"""Out-of-domain scores measured on near and far shifts, for the shipped Fashion-MNIST checkpoint and
for a model that `python -m training.train` trains here on a folder of 8 of its 10 classes.

    KERAS_BACKEND=tensorflow python -m experiments.ood --out experiments/results/ood.json --docs docs/app.md

In-domain: the Fashion-MNIST test images of the model's classes. The statistics of each score come
from training images (10,000 for the shipped model), the threshold from 5,000 other training images
(it flags 5% of them), as `training.ood_stats` sets them.

Near shifts: the two held-out classes (the folder model only: Shirt and Ankle boot, whose
neighbours T-shirt, Pullover, Coat, Sandal and Sneaker it knows), and test images blurred, with
their contrast lowered, inverted, or shown as a product photo (a dark garment on white, four times
the size) without the demo's Fashion-MNIST-style preprocessing.

Far shifts: scikit-learn's handwritten digits (upscaled); scikit-image's and scikit-learn's sample
photos, whole and as random crops flipped and recoloured, with and without the Fashion-MNIST-style
preprocessing (as the demo prepares uploads, `apps.images.model_pixels`); uniform and Gaussian
noise; flat images of every grey level.

For each score of `keras_vit.ood`, on the pooled features or on every block's mean token and the
pooled features, it reports the AUROC (1.0: every shifted image scores above every test image) and
the FPR at 95% TPR (the share of shifted images that score below the 95th percentile of the test
images: those a 5% false-alarm threshold would miss), over the near and over the far shifts, per
set, the false alarms at the stored-style threshold on the test images, and the percentile of
scikit-image's rocket photo (an image that passed as a garment under the earlier warning).
"""

import json
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks.cpu import cpu_info
from experiments.common import CHECKPOINT, fashion_mnist, publish
from experiments.ood.shifts import auroc, far_shifts, for_model, fpr_at_95, near_shifts, rocket

PROG = "python -m experiments.ood"
FIT_IMAGES, HELD_OUT_IMAGES = 10_000, 5_000
HELD_OUT_CLASSES = (6, 9)  # Shirt and Ankle boot, left out of the folder model
# (method, feature sets): every score on the pooled features, and the feature-space ones on all blocks too.
VARIANTS = (("msp", "pooled"), ("energy", "pooled"), ("mahalanobis", "pooled"), ("mahalanobis", "all+pooled"),
            ("rmds", "pooled"), ("rmds", "all+pooled"), ("vim", "pooled"), ("knn", "pooled"), ("knn", "all+pooled"))
TARGETS = {"far_auroc": 0.99, "far_fpr95": 0.05, "near_auroc": 0.85}  # on the shipped model
BEGIN, END = "<!-- ood -->", "<!-- /ood -->"


def measure(model, fit, fit_labels, held, test, near, far, max_images=None, batch_size=256):
    """[{method, blocks, near/far AUROC and FPR@95, per-set AUROC, test false alarms, rocket}] for
    `model`: statistics fit on `fit` (N, H, W, C) with `fit_labels`, thresholds on `held`,
    evaluated on the in-domain `test` against the shifted sets {name: pixels} `near` and `far`."""
    from keras_vit import ood

    sets = {"fit": fit, "held": held, "test": test, "rocket": rocket(model), **near, **far}
    if max_images:  # every set capped, for a quick look; the order of each set is random or spread
        sets = {k: v[:max_images] for k, v in sets.items()}
    # One pass per set: every block's mean token and the pooled features, (B, L + 1, D); the
    # pooled ones alone are the last set.
    feats = {k: ood.features(model, v, "all+pooled", batch_size) for k, v in sets.items()}
    classifier = ood.classifier_weights(model)
    rows = []
    for method, blocks in VARIANTS:
        take = (lambda f: f[:, -1:]) if blocks == "pooled" else (lambda f: f)  # noqa: E731
        chosen, pooled = ood.block_choice(blocks, model.num_layers)
        stats = ood.fit_features(method, take(feats["fit"][0]), feats["fit"][1], fit_labels[: len(feats["fit"][0])],
                                 chosen, pooled,
                                 classifier)
        score = {k: ood.scores(stats, take(f), logits) for k, (f, logits) in feats.items()}
        stats = ood.with_threshold(stats, score["held"], 0.05)
        inside = score["test"]
        row = {"method": method, "blocks": blocks, "sets": {}}
        for kind, group in (("near", near), ("far", far)):
            outside = np.concatenate([score[k] for k in group]) if group else np.zeros(0)
            row[f"{kind}_auroc"] = auroc(inside, outside) if group else None
            row[f"{kind}_fpr95"] = fpr_at_95(inside, outside) if group else None
            row["sets"].update({k: {"kind": kind, "images": len(score[k]), "auroc": auroc(inside, score[k]),
                                    "flagged": float(np.mean(score[k] > stats.threshold))} for k in group})
        row["false_alarm"] = float(np.mean(inside > stats.threshold))
        row["rocket_percentile"] = float(stats.percentile(score["rocket"])[0])
        row["rocket_flagged"] = bool(score["rocket"][0] > stats.threshold)
        rows.append(row)
    return rows


def spread(n, limit, offset, step):
    """Indices of up to `limit` of n items, every `step`-th from `offset`."""
    return np.arange(offset, n, step)[:limit]


def shipped(args, data, rng):
    """The measurement of the shipped checkpoint."""
    import keras_vit

    train, train_labels, test, _ = data
    model = keras_vit.load(args.checkpoint)
    if tuple(model.image_size) != (28, 28) or model.num_channels != 1 or model.num_classes != 10:
        raise ValueError(f"{args.checkpoint} takes {model.image_size} images with {model.num_channels} channels and "
                         f"{model.num_classes} classes; {PROG} measures Fashion-MNIST checkpoints (28 x 28, one "
                         "channel, 10 classes)")
    step = max(2, len(train) // FIT_IMAGES)  # the fit takes every step-th image, the threshold the ones after
    fit, held = spread(len(train), FIT_IMAGES, 0, step), spread(len(train), HELD_OUT_IMAGES, 1, step)
    test = test[: args.test_images]
    rows = measure(model, for_model(train[fit], model), train_labels[fit], for_model(train[held], model),
                   for_model(test, model), near_shifts(model, test, rng), far_shifts(model, rng), args.max_images)
    return {"checkpoint": args.checkpoint, "classes": 10, "rows": rows}


def folder_model(args, data, rng, work):
    """Trains a model on a folder of 8 Fashion-MNIST classes with the training CLI, and measures it
    with the other 2 classes as a near shift."""
    from PIL import Image

    from apps.sources import FASHION_MNIST_CLASSES
    from experiments import common
    from training.examples import safe_name

    train, train_labels, test, test_labels = data
    kept = [c for c in range(10) if c not in HELD_OUT_CLASSES]
    root = os.path.join(work, "garments")
    folder = {c: safe_name(FASHION_MNIST_CLASSES[c]) for c in kept}  # "T-shirt/top" -> "T-shirt_top"
    fit_rows, held_rows = [], []
    for c in kept:
        rows = np.flatnonzero(train_labels == c)
        os.makedirs(os.path.join(root, folder[c]))
        for i in rows[: args.folder_per_class]:
            Image.fromarray(train[i]).convert("RGB").save(os.path.join(root, folder[c], f"{i}.png"))
        fit_rows.append(rows[: args.folder_per_class])
        held_rows.append(rows[args.folder_per_class: args.folder_per_class + HELD_OUT_IMAGES // len(kept)])
    out = os.path.join(work, "run")
    command = [sys.executable, "-m", "training.train", "--recipe", "fashion_mnist", "--dataset", root,
               "--val-split", "validation", "--test-split", "validation", "--epochs", str(args.folder_epochs),
               "--out", out, "--verbose", "0"]
    model, seconds = common.train(command, out)  # `train` here is the training images
    # Folder classes are sorted by name; the labels follow that order.
    order = sorted(folder.values())
    relabel = {c: order.index(folder[c]) for c in kept}
    fit, held = np.concatenate(fit_rows), np.concatenate(held_rows)
    inside = np.isin(test_labels, kept)
    test_in = test[inside][: args.test_images]
    test_out = test[~inside][: args.test_images]
    near = {"held-out classes (Shirt, Ankle boot)": for_model(test_out, model), **near_shifts(model, test_in, rng)}
    rows = measure(model, for_model(train[fit], model), np.array([relabel[c] for c in train_labels[fit]]),
                   for_model(train[held], model), for_model(test_in, model), near, far_shifts(model, rng),
                   args.max_images)
    with open(os.path.join(out, "metrics.json")) as f:
        accuracy = json.load(f).get("test_accuracy")
    return {"command": " ".join(["python", *command[1:]]).replace(work + os.sep, ""), "classes": len(kept),
            "train_images": len(fit), "epochs": args.folder_epochs, "train_seconds": round(seconds, 1),
            "validation_accuracy": accuracy, "rows": rows}


def best(rows):
    """The row with the highest mean of near- and far-shift AUROC: how DEFAULT_METHOD and
    DEFAULT_BLOCKS of `keras_vit.ood` were chosen, on the shipped checkpoint."""
    return max(rows, key=lambda r: (r["near_auroc"] + r["far_auroc"]) / 2)


def _name(row):
    names = {"msp": "maximum softmax (1 - MSP)", "energy": "energy", "mahalanobis": "Mahalanobis",
             "rmds": "relative Mahalanobis (RMDS)", "vim": "ViM", "knn": "KNN (k = 50)"}
    where = "pooled features" if row["blocks"] == "pooled" else "every block and pooled"
    return f"{names[row['method']]}, {where}"


def table(result):
    """The docs' block (between BEGIN and END) from the JSON `result`."""
    from keras_vit import ood

    cpu = result["cpu"]
    lines = [BEGIN, f"Measured with `KERAS_BACKEND={result['backend']} {PROG} --out experiments/results/ood.json "
             f"--docs docs/app.md` ({result['seconds']:.0f} s on {cpu['model']}, {cpu['cores']} cores, "
             f"{', '.join(cpu['key_flags']) or 'no AVX-512 or AMX'}). AUROC and FPR at "
             "95% TPR against the Fashion-MNIST test images of the model's classes; false alarms: the test images "
             "above a threshold that flags 5% of held-out training images; rocket: the percentile of the rocket "
             "photo among those held-out images, and whether it is flagged."]
    for key, title in (("shipped", "The shipped checkpoint (10 classes)"),
                       ("folder", "A model trained by the CLI on a folder of 8 classes")):
        part = result[key]
        lines += ["", f"**{title}**" + (f": `{part['command']}`, {part['train_seconds']:.0f} s, validation accuracy "
                                        f"{part['validation_accuracy']:.1%}." if key == "folder" else "."), "",
                  "| score | near AUROC | near FPR@95 | far AUROC | far FPR@95 | false alarms | rocket |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for row in part["rows"]:
            default = row["method"] == ood.DEFAULT_METHOD and row["blocks"] == ood.DEFAULT_BLOCKS
            name = f"**{_name(row)} (default)**" if default else _name(row)
            lines.append(f"| {name} | {row['near_auroc']:.3f} | {row['near_fpr95']:.1%} | {row['far_auroc']:.3f} | "
                         f"{row['far_fpr95']:.1%} | {row['false_alarm']:.1%} | {row['rocket_percentile']:.1f}"
                         f"{' (flagged)' if row['rocket_flagged'] else ''} |")
    chosen = next(r for r in result["shipped"]["rows"]
                  if r["method"] == ood.DEFAULT_METHOD and r["blocks"] == ood.DEFAULT_BLOCKS)
    top = best(result["shipped"]["rows"])
    lines += ["", f"The default of `keras_vit.ood` is the score with the highest mean of near and far AUROC on the "
              f"shipped checkpoint: {_name(top)}" + ("." if top is chosen else
                                                    f"; this run's best differs from the default ({_name(chosen)}).")]
    lines += ["", "Per set, the default score on the shipped checkpoint (AUROC; share flagged at the threshold):", "",
              "| shift | set | AUROC | flagged |", "|---|---|---:|---:|"]
    for name, s in chosen["sets"].items():
        lines.append(f"| {s['kind']} | {name} ({s['images']:,}) | {s['auroc']:.3f} | {s['flagged']:.1%} |")
    met = {k: chosen[k] >= v if k.endswith("auroc") else chosen[k] <= v for k, v in TARGETS.items()}
    lines += ["", "Targets on the shipped checkpoint: far AUROC >= 0.99 "
              f"({chosen['far_auroc']:.4f}: {'met' if met['far_auroc'] else 'not met'}), far FPR@95 <= 5% "
              f"({chosen['far_fpr95']:.2%}: {'met' if met['far_fpr95'] else 'not met'}), near AUROC >= 0.85 "
              f"({chosen['near_auroc']:.4f}: {'met' if met['near_auroc'] else 'not met'}).", END]
    return "\n".join(lines)


def main(argv=None):
    from commands import cli

    parser = cli.parser(PROG, __doc__)
    parser.add_argument("--checkpoint", default=CHECKPOINT, help="a Fashion-MNIST .keras file (default: %(default)s)")
    parser.add_argument("--test-images", type=int, default=10_000, help="in-domain test images (default: all)")
    parser.add_argument("--folder-per-class", type=int, default=1500, help="training images per class of the "
                        "folder model (default: %(default)s)")
    parser.add_argument("--folder-epochs", type=int, default=10, help="its epochs (default: %(default)s)")
    parser.add_argument("--max-images", type=int, default=None, help="cap every set at this many images, for a "
                        "quick look (default: no cap; the docs' figures have none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shifts (default: %(default)s)")
    parser.add_argument("--out", help="also write the JSON record here (default: print the tables only)")
    parser.add_argument("--docs", help="also write the tables into this page, between its markers (default: "
                        "print them only)")
    args = parser.parse_args(argv)
    for flag in ("test_images", "folder_per_class", "folder_epochs", "max_images"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)} is not allowed; use a positive integer")

    cli.quiet_logs()
    import keras

    start = time.time()
    data = fashion_mnist()
    with cli.one_line_errors(PROG):
        result = {"backend": keras.backend.backend(), "cpu": {k: v for k, v in cpu_info().items() if k != "flags"},
                  "shipped": shipped(args, data, np.random.default_rng(args.seed))}
        with tempfile.TemporaryDirectory(prefix="ood-folder-") as work:
            result["folder"] = folder_model(args, data, np.random.default_rng(args.seed), work)
    result["seconds"] = round(time.time() - start, 1)
    publish(table(result), result, args.out, args.docs, (BEGIN, END))


if __name__ == "__main__":
    main()

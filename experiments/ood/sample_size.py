"""How many images the out-of-domain statistics need: the default score of `keras_vit.ood` on the
shipped Fashion-MNIST checkpoint, fit on fewer training images and thresholded on fewer held-out
ones, as a small run gives them.

    KERAS_BACKEND=tensorflow python -m experiments.ood.sample_size \\
        --out experiments/results/ood_sample_size.json --docs docs/app.md

Each draw takes `fit` training images (class-balanced at random) for the statistics and `held` other
training images for the threshold (set, as `training.ood_stats` sets it, to flag 5% of them). It
then reports, over `--draws` draws: the share of the Fashion-MNIST test images that the threshold
flags (the false alarms a user sees; 5% is the aim), its spread between draws, and the AUROC of the
test images against the far shifts of `python -m experiments.ood` (digits, photos, noise, flat
images) and its near shifts (blurred, low-contrast, inverted, product photos).
`training.ood_stats.MIN_FIT_IMAGES` and `MIN_HELD_OUT_IMAGES` come from this table (`minimums`):
the fewest held-out images for which every draw flagged between half and twice the 5% aimed at, and
the fewest fit images whose far-shift AUROC is within 0.02 of the full fit's.
"""

import json
import sys
import time

import numpy as np

from benchmarks.cpu import cpu_info
from experiments.common import CHECKPOINT, fashion_mnist, publish
from experiments.ood.shifts import auroc, far_shifts, for_model, near_shifts

PROG = "python -m experiments.ood.sample_size"
FIT_SIZES = (20, 50, 100, 200, 500, 1000, 10_000)
HELD_SIZES = (5, 10, 20, 50, 100, 200, 1000)
FULL_FIT, FULL_HELD = 10_000, 5_000  # what training.ood_stats takes from a large training split
AIM = 0.05
AUROC_SLACK = 0.02
BEGIN, END = "<!-- ood-sample-size -->", "<!-- /ood-sample-size -->"


def balanced(labels, n, rng, exclude=()):
    """n indices of `labels` spread over the classes as evenly as n allows, at random, none in `exclude`."""
    free = np.setdiff1d(np.arange(len(labels)), np.asarray(exclude, dtype=int))
    classes = np.unique(labels)
    picked = []
    for i, c in enumerate(rng.permutation(classes)):
        share = n // len(classes) + (i < n % len(classes))
        picked.append(rng.choice(free[labels[free] == c], share, replace=False))
    return np.concatenate(picked)


def draw(feats, labels, stats_of, n_fit, n_held, rng):
    """{false_alarm, far_auroc, near_auroc} of one draw: statistics on n_fit images, threshold on n_held others."""
    from keras_vit import ood

    fit = balanced(labels, n_fit, rng)
    held = balanced(labels, n_held, rng, exclude=fit)
    stats = stats_of(feats["train"][0][fit], feats["train"][1][fit], labels[fit])
    score = {k: ood.scores(stats, f, logits) for k, (f, logits) in feats.items() if k != "train"}
    held_scores = ood.scores(stats, feats["train"][0][held], feats["train"][1][held])
    stats = ood.with_threshold(stats, held_scores, 0.05)
    return {"false_alarm": float(np.mean(score["test"] > stats.threshold)),
            "far_auroc": auroc(score["test"], score["far"]), "near_auroc": auroc(score["test"], score["near"])}


def measure(model, train, train_labels, test, draws, seed):
    """[{fit, held, false_alarm (mean, lo, hi over draws), far_auroc, near_auroc}] over the grid."""
    from keras_vit import ood

    rng = np.random.default_rng(seed)
    sets = {"train": for_model(train, model), "test": for_model(test, model),
            "near": np.concatenate(list(near_shifts(model, test, rng).values())),
            "far": np.concatenate(list(far_shifts(model, rng).values()))}
    feats = {k: ood.features(model, v, ood.DEFAULT_BLOCKS) for k, v in sets.items()}
    chosen, pooled = ood.block_choice(ood.DEFAULT_BLOCKS, model.num_layers)

    def stats_of(f, logits, labels):
        return ood.fit_features(ood.DEFAULT_METHOD, f, logits, labels, chosen, pooled)

    grid = [(n, FULL_HELD) for n in FIT_SIZES] + [(FULL_FIT, n) for n in HELD_SIZES]
    rows = []
    for n_fit, n_held in grid:
        runs = [draw(feats, train_labels, stats_of, n_fit, n_held, rng) for _ in range(draws)]
        alarms = [r["false_alarm"] for r in runs]
        rows.append({"fit": n_fit, "held": n_held, "false_alarm": float(np.mean(alarms)),
                     "false_alarm_lo": float(np.min(alarms)), "false_alarm_hi": float(np.max(alarms)),
                     "far_auroc": float(np.mean([r["far_auroc"] for r in runs])),
                     "near_auroc": float(np.mean([r["near_auroc"] for r in runs]))})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def minimums(rows):
    """(fit images, held-out images): the fewest that `rows` (`measure`'s) show to be enough."""
    full = next(r for r in rows if r["fit"] == FULL_FIT and r["held"] == FULL_HELD)
    held = min(r["held"] for r in rows if r["fit"] == FULL_FIT
               and AIM / 2 <= r["false_alarm_lo"] and r["false_alarm_hi"] <= 2 * AIM)
    fit = min(r["fit"] for r in rows if r["held"] == FULL_HELD and r["far_auroc"] >= full["far_auroc"] - AUROC_SLACK)
    return fit, held


def table(result):
    """The docs' Markdown block of `result`."""
    cpu = result["cpu"]
    lines = [BEGIN, "",
             f"`{result['command']}`: {result['draws']} draws per row, {result['test_images']} test images, "
             f"{result['method']} on {result['blocks']}, KERAS_BACKEND={result['backend']}, {cpu['model']} "
             f"({cpu['cores']} CPUs; {', '.join(cpu['key_flags']) or 'none of the key flags'}), "
             f"{result['seconds']:.0f} s.", "",
             "| fit images | held-out images | test images flagged (aim 5%) | lowest–highest draw "
             "| far-shift AUROC | near-shift AUROC |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['fit']:,} | {r['held']:,} | {r['false_alarm']:.1%} | "
                     f"{r['false_alarm_lo']:.1%}–{r['false_alarm_hi']:.1%} | {r['far_auroc']:.3f} | "
                     f"{r['near_auroc']:.3f} |")
    fit, held = minimums(result["rows"])
    lines += ["", f"The fewest held-out images whose every draw flagged {AIM / 2:.1%} to {2 * AIM:.0%} of the test "
              f"images: **{held:,}**; the fewest fit images whose far-shift AUROC is within {AUROC_SLACK} of the "
              f"full fit's: **{fit:,}** (`training.ood_stats.MIN_HELD_OUT_IMAGES`, `MIN_FIT_IMAGES`).", "", END]
    return "\n".join(lines)


def main(argv=None):
    from commands import cli

    parser = cli.parser(PROG, __doc__)
    parser.add_argument("--checkpoint", default=CHECKPOINT, help="a Fashion-MNIST .keras file (default: %(default)s)")
    parser.add_argument("--test-images", type=int, default=5000, help="in-domain test images (default: %(default)s)")
    parser.add_argument("--draws", type=int, default=10, help="random draws per row (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws and the shifts (default: %(default)s)")
    parser.add_argument("--out", help="also write the JSON record here (default: print the table only)")
    parser.add_argument("--docs", help="also write the table into this page, between its markers (default: "
                        "print it only)")
    args = parser.parse_args(argv)
    for flag in ("test_images", "draws"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)} is not allowed; use a positive integer")

    cli.quiet_logs()
    import keras

    import keras_vit
    from keras_vit import ood

    start = time.time()
    train, train_labels, test, _ = fashion_mnist()
    with cli.one_line_errors(PROG):
        model = keras_vit.load(args.checkpoint)
        # Room for a class-balanced draw of FULL_FIT and FULL_HELD disjoint images in every class.
        pool = np.random.default_rng(args.seed).choice(len(train), 2 * (FULL_FIT + FULL_HELD), replace=False)
        rows = measure(model, train[pool], train_labels[pool], test[: args.test_images], args.draws, args.seed)
    result = {"command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]),
              "backend": keras.backend.backend(), "cpu": {k: v for k, v in cpu_info().items() if k != "flags"},
              "checkpoint": args.checkpoint, "method": ood.DEFAULT_METHOD, "blocks": ood.DEFAULT_BLOCKS,
              "draws": args.draws, "test_images": args.test_images, "rows": rows,
              "seconds": round(time.time() - start, 1)}
    publish(table(result), result, args.out, args.docs, (BEGIN, END))


if __name__ == "__main__":
    main()

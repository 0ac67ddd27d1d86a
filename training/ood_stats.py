"""Out-of-domain statistics of a trained model (`keras_vit.ood`), written beside its checkpoint as
`ood.npz`, for the demo's warning on images unlike the training data.

    python -m training.ood_stats checkpoints/fashion-mnist-vit/model.keras --dataset fashion_mnist

The training CLI calls `write` after training; this command does the same for a checkpoint trained
before it did. The statistics come from `STATS_IMAGES` training images, spread over the split; the
threshold from up to `HELD_OUT_IMAGES` others that the statistics did not see (the validation
split's, when the run has one), set to flag `FALSE_ALARM` of them.

A run with fewer than `MIN_FIT_IMAGES` images for the statistics or `MIN_HELD_OUT_IMAGES` for the
threshold gets statistics without a threshold: the check is off, and `Stats.off` says why, for the
demo's page. `python -m experiments.ood.sample_size` measured the minimums on the shipped checkpoint
(docs/app.md): with 200 held-out images every draw's threshold flagged 3.0-7.7% of the test images
(the aim is 5%), with 50 from 3.0% to 18.7%; the far-shift AUROC is 0.968 from 100 fit images and
0.985 from 10,000.
"""

import dataclasses
import os

import numpy as np

from commands import cli, preflight

PROG = "python -m training.ood_stats"
STATS_IMAGES = 10_000
HELD_OUT_IMAGES = 5_000
FALSE_ALARM = 0.05
MIN_FIT_IMAGES = 100
MIN_HELD_OUT_IMAGES = 200


def pixels(raw, info, model, limit, part=0, parts=1):
    """(pixels (N, S, S, C) float32 in [0, 255], labels (N,)) of the model's size: up to `limit`
    examples of `raw`, every `parts`-th one starting at `part`, so that they span the split."""
    from training import datasets

    raw = raw.shard(parts, part).take(limit)
    # The evaluation pipeline's resize and crop, with a normalization that keeps pixels in [0, 255].
    zeros, scale = [0.0] * info.num_channels, [1 / 255] * info.num_channels
    batches = datasets.pipeline(raw, info, model.image_size[0], zeros, scale, 256, False, cache=False)
    images, labels = zip(*((x, y.argmax(-1)) for x, y in batches.as_numpy_iterator()))
    return np.concatenate(images), np.concatenate(labels)


def too_few(fit_images, held_out_images):
    """Why `fit_images` images for the statistics and `held_out_images` for the threshold are too few
    for the out-of-domain check, in plain words for the demo's page; None when they are enough."""
    if fit_images >= MIN_FIT_IMAGES and held_out_images >= MIN_HELD_OUT_IMAGES:
        return None
    return (f"The out-of-domain check is off: this model's training run had too few images to learn what usual "
            f"images look like ({fit_images:,} for the statistics and {held_out_images:,} held out to set the "
            f"threshold; it needs at least {MIN_FIT_IMAGES:,} and {MIN_HELD_OUT_IMAGES:,}).")


def choice(method=None, blocks=None):
    """(method, blocks) for `keras_vit.ood.fit` from a command line's text (None: the library's
    defaults); raises ValueError for an unknown method or blocks. Loads no deep-learning library."""
    ood = preflight.standalone("ood.scores")
    method = ood.DEFAULT_METHOD if method is None else method
    blocks = ood.DEFAULT_BLOCKS if blocks is None else ood.parse_blocks(blocks)
    ood.check_method(method, blocks)
    return method, blocks


def write(model, dataset, train_split="train", val_split=None, out_dir=".", data_dir=None, manual_dir=None,
          seed=0, false_alarm=FALSE_ALARM, method=None, blocks=None):
    """Fits `keras_vit.ood` statistics of `method` on `blocks` (see `choice`) on `dataset`'s
    `train_split`, sets the threshold on held-out images (`val_split`'s, else training images left
    out of the fit) and writes `out_dir/ood.npz`. Returns the `keras_vit.ood.Stats`; with too few
    images (`too_few`) they have no threshold, and their `off` says why."""
    from keras_vit import ood
    from training import datasets

    method, blocks = choice(method, blocks)

    train, info = datasets.load(dataset, train_split, data_dir, manual_dir, seed)
    # Every `parts`-th image, so that the images span the split (a folder's are in class order);
    # without a validation split, the threshold takes the images one further on.
    parts = max(1 if val_split else 2, (info.splits.get(train_split) or 0) // STATS_IMAGES)
    x, y = pixels(train, info, model, STATS_IMAGES, 0, parts)
    if val_split:
        held, _ = pixels(datasets.load(dataset, val_split, data_dir, manual_dir, seed)[0], info, model, HELD_OUT_IMAGES)
    else:
        held, _ = pixels(train, info, model, HELD_OUT_IMAGES, 1, parts)
    stats = ood.fit(model, x, y, method, blocks)
    off = too_few(len(x), len(held))
    if off is None:
        stats = ood.with_threshold(stats, ood.score(model, held, stats), false_alarm)
    else:
        stats = dataclasses.replace(stats, off=off)
    ood.save(stats, os.path.join(out_dir, ood.FILENAME))
    return stats


def main(argv=None):
    parser = cli.parser(PROG, __doc__)
    parser.add_argument("checkpoint", help="a .keras file; ood.npz is written beside it")
    parser.add_argument("--dataset", required=True, help="the dataset it was trained on: a tfds name, "
                        "'fashion_mnist', 'shapes' or a folder of class sub-folders")
    parser.add_argument("--train-split", default="train", help="the split it was trained on")
    parser.add_argument("--val-split", default=None, help="held-out split for the threshold (default: training "
                        "images left out of the statistics)")
    parser.add_argument("--false-alarm", type=float, default=FALSE_ALARM, help="share of held-out in-domain "
                        "images that the threshold flags")
    parser.add_argument("--method", default=None, help="the score: msp, energy, mahalanobis, rmds, vim or knn "
                        "(default: keras_vit.ood.DEFAULT_METHOD)")
    parser.add_argument("--blocks", default=None, help="the features scored: 'pooled' (what the classifier "
                        "takes), 'all' blocks' mean tokens, or block indices such as '4,5' (default: "
                        "keras_vit.ood.DEFAULT_BLOCKS)")
    parser.add_argument("--verbose", action="store_true", help="show the libraries' logs")
    args = parser.parse_args(argv)
    if not args.checkpoint.endswith(".keras"):
        parser.error(f"checkpoint {args.checkpoint!r} is not a .keras file; save the model with model.save(...)")
    with cli.one_line_errors(PROG):
        choice(args.method, args.blocks)
    preflight.start(PROG, args.checkpoint, args.dataset, "checkpoint", args.verbose)
    import keras

    import keras_vit  # noqa: F401  (registers ViT for safe-mode loading)

    with cli.one_line_errors(PROG):
        model = keras.saving.load_model(args.checkpoint, safe_mode=True, compile=False)
        stats = write(model, args.dataset, args.train_split, args.val_split,
                      os.path.dirname(os.path.abspath(args.checkpoint)), false_alarm=args.false_alarm,
                      method=args.method, blocks=args.blocks)
    where = " and ".join([f"blocks {', '.join(map(str, stats.blocks))}"] * bool(stats.blocks)
                         + ["the pooled features"] * stats.pooled)
    if stats.off is not None:
        print(f"{stats.off} Written to {os.path.join(os.path.dirname(args.checkpoint), 'ood.npz')}")
        return
    print(f"{stats.method} on {where}: the threshold flags {stats.false_alarm:.1%} of {len(stats.reference):,} "
          f"held-out images; written to {os.path.join(os.path.dirname(args.checkpoint), 'ood.npz')}")


if __name__ == "__main__":
    main()

"""Out-of-domain scores of a Fashion-MNIST checkpoint, measured: the 10,000 Fashion-MNIST test images
(in domain) against scikit-learn's digits, scikit-image's and scikit-learn's sample photos, and noise.

    python -m benchmarks.ood                                   # the shipped checkpoint and its ood.npz
    python -m benchmarks.ood --out benchmarks/results/ood.md   # also write the tables

For each score of `keras_vit.ood` it reports the AUROC per out-of-domain set and over all of them
(1.0: every out-of-domain image scores above every test image; 0.5: chance). At the threshold stored
in the checkpoint's `ood.npz` (`python -m training.ood_stats` or the training run chose it on
held-out training images) it reports the share of each set that is flagged, and the false-alarm
rate: the share of test images flagged.

The photos go through the demo's own preprocessing (`apps.preprocess.model_pixels`), with the
Fashion-MNIST-style option on as on the page (invert a light background, stretch, crop to the
object, pad to a square), and once without it; "photo crops" are 100 random square crops of each
photo (a quarter to all of its short side), so that the set is large enough for an AUROC.
"""

import argparse
import time

import numpy as np

from training import cli

PROG = "python -m benchmarks.ood"
CHECKPOINT = "checkpoints/fashion-mnist-vit/model.keras"
# scikit-image's sample photos that ship in its wheel (no download), and scikit-learn's two.
SKIMAGE_PHOTOS = ("astronaut", "camera", "chelsea", "coffee", "coins", "moon", "page", "rocket", "text", "clock",
                  "brick", "grass", "gravel", "hubble_deep_field", "immunohistochemistry", "retina", "horse")
CROPS_PER_PHOTO = 100
NOISE_IMAGES = 500  # of each kind: uniform and Gaussian


def photos():
    """{name: PIL image} of the sample photos."""
    import skimage.data
    from PIL import Image
    from sklearn.datasets import load_sample_images

    found = {}
    for name in SKIMAGE_PHOTOS:
        pixels = getattr(skimage.data, name)()
        if pixels.dtype == bool:  # "horse" is a silhouette: black on white
            pixels = np.where(pixels, 0, 255).astype("uint8")
        found[name] = Image.fromarray(pixels)
    for path, pixels in zip(load_sample_images().filenames, load_sample_images().images):
        found[path.split("/")[-1]] = Image.fromarray(pixels)
    return found


def crops(images, per_image, rng):
    """`per_image` random square crops of each PIL image, from a quarter to all of its short side."""
    out = []
    for im in images:
        w, h = im.size
        for _ in range(per_image):
            side = int(rng.uniform(0.25, 1.0) * min(w, h))
            x, y = rng.integers(0, w - side + 1), rng.integers(0, h - side + 1)
            out.append(im.crop((x, y, x + side, y + side)))
    return out


def digits():
    """scikit-learn's 1,797 handwritten digits (8 x 8, values 0-16) as 8-bit grayscale PIL images."""
    from PIL import Image
    from sklearn.datasets import load_digits

    return [Image.fromarray((d * 255 / 16).round().astype("uint8")) for d in load_digits().images]


def out_of_domain_sets(model, seed=0):
    """{name: pixels (N, H, W, C) uint8 at the model's size}, prepared as the demo prepares uploads."""
    from apps.preprocess import model_pixels

    rng = np.random.default_rng(seed)
    prep = lambda ims, fashion: np.stack([model_pixels(im, model.image_size, model.num_channels, fashion)  # noqa: E731
                                          for im in ims])
    shots = list(photos().values())
    cut = crops(shots, CROPS_PER_PHOTO, rng)
    shape = (NOISE_IMAGES, *model.image_size, model.num_channels)
    noise = np.concatenate([rng.integers(0, 256, shape), np.clip(rng.normal(128, 64, shape), 0, 255)]).astype("uint8")
    return {
        "digits (scikit-learn, upscaled)": prep(digits(), False),
        "photos (whole)": prep(shots, True),
        "photo crops": prep(cut, True),
        "photo crops, no Fashion-MNIST-style preprocessing": prep(cut, False),
        "noise (uniform, Gaussian)": noise,
    }


def auroc(inside, outside):
    """Area under the ROC curve of telling `outside` scores from `inside` ones (higher: outside)."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(np.r_[np.zeros(len(inside)), np.ones(len(outside))], np.r_[inside, outside]))


def measure(model, stats, test_pixels, sets):
    """{score name: {set name or "all": AUROC}}, {set: flagged share} and the test false-alarm rate."""
    from keras_vit import ood

    names = list(sets)
    feats, logits = ood.features(model, np.concatenate([test_pixels, *sets.values()]))
    bounds = np.cumsum([len(test_pixels), *(len(v) for v in sets.values())])[:-1]
    last = ood.Stats(stats.means[-1:], stats.precision[-1:])
    table = {name: ood.scores(feats, logits, stats)[key] for name, key in
             (("maximum softmax (1 - MSP)", "msp"), ("energy", "energy"))}
    table["Mahalanobis, last block"] = ood.scores(feats[:, -1:], logits, last)["mahalanobis"]
    table["Mahalanobis, all blocks (stored)"] = ood.scores(feats, logits, stats)[stats.method]
    results = {}
    for name, values in table.items():
        test, *outside = np.split(values, bounds)
        results[name] = {n: auroc(test, o) for n, o in zip(names, outside)}
        results[name]["all"] = auroc(test, np.concatenate(outside))
    test, *outside = np.split(table["Mahalanobis, all blocks (stored)"], bounds)
    flagged = {n: float(np.mean(o > stats.threshold)) for n, o in zip(names, outside)}
    return results, flagged, float(np.mean(test > stats.threshold))


def markdown(results, flagged, false_alarm, stats, sizes, test_size):
    names = list(flagged)
    lines = ["| score | " + " | ".join(f"{n} ({sizes[n]:,})" for n in names) + " | all |",
             "|---|" + "---:|" * (len(names) + 1)]
    for score, row in results.items():
        lines.append(f"| {score} | " + " | ".join(f"{row[n]:.3f}" for n in [*names, "all"]) + " |")
    lines.append("| flagged at the threshold | " + " | ".join(f"{flagged[n]:.1%}" for n in names) + " | |")
    lines += ["", f"Threshold {stats.threshold:.1f} (the stored Mahalanobis score, chosen to flag "
              f"{stats.false_alarm:.1%} of held-out training images); false alarms on the {test_size:,} "
              f"Fashion-MNIST test images: **{false_alarm:.1%}**."]
    return "\n".join(lines)


def main(argv=None):
    parser = cli.parser(PROG, __doc__)
    parser.add_argument("--checkpoint", default=CHECKPOINT, help="a Fashion-MNIST .keras file with ood.npz beside it")
    parser.add_argument("--out", help="also write the tables to this Markdown file (default: print only)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the crops and the noise")
    args = parser.parse_args(argv)
    cli.quiet_logs()
    import keras

    import keras_vit  # noqa: F401  (registers ViT for safe-mode loading)
    from keras_vit import ood
    from training.datasets.fashion_mnist import find_files, read_idx

    with cli.one_line_errors(PROG):
        model = keras.saving.load_model(args.checkpoint, safe_mode=True, compile=False)
        if tuple(model.image_size) != (28, 28) or model.num_channels != 1 or model.num_classes != 10:
            raise ValueError(f"{args.checkpoint} takes {model.image_size} images with {model.num_channels} channels "
                             f"and has {model.num_classes} classes; {PROG} measures Fashion-MNIST checkpoints "
                             "(28 x 28, one channel, 10 classes)")
        stats = ood.load_for(args.checkpoint, model)
        if stats is None:
            raise FileNotFoundError(f"no {ood.stats_path(args.checkpoint)}; write it with python -m training.ood_stats "
                                    f"{args.checkpoint} --dataset fashion_mnist")
        test = read_idx(find_files()["test_data"])[..., None]
    start = time.time()
    sets = out_of_domain_sets(model, args.seed)
    results, flagged, false_alarm = measure(model, stats, test, sets)
    text = markdown(results, flagged, false_alarm, stats, {n: len(v) for n, v in sets.items()}, len(test))
    print(text)
    print(f"\n{PROG} --checkpoint {args.checkpoint}: {time.time() - start:.0f} s, backend {keras.backend.backend()}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"# Out-of-domain scores of {args.checkpoint}\n\n`{PROG} --checkpoint {args.checkpoint}`, "
                    f"backend {keras.backend.backend()}. AUROC against the Fashion-MNIST test images "
                    f"(out-of-domain images in parentheses).\n\n{text}\n")


if __name__ == "__main__":
    main()

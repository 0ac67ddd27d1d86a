"""Which epoch should a run keep? Every epoch's weights, scored on held-out images, against the rules.

Two cases, each one training run whose every epoch is saved, then scored on a test set that the
run never saw:

    photos         the docs' folder command (from_scratch, --image-size 64, --batch-size 16,
                   --val-split validation; a smaller model, `SMALL`) on 4 classes x 36 photos: random crops, flips and
                   brightness changes of four photos that scikit-image ships (astronaut, coffee,
                   chelsea, rocket). The 10% validation split is 14 images, so val_accuracy moves in
                   steps of 1/14 and saturates. Test: the four source photos and 50 new variants each.
    fashion_mnist  the fashion_mnist recipe on 10,000 training images with 1,000 others for
                   validation; test: the 10,000 test images.

The rules compared: Keras' ModelCheckpoint on val_accuracy (a tie is no improvement, so the first
epoch that reached the best), val_accuracy with ties broken by val_loss (training.best_epoch), the
lowest val_loss, and the last epoch.

    python -m experiments.best_epoch --case photos --epochs 30          # ~25 min on 2 CPU cores
    python -m experiments.best_epoch --case fashion_mnist --epochs 10   # ~15 min
"""

import json
import os
import tempfile

import numpy as np

from commands import cli, preflight

PROG = "python -m experiments.best_epoch"
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
# The photos case's model: ViT-Ti/4's 12 blocks of width 192 take ~25 s a step at 64 px on 2 CPU
# cores; this one trains the same 30 epochs in minutes.
SMALL = dict(hidden_dim=64, num_layers=4, num_heads=4, mlp_dim=128)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def variant(photo, rng, side=96):
    """A random crop (40-100% of the area), maybe flipped, brightness x0.75-1.25, `side` px square."""
    from PIL import Image, ImageEnhance

    w, h = photo.size
    scale, aspect = np.sqrt(rng.uniform(0.4, 1.0)), rng.uniform(0.8, 1.25)
    cw, ch = min(w, int(min(w, h) * scale * aspect)), min(h, int(min(w, h) * scale / aspect))
    x, y = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
    image = photo.crop((x, y, x + cw, y + ch)).resize((side, side), Image.BILINEAR)
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return ImageEnhance.Brightness(image).enhance(rng.uniform(0.75, 1.25))


def write_photos(root, per_class, seed):
    """root/<photo>/<n>.jpg: `per_class` variants of each photo, or the photo itself when 0."""
    import skimage.data
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in PHOTOS:
        photo = Image.fromarray(getattr(skimage.data, name)()).convert("RGB")
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for n in range(per_class):
            variant(photo, rng).save(os.path.join(root, name, f"{n}.jpg"), quality=90)
        if not per_class:
            photo.resize((96, 96), Image.BILINEAR).save(os.path.join(root, name, "source.png"))
    return root


def case(name, work, epochs):
    """(recipe, [(test dataset, split), (source photos or None, split)]) of a case; writes the photos
    into `work`."""
    from training import recipes

    if name == "photos":
        train = write_photos(os.path.join(work, "train"), 36, seed=0)
        test, sources = write_photos(os.path.join(work, "test"), 50, seed=1), write_photos(
            os.path.join(work, "sources"), 0, seed=0)
        recipe = recipes.get("from_scratch", dataset=train, image_size=64, batch_size=16, val_split="validation",
                             test_split=None, epochs=epochs, **SMALL)
        return recipe, [(test, "all"), (sources, "all")]
    recipe = recipes.get("fashion_mnist", train_split="train[:10000]", val_split="train[59000:]", test_split=None,
                         epochs=epochs)
    return recipe, [("fashion_mnist", "test"), (None, None)]


def arrays(model, recipe, name, split):
    """(images, labels) of a dataset split as the model's input, or None for no dataset."""
    from training import datasets as data

    if name is None:
        return None
    raw, info = data.load(name, split, seed=recipe.seed)
    batches = data.pipeline(raw, info, model.preprocessing, 64, False, recipe=recipe)
    return tuple(map(np.concatenate, zip(*[(np.asarray(x), np.asarray(y).argmax(-1)) for x, y in batches])))


def right_class(model, data):
    """The probability that `model` gives the right class of each image of `data` (images, labels)."""
    import keras

    images, labels = data
    probs = keras.ops.convert_to_numpy(keras.ops.softmax(model.predict(images, verbose=0, batch_size=64)))
    return probs[np.arange(len(labels)), labels], probs.argmax(-1) == labels


def score_epochs(out, recipe, tests, epochs):
    """{epoch (1-based): (test accuracy, test NLL, mean probability of the right class on the source
    photos or None)} of every saved epoch's weights."""
    import keras_vit

    model = keras_vit.load(os.path.join(out, "model.keras"))
    test, sources = (arrays(model, recipe, name, split) for name, split in tests)
    scores = {}
    for epoch in range(1, epochs + 1):
        model.load_weights(os.path.join(out, "epochs", f"{epoch:02d}.weights.h5"))
        right, hit = right_class(model, test)
        source = float(right_class(model, sources)[0].mean()) if sources is not None else None
        scores[epoch] = (float(hit.mean()), float(-np.log(right + 1e-12).mean()), source)
    return scores


def rules(log_rows):
    """{rule: kept epoch (1-based)} over log.csv's rows."""
    from training import best_epoch

    accuracy = [row["val_accuracy"] for row in log_rows]
    return {
        "Keras: val_accuracy, first of ties": log_rows[int(np.argmax(accuracy))]["epoch"],
        "val_accuracy, ties by val_loss": best_epoch.best_row(log_rows, "val_accuracy", "max")["epoch"],
        "val_loss": log_rows[int(np.argmin([row["val_loss"] for row in log_rows]))]["epoch"],
        "last epoch": log_rows[-1]["epoch"],
    }


def main(argv=None):
    parser = cli.parser(PROG, __doc__)
    parser.add_argument("--case", choices=("photos", "fashion_mnist"), default="photos",
                        help="the folder of photo variants, or the fashion_mnist recipe (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=30, help="epochs of the run (default: %(default)s)")
    args = parser.parse_args(argv)
    with cli.one_line_errors(PROG):
        preflight.require(PROG, preflight.TRAIN_MODULES)
    cli.quiet_logs(False)
    cli.import_tensorflow(False)
    import keras

    from training import best_epoch, loop

    with tempfile.TemporaryDirectory() as work:
        recipe, tests = case(args.case, work, args.epochs)
        out = os.path.join(work, "run")
        every = keras.callbacks.ModelCheckpoint(os.path.join(out, "epochs", "{epoch:02d}.weights.h5"),
                                                save_weights_only=True)
        loop.run(recipe, out, extra_callbacks=[every], verbose=2)
        log_rows = best_epoch.read_rows(os.path.join(out, "log.csv"))
        scores = score_epochs(out, recipe, tests, args.epochs)
    report(args, log_rows, scores)


def report(args, log_rows, scores):
    table = {rule: {"epoch": epoch, "val_accuracy": log_rows[epoch - 1]["val_accuracy"],
                    "val_loss": log_rows[epoch - 1]["val_loss"], "test_accuracy": scores[epoch][0],
                    "test_nll": scores[epoch][1], "source_photo_probability": scores[epoch][2]}
             for rule, epoch in rules(log_rows).items()}
    print(f"| rule ({args.case}, {args.epochs} epochs) | kept epoch | val_accuracy | val_loss | test accuracy "
          "| test NLL | right-class probability, source photos |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for rule, row in table.items():
        source = "" if row["source_photo_probability"] is None else f"{row['source_photo_probability']:.2f}"
        print(f"| {rule} | {row['epoch']} | {row['val_accuracy']:.3f} | {row['val_loss']:.3f} "
              f"| {row['test_accuracy']:.3f} | {row['test_nll']:.3f} | {source} |")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"best_epoch_{args.case}.json"), "w") as f:
        json.dump({"rules": table, "log": log_rows, "scores": scores}, f, indent=1)


if __name__ == "__main__":
    main()

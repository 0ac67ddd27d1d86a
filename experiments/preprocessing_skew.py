"""Train/serve skew: the same held-out images through the training pipeline's path and through the
demo's, for the shipped checkpoint and for a model trained here on a folder of real photos.

    KERAS_BACKEND=jax python -m experiments.preprocessing_skew --out experiments/results/preprocessing_skew.json \
        --docs docs/preprocessing.md

Two paths from one image to the model's input:

- training: the image's uint8 array through `training.datasets.pipeline`, as `python -m
  training.train` and `training.evaluate` feed a model;
- demo: the image as a Pillow image through `apps.images.model_pixels` (no Fashion-MNIST-style
  step) and `ViT.normalize`, as `python -m apps.demo` feeds a model.

For each set it reports the top-1 accuracy through each path, the share of images whose two inputs
are identical, the largest difference between them (in the model's normalized units) and the share
of images whose top class differs.

Sets: the shipped checkpoint (28 x 28 grayscale) on the first `--images` Fashion-MNIST test
images, as they are and enlarged with Pillow's bicubic filter to 64 x 64, 100 x 75 and 300 x 300
(a garment photographed at a higher resolution); a ViT (the `shapes` recipe: D 64, 2 blocks, 32 px)
that `python -m training.train` trains here on a folder of crops of real photos (the colour sample
photos of scikit-image and scikit-learn, one class per photo; each crop a random rectangle of a
fifth to three fifths of the photo's short side, saved at its own size, 60 to 850 px), measured on
crops of the same photos that it did not train on.
"""

import json
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks.cpu import cpu_info, replace_block
from commands import cli
from experiments.common import CHECKPOINT, fashion_mnist, train

PROG = "python -m experiments.preprocessing_skew"
BEGIN, END = "<!-- preprocessing-skew -->", "<!-- /preprocessing-skew -->"
SIZES = ((28, 28), (64, 64), (75, 100), (300, 300))  # (H, W) of the enlarged Fashion-MNIST images
SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")


def training_inputs(model, images, labels):
    """(inputs (N, H, W, C) float32, labels (N,)) of uint8 `images` (a list of (h, w, c) arrays) as
    the training pipeline makes them for `model`."""
    import tensorflow as tf

    from training import datasets

    info = datasets.Info("images", model.num_classes, None, model.num_channels, {"test": len(images)})
    raw = tf.data.Dataset.from_generator(lambda: zip(images, labels), output_signature=(
        tf.TensorSpec((None, None, model.num_channels), tf.uint8), tf.TensorSpec((), tf.int64)))
    batches = datasets.pipeline(raw, info, model.preprocessing, 256, False, cache=False)
    xs, ys = zip(*((x, y.argmax(-1)) for x, y in batches.as_numpy_iterator()))
    return np.concatenate(xs), np.concatenate(ys)


def demo_inputs(model, pictures):
    """(N, H, W, C) float32 inputs of Pillow images `pictures` as the demo makes them for `model`."""
    import keras

    from apps.images import model_pixels

    pixels = np.stack([model_pixels(p, model.preprocessing, False) for p in pictures])
    return np.asarray(keras.ops.convert_to_numpy(model.normalize(pixels)))


def compare(model, images, labels):
    """The skew figures of uint8 `images` (a list of (h, w, c) arrays) with `labels` (N,)."""
    from PIL import Image

    x_train, y = training_inputs(model, images, labels)
    x_demo = demo_inputs(model, [Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a) for a in images])
    p_train, p_demo = (np.asarray(model.predict(x, batch_size=256, verbose=0)).argmax(-1) for x in (x_train, x_demo))
    diff = np.abs(x_train - x_demo).reshape(len(x_train), -1).max(-1)
    return {"images": len(images), "accuracy_training_path": float((p_train == y).mean()),
            "accuracy_demo_path": float((p_demo == y).mean()), "identical_inputs": float((diff == 0).mean()),
            "largest_input_difference": float(diff.max()), "top_class_differs": float((p_train != p_demo).mean())}


def shipped(args):
    """{set name: figures} of the shipped checkpoint on Fashion-MNIST test images at each of SIZES."""
    from PIL import Image

    import keras_vit

    model = keras_vit.load(args.checkpoint)
    _, _, test, test_labels = fashion_mnist()
    test, test_labels = test[: args.images], test_labels[: args.images]
    rows = {}
    for h, w in SIZES:
        images = [np.asarray(Image.fromarray(t).resize((w, h), Image.Resampling.BICUBIC))[..., None] for t in test]
        rows[f"Fashion-MNIST test, {h} x {w}"] = compare(model, images, test_labels)
        print(rows[f"Fashion-MNIST test, {h} x {w}"], flush=True)
    return rows


def photos():
    """{name: (h, w, 3) uint8} of the colour sample photos."""
    import skimage.data
    from sklearn.datasets import load_sample_images

    found = {name: getattr(skimage.data, name)() for name in SKIMAGE_PHOTOS}
    samples = load_sample_images()
    found.update({os.path.splitext(os.path.basename(p))[0]: a for p, a in zip(samples.filenames, samples.images)})
    return found


def write_crops(root, per_class, rng):
    """Writes `per_class` random crops of each photo to root/<photo>/<i>.png."""
    from PIL import Image

    for name, pixels in photos().items():
        os.makedirs(os.path.join(root, name))
        h, w = pixels.shape[:2]
        for i in range(per_class):
            side = rng.uniform(0.2, 0.6) * min(h, w)
            ch, cw = (int(side * s) for s in (rng.uniform(0.8, 1.25), rng.uniform(0.8, 1.25)))
            y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
            Image.fromarray(pixels[y:y + ch, x:x + cw]).save(os.path.join(root, name, f"{i}.png"))


def folder_model(args, work):
    """Trains a ViT on crops of the photos with the training CLI; its figures on held-out crops."""
    from keras_vit.io.images import open_image

    rng = np.random.default_rng(args.seed)
    train_root, held_root = os.path.join(work, "train"), os.path.join(work, "held")
    write_crops(train_root, args.train_per_class, rng)
    write_crops(held_root, args.held_per_class, rng)
    out = os.path.join(work, "run")
    command = [sys.executable, "-m", "training.train", "--recipe", "shapes", "--dataset", train_root,
               "--image-size", "32", "--epochs", str(args.epochs), "--val-split", "none", "--test-split", "none",
               "--out", out, "--verbose", "0"]
    model, seconds = train(command, out)
    classes = sorted(os.listdir(held_root))
    paths = [(os.path.join(held_root, c, f), i) for i, c in enumerate(classes)
             for f in sorted(os.listdir(os.path.join(held_root, c)))]
    images = [np.asarray(open_image(p).convert("RGB")) for p, _ in paths]
    sizes = [min(a.shape[:2]) for a in images]
    figures = compare(model, images, np.array([label for _, label in paths]))
    return {"command": " ".join(["python", *command[1:]]).replace(work + os.sep, ""), "classes": len(classes),
            "train_images": len(classes) * args.train_per_class, "train_seconds": round(seconds, 1),
            "held_out_short_side": [int(min(sizes)), int(max(sizes))], "figures": figures}


def table(result):
    """The Markdown table of `result`, with the command and the CPU."""
    rows = [*result["shipped"].items(), ("photo crops (held out), folder-trained ViT", result["folder"]["figures"])]
    cpu, folder = result["cpu"], result["folder"]
    load = f", load {result['load'][0]:.1f} to {result['load'][1]:.1f}" if "load" in result else ""
    lines = [f"`KERAS_BACKEND={result['backend']} {result['command']}` ({result['seconds']:.0f} s on {cpu['model']}, "
             f"{cpu['cores']} cores, {', '.join(cpu['key_flags']) or 'no AVX-512 or AMX'}{load}; the folder model: "
             f"{folder['train_images']} crops of {folder['classes']} photos, `{folder['command']}`):", "",
             "| images | model input | accuracy: training path | accuracy: demo path | identical inputs "
             "| largest input difference | top class differs |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        lines.append(f"| {name} ({r['images']}) | {'28 x 28 gray' if 'Fashion' in name else '32 x 32 RGB'} "
                     f"| {r['accuracy_training_path']:.2%} | {r['accuracy_demo_path']:.2%} "
                     f"| {r['identical_inputs']:.1%} | {r['largest_input_difference']:.3g} "
                     f"| {r['top_class_differs']:.1%} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = cli.parser(PROG, __doc__)
    parser.add_argument("--checkpoint", default=CHECKPOINT, help="a Fashion-MNIST .keras file")
    parser.add_argument("--images", type=int, default=2000, help="Fashion-MNIST test images per size")
    parser.add_argument("--train-per-class", type=int, default=200, help="training crops per photo")
    parser.add_argument("--held-per-class", type=int, default=50, help="held-out crops per photo")
    parser.add_argument("--epochs", type=int, default=10, help="epochs of the folder-trained ViT")
    parser.add_argument("--seed", type=int, default=0, help="seed of the crops")
    parser.add_argument("--out", help="also write the JSON record here")
    parser.add_argument("--docs", help="also write the table into this page, between its markers")
    args = parser.parse_args(argv)
    cli.quiet_logs()
    cli.import_tensorflow()
    import keras

    start, load_at_start = time.time(), os.getloadavg()[0]
    with cli.one_line_errors(PROG):
        result = {"command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]),
                  "backend": keras.backend.backend(), "cpu": cpu_info(), "shipped": shipped(args)}
        with tempfile.TemporaryDirectory(prefix="skew-") as work:
            result["folder"] = folder_model(args, work)
    result["seconds"] = round(time.time() - start, 1)
    result["load"] = [round(load_at_start, 1), round(os.getloadavg()[0], 1)]  # 1-minute load average, start and end
    print(table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.docs:
        replace_block(args.docs, BEGIN, END, f"{BEGIN}\n{table(result)}{END}")


if __name__ == "__main__":
    main()

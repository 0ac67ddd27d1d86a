"""Semantic segmentation on the ViT backbone: the seed's synthetic shapes (square, disc, triangle,
cross) with per-pixel masks, a linear head on the last block's grid, trained with `model.fit`.

    KERAS_BACKEND=tensorflow python -m experiments.segmentation --out experiments/results/segmentation.json \
        --docs docs/backbone.md

The backbone is the shipped Fashion-MNIST checkpoint (28 x 28 grayscale, patch 4), loaded with
`dynamic_image_size=True` so that it takes the 32 x 32 shapes (an 8 x 8 grid; its 7 x 7 position
table is resampled). The model is `ViT.as_backbone` (the final LayerNorm on), a Dense layer from
each token to the 5 labels (background and the four shapes), and a bilinear upsampling by the patch
size back to the pixels. Two methods: the backbone frozen (a linear probe: only the head trains) and
full fine-tuning. Each trains on `--train` images (generator seed 0) for `--epochs` with Adam (the head
alone at `--probe-learning-rate`, everything at `--learning-rate`) and is
scored on `--test` held-out images (seed 1000) by mean intersection over union over the 5 labels,
at 32 x 32 and, with the same model, at 48 x 48 (a 12 x 12 grid).

Speed: the forward pass (`predict_on_batch`) of one dynamic model serving three sizes against a
`keras_vit.resize`d fixed model per size, the median of `--repeats` timed batches, as the ratio
dynamic / fixed. On TensorFlow the dynamic model's second and third sizes run in a graph of free
height and width (Keras relaxes the shapes when it retraces), which computes the resampling in the
graph. Prints one JSON object,
with the CPU.
"""

import argparse
import time

import keras
import numpy as np

from benchmarks import timing
from benchmarks.cpu import cpu_info, emit, replace_block
from experiments.common import CHECKPOINT
from training.datasets.shapes import CLASS_NAMES, TEST_SEED, make_shapes

LABELS = ("background", *CLASS_NAMES)
METHODS = {"frozen backbone, linear head": False, "full fine-tuning": True}


def data(n, seed, size, model):
    """(normalized images (n, size, size, 1), labels (n, size, size))."""
    X, _, masks = make_shapes(n, np.random.default_rng(seed), size=size, masks=True)
    pixels = np.clip(np.round(X * 255.0), 0, 255)[..., None]
    return np.asarray(keras.ops.convert_to_numpy(model.normalize(pixels))), masks


def dynamic_backbone(path):
    """The checkpoint's ViT with `dynamic_image_size=True`, its weights copied."""
    import keras_vit

    fixed = keras.saving.load_model(path, safe_mode=True)
    model = keras_vit.ViT.from_config({**fixed.get_config(), "dynamic_image_size": True})
    model.set_weights(fixed.get_weights())
    return model


def segmenter(vit):
    """images (B, H, W, C) -> per-pixel logits (B, H, W, labels): a linear head on the grid."""
    images = keras.Input((None, None, vit.num_channels))
    grid = vit.as_backbone(indices=1, norm=True)(images)  # (B, h, w, D)
    logits = keras.layers.Dense(len(LABELS), name="linear_head")(grid)  # (B, h, w, D) -> (B, h, w, labels)
    return keras.Model(images, keras.layers.UpSampling2D(vit.token_pixels, interpolation="bilinear")(logits))


def mean_iou(model, images, masks, batch_size):
    """Mean over the labels of |predicted and true| / |predicted or true|, over every pixel.

    Batches are run eagerly: `model.predict` at a second size retraces on TensorFlow with free
    height and width, which Keras' bilinear `UpSampling2D` does not take (the ViT does)."""
    predicted = np.concatenate([keras.ops.convert_to_numpy(model(images[i:i + batch_size], training=False)).argmax(-1)
                                for i in range(0, len(images), batch_size)])
    counts = np.bincount(masks.ravel() * len(LABELS) + predicted.ravel(), minlength=len(LABELS) ** 2)
    confusion = counts.reshape(len(LABELS), len(LABELS))  # (true, predicted)
    hits = np.diag(confusion)
    union = confusion.sum(0) + confusion.sum(1) - hits
    return float(np.mean(hits[union > 0] / union[union > 0]))


def train(method, args):
    vit = dynamic_backbone(args.checkpoint)
    vit.trainable = METHODS[method]
    vit.head.trainable = False  # the classifier is not part of the backbone
    model = segmenter(vit)
    x, y = data(args.train, 0, 32, vit)
    rate = args.learning_rate if METHODS[method] else args.probe_learning_rate
    model.compile(optimizer=keras.optimizers.Adam(rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = time.perf_counter()
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0)
    result = {"method": method, "learning_rate": rate,
              "trainable": sum(int(np.prod(v.shape)) for v in model.trainable_weights),
              "train_seconds": round(time.perf_counter() - start, 1)}
    for size in (32, 48):
        result[f"miou_{size}"] = round(mean_iou(model, *data(args.test, TEST_SEED, size, vit), args.batch_size), 4)
    return result


def speed(args):
    """Median seconds per batch of the dynamic model and of a fixed model resized to each size."""
    import keras_vit

    vit, rows = dynamic_backbone(args.checkpoint), []
    for size in (28, 56, 112):
        fixed = keras_vit.resize(keras.saving.load_model(args.checkpoint, safe_mode=True), size)
        x = np.random.default_rng(0).normal(size=(args.batch_size, size, size, 1)).astype("float32")
        # One model after the other, each after one warm-up call (it traces once per shape).
        times = {name: timing.alternate({name: lambda: model.predict_on_batch(x)}, args.repeats)[name]
                 for name, model in (("dynamic", vit), ("fixed", fixed))}
        rows.append({"size": size, "dynamic_s": round(times["dynamic"], 4), "fixed_s": round(times["fixed"], 4),
                     "ratio": round(times["dynamic"] / times["fixed"], 3)})
    return rows


BEGIN, END = "<!-- segmentation -->", "<!-- /segmentation -->"


def table(result):
    """The docs' block (between BEGIN and END) from the JSON `result`."""
    cpu = result["cpu"]
    lines = [f"Measured with `KERAS_BACKEND={result['backend']} python -m experiments.segmentation --out "
             f"experiments/results/segmentation.json --docs docs/backbone.md` on {cpu['model']} "
             f"({cpu['cores']} cores; {', '.join(cpu['key_flags']) or 'no AVX-512 or AMX'}): "
             f"{result['train_images']} training images, {result['epochs']} epochs, batch {result['batch_size']}, "
             f"Adam, mIoU over {len(LABELS)} labels on {result['test_images']} held-out images.",
             "", "| method | Adam's rate | trainable weights | mIoU at 32 x 32 | mIoU at 48 x 48 | training time |",
             "|---|---:|---:|---:|---:|---:|"]
    for m in result["methods"]:
        lines.append(f"| {m['method']} | {m['learning_rate']:g} | {m['trainable']:,} | {m['miou_32']:.3f} "
                     f"| {m['miou_48']:.3f} | {m['train_seconds']:.0f} s |")
    lines += ["", "One dynamic model serving three sizes against a `resize`d fixed model per size (forward pass, "
              f"batch {result['batch_size']}, median seconds per batch, same run):", "",
              "| size | dynamic | fixed | dynamic / fixed |", "|---:|---:|---:|---:|"]
    for r in result["speed"]:
        lines.append(f"| {r['size']} x {r['size']} | {r['dynamic_s']:.4f} | {r['fixed_s']:.4f} | {r['ratio']:.2f} |")
    return "\n".join([BEGIN, *lines, END])


def update_docs(path, result):
    """Replaces the block between BEGIN and END of the page `path` with `table(result)`."""
    replace_block(path, BEGIN, END, table(result))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=CHECKPOINT, help="the backbone's .keras file (default: %(default)s)")
    parser.add_argument("--train", type=int, default=2000, help="training images (default: %(default)s)")
    parser.add_argument("--test", type=int, default=500, help="held-out images (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per method (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default: %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=1e-3,
                        help="Adam's rate for full fine-tuning (default: %(default)s)")
    parser.add_argument("--probe-learning-rate", type=float, default=1e-2,
                        help="Adam's rate for the linear head on the frozen backbone (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=20,
                        help="timed batches per model and size (default: %(default)s)")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--docs", help="also write the tables into this page, between its markers")
    args = parser.parse_args(argv)
    result = {"backend": keras.backend.backend(), "cpu": cpu_info(), "train_images": args.train,
              "test_images": args.test, "epochs": args.epochs, "batch_size": args.batch_size,
              "methods": [train(m, args) for m in METHODS],
              "speed": speed(args)}
    emit(result, args.out)
    if args.docs:
        update_docs(args.docs, result)


if __name__ == "__main__":
    main()

"""The seed's "toy version of the data effect" (seed 000), reproduced with keras_vit and Keras.

A tiny ViT (4x4 patches of 32x32 images, D=64, 2 blocks, 4 heads, MLP 128: 72,644 parameters) and
a 4-conv CNN (71,236 parameters) classify the seed's synthetic shapes. Each gets 600 AdamW steps
of 32 images (lr 2e-3, weight decay 0.05, 30 warmup steps then cosine), drawn with replacement
from 200 or 4,000 training images, and is tested on the same 1,000 images. Over seeds 0-9 the
seed's PyTorch script got ViT 0.409-0.522 (200) and 0.765-0.832 (4,000), CNN 0.798-0.963 and
0.740-0.984.

    python -m experiments.data_scale                 # seeds 0-9, ~16 min on 2 CPU cores
    python -m experiments.data_scale --seeds 4 --sizes 200

Differences from the seed's script, none of which changes the budget: Keras initializers (Glorot
rather than PyTorch's Kaiming-uniform, the classifier head included), LayerNorm epsilon 1e-6 rather than 1e-5, Keras's
CosineDecay warmup (step s gets s/30 of the peak rather than (s+1)/30), and the batches drawn by
NumPy rather than `torch.randint`.
"""

import argparse
import json
import time

import numpy as np

from commands import cli, preflight

PROG = "python -m experiments.data_scale"

SEED_TABLE = {("ViT", 200): (0.409, 0.522), ("ViT", 4000): (0.765, 0.832),
              ("CNN", 200): (0.798, 0.963), ("CNN", 4000): (0.740, 0.984)}


def tiny_vit():
    """The seed's TinyViT: class token, learned 1D position embeddings, pre-norm blocks."""
    import keras_vit  # Keras loads after the flags are parsed, so --help needs no backend

    return keras_vit.ViT(image_size=32, patch_size=4, num_channels=1, hidden_dim=64, num_layers=2,
                         num_heads=4, mlp_dim=128, num_classes=4, pooling="token")


def tiny_cnn(c=28, classes=4):
    """The seed's four-conv CNN: 32 -> 16 -> 8 -> 4 with max pooling, then global average pooling."""
    import keras

    conv = lambda ch: keras.layers.Conv2D(ch, 3, padding="same", activation="relu")  # noqa: E731
    return keras.Sequential([
        keras.Input((32, 32, 1)),
        conv(c), keras.layers.MaxPooling2D(2),
        conv(2 * c), keras.layers.MaxPooling2D(2),
        conv(2 * c), keras.layers.MaxPooling2D(2),
        conv(2 * c), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(classes),
    ])


def train_eval(model, X, y, Xte, yte, rng, steps=600, batch_size=32, lr=2e-3, warmup=30):
    """Same budget for every model and training-set size: `steps` AdamW steps of `batch_size`."""
    import keras

    schedule = keras.optimizers.schedules.CosineDecay(0.0, steps - warmup, warmup_target=lr, warmup_steps=warmup)
    model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.05, epsilon=1e-8),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    idx = rng.integers(0, len(y), steps * batch_size)  # batches drawn with replacement, as in the seed
    model.fit(X[idx], y[idx], batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    logits = keras.ops.convert_to_numpy(model.predict(Xte, batch_size=250, verbose=0))
    return float((logits.argmax(-1) == yte).mean())


def run(seeds, sizes, steps=600):
    """Returns {(model, n_train): [accuracy per seed]}."""
    import keras

    from training.datasets.shapes import TEST_SEED, TEST_SIZE, make_shapes  # the package loads Keras

    Xte, yte = make_shapes(TEST_SIZE, np.random.default_rng(TEST_SEED))
    Xte = Xte[..., None]  # (N, 32, 32) -> (N, 32, 32, 1)
    results = {}
    for n_train in sizes:
        for seed in seeds:
            X, y = make_shapes(n_train, np.random.default_rng(seed))
            for name, make in (("ViT", tiny_vit), ("CNN", tiny_cnn)):
                keras.utils.set_random_seed(seed)
                acc = train_eval(make(), X[..., None], y, Xte, yte, np.random.default_rng(seed), steps)
                results.setdefault((name, n_train), []).append(acc)
                print(f"{n_train:5d} images, seed {seed}: {name} {acc:.3f}", flush=True)
    return results


def table(results):
    lines = ["| model | train images | ours: mean | ours: range | seed: range |", "|---|---:|---:|---:|---:|"]
    for (name, n), accs in sorted(results.items(), key=lambda kv: (kv[0][0] != "ViT", kv[0][1])):
        ref = SEED_TABLE.get((name, n))
        ref = f"{ref[0]:.3f}–{ref[1]:.3f}" if ref else "—"
        lines.append(f"| {name} | {n:,} | {np.mean(accs):.3f} | {min(accs):.3f}–{max(accs):.3f} | {ref} |")
    return "\n".join(lines)


def merge(paths):
    """Accuracies of several --out files, concatenated in seed order."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    runs.sort(key=lambda r: r["seeds"][0])
    keys = [k for k in runs[0] if k != "seeds"]
    return {(k.split("@")[0], int(k.split("@")[1])): [a for r in runs for a in r[k]] for k in keys}


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0],
                                     formatter_class=cli.HelpFormatter)
    parser.add_argument("--seeds", default="0-9", help="'0-9' or '1,4,7'")
    parser.add_argument("--sizes", default="200,4000", help="training-set sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=600, help="training steps per run")
    parser.add_argument("--out", help="also write the accuracies to this JSON file")
    parser.add_argument("--table", nargs="+", metavar="JSON", help="only print the table of these --out files "
                        "(runs split over processes, e.g. --seeds 0-4 and --seeds 5-9)")
    args = parser.parse_args(argv)
    if args.table:
        print(table(merge(args.table)))
        return
    preflight.require(PROG, backend=True)
    import keras

    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi) + 1)) if hi else [int(s) for s in args.seeds.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    start = time.time()
    results = run(seeds, sizes, args.steps)
    print(f"\nseeds {seeds}, {args.steps} steps, backend {keras.backend.backend()}, {time.time() - start:.0f} s")
    print(table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"seeds": seeds, **{f"{m}@{n}": accs for (m, n), accs in results.items()}}, f, indent=1)


if __name__ == "__main__":
    main()

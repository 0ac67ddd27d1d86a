r"""How faithful each explanation is, where the evidence is known, and what class_relevance costs.

    KERAS_BACKEND=torch python -m experiments.explain            # the full run (docs/explain.md)
    KERAS_BACKEND=torch python -m experiments.explain --quick    # a few minutes: fewer images
    KERAS_BACKEND=torch python -m experiments.explain --parts localization --localization-model runs/loc.keras \
        --method class_relevance --method "Chefer, log-softmax"   # some methods, the trained model kept

Two parts, written to experiments/results/explain/{full,quick}.{json,md} with the CPU (`lscpu`):

1. Deletion and insertion on the first `--images` Fashion-MNIST test images with the shipped
   checkpoint (checkpoints/fashion-mnist-vit, 28 px, patch 4: 7 x 7 patches, pooling "gap"). Each
   method ranks the patches for the model's top class; patches are set to black (the dataset's
   background) from the most relevant down (deletion: lower area is better), or revealed on a
   black image (insertion: higher is better), `--step` patches at a time, and the class's softmax
   probability is tracked. Occlusion (one forward pass per patch) explains only the first
   `--occlusion-images` of them.
2. Localization: a multi-label ViT (sigmoid outputs, pooling "token") trained here on synthetic
   32 px images holding one or two shapes (`experiments.explain.localization`), scored on images
   holding two shapes of different classes; `--localization-model` keeps the trained model.

The cost of `class_relevance` against one forward pass is a benchmark: `python -m
benchmarks.studies.rollout --parts rollout,class_relevance` (docs/explain.md).
"""

import argparse
import json
import os
import pathlib
import time

import keras
import numpy as np

import keras_vit  # noqa: F401  (registers the classes that the checkpoint names)
from benchmarks.cpu import cpu_info
from experiments.common import CHECKPOINT
from experiments.explain import localization as loc
from experiments.explain.methods import METHODS, VARIANTS, area_under, background, occlusion, perturbation_curves
from training.datasets.fashion_mnist import find_files, read_idx

OUT = pathlib.Path("experiments/results/explain")
LOCALIZATION_MODEL = dict(image_size=32, patch_size=4, hidden_dim=64, num_layers=4, num_heads=4, mlp_dim=128,
                          pooling="token")


def predictor(model, activation):
    """Normalized images -> probabilities (numpy), in batches, compiled by `predict`."""
    return lambda x: keras.ops.convert_to_numpy(activation(model.predict(x, batch_size=1024, verbose=0)))


def with_occlusion(predict):
    """METHODS, VARIANTS and occlusion, which needs the model's probabilities."""
    return {**METHODS, **VARIANTS,
            "occlusion": lambda model, x, classes, fill: occlusion(model, x, classes, fill, predict)}


def faithfulness(count, occlusion_count, step, chunk=100, methods=None):
    """Deletion and insertion areas of every method (or of those named in `methods`) on the first
    `count` test images (occlusion: the first `occlusion_count`), `step` patches removed or revealed
    at a time."""
    model = keras.saving.load_model(CHECKPOINT, safe_mode=True)
    files = find_files()
    pixels, labels = read_idx(files["test_data"])[:count, :, :, None], read_idx(files["test_labels"])[:count]
    x = keras.ops.convert_to_numpy(model.normalize(pixels))
    predict = predictor(model, keras.ops.softmax)
    classes = predict(x).argmax(-1).astype("int32")  # the class explained: the model's top class
    fill = background(model)  # black, the dataset's background
    rows = {}
    for name, method in selected(with_occlusion(predict), methods).items():
        n = occlusion_count if name == "occlusion" else count
        areas, seconds, rng = {"deletion": [], "insertion": []}, 0.0, np.random.default_rng(0)
        keras.ops.convert_to_numpy(method(model, x[:chunk], classes[:chunk], fill))  # warm-up: compilation is not timed
        for start in range(0, n, chunk):
            xs, cs = x[start : min(start + chunk, n)], classes[start : min(start + chunk, n)]
            began = time.perf_counter()
            maps = keras.ops.convert_to_numpy(method(model, xs, cs, fill))
            seconds += time.perf_counter() - began
            curves, fractions = perturbation_curves(model, predict, xs, cs, maps, rng, fill, step=step)
            for key, curve in zip(areas, curves):
                areas[key].append(area_under(curve, fractions))
        rows[name] = {k: float(np.concatenate(v).mean()) for k, v in areas.items()}
        rows[name].update(images=n, ms_per_image=1000 * seconds / n)
        print(name, rows[name], flush=True)
    return {"images": count, "step": step, "accuracy": float((classes == labels).mean()), "methods": rows}


def localization(train_count, test_count, epochs, saved=None, methods=None):
    """The localization scores of every method (or of those named in `methods`) on two-shape test
    images, and the model's accuracy. With `saved` (a .keras path), the trained model is read from
    there when a model trained with the same settings was saved there, else trained and saved."""
    tx, ty, tmasks, tkinds = loc.make_objects(test_count, np.random.default_rng(1), two=1.0)
    model, train_seconds = trained_localization_model(train_count, epochs, saved)
    probs = loc.probabilities(model, keras.ops.convert_to_numpy(model.normalize(tx)))
    result = {"train_images": train_count, "epochs": epochs, "train_seconds": round(train_seconds, 1),
              "test_images": test_count, "label_accuracy": float(((probs > 0.5) == (ty > 0)).mean()),
              "exact_match": float(((probs > 0.5) == (ty > 0)).all(-1).mean()), "methods": {}}
    for name, method in selected(with_occlusion(predictor(model, keras.ops.sigmoid)), methods).items():
        result["methods"][name] = loc.localization_scores(model, tx, tmasks, tkinds, method)
        print(name, result["methods"][name], flush=True)
    return result


def trained_localization_model(train_count, epochs, saved=None):
    """(model, training seconds): the localization model, trained here or read from `saved`, where
    a model of the same settings (LOCALIZATION_MODEL, `train_count`, `epochs`, backend) was saved
    with its training time in a .json beside it."""
    settings = {"config": LOCALIZATION_MODEL, "train_images": train_count, "epochs": epochs,
                "backend": keras.backend.backend()}
    saved = None if saved is None else pathlib.Path(saved)
    notes = None if saved is None else saved.with_suffix(".json")
    if saved is not None and saved.exists() and notes.exists():
        stored = json.loads(notes.read_text())
        if stored["settings"] == settings:
            return keras.saving.load_model(saved, safe_mode=True), stored["train_seconds"]
    x, y, _, _ = loc.make_objects(train_count, np.random.default_rng(0))
    began = time.perf_counter()
    model = loc.train(x, y, LOCALIZATION_MODEL, epochs)
    seconds = time.perf_counter() - began
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        model.save(saved)
        notes.write_text(json.dumps({"settings": settings, "train_seconds": round(seconds, 1)}) + "\n")
    return model, seconds


def selected(methods, names):
    """`methods` limited to those named in `names` (a list), or by default all but VARIANTS."""
    if names is None:
        return {name: method for name, method in methods.items() if name not in VARIANTS}
    unknown = set(names) - set(methods)
    if unknown:
        raise ValueError(f"--methods names {sorted(unknown)}, which are not methods; use some of {list(methods)}")
    return {name: methods[name] for name in names}


def markdown(result):
    """The tables of `result` as Markdown (of the parts it holds)."""
    lines = []
    if "faithfulness" in result:
        lines += _faithfulness_table(result)
    if "localization" in result:
        lines += _localization_table(result["localization"])
    return "\n".join(lines) + "\n"


def _faithfulness_table(result):
    f = result["faithfulness"]
    lines = [f"Fashion-MNIST, first {f['images']} test images, the shipped checkpoint (top-1 {f['accuracy']:.2%}), "
             f"{f['step']} of the 49 patches removed or revealed per step, {result['backend']} on "
             f"{result['cpu']['model']} ({result['cpu']['cores']} CPUs):", "",
             "| method | images | deletion AUC (lower is better) | insertion AUC (higher is better) | ms per image |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {n} | {r['images']} | {r['deletion']:.3f} | {r['insertion']:.3f} | {r['ms_per_image']:.2f} |"
              for n, r in f["methods"].items()]
    return lines + [""]


def _localization_table(g):
    lines = [f"Localization: {g['test_images']} images holding two shapes "
              f"({next(iter(g['methods'].values()))['pairs']} "
              f"(image, class) pairs); model trained on {g['train_images']} images for {g['epochs']} epochs "
              f"({g['train_seconds']:.0f} s; label accuracy {g['label_accuracy']:.1%}, both labels right "
              f"{g['exact_match']:.1%}):", "",
              "| method | peak on its own shape | blanking lowers its own class more |", "|---|---:|---:|"]
    return lines + [f"| {n} | {r['peak']:.1%} | {r['blank']:.1%} |" for n, r in g["methods"].items()] + [""]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 images, a smaller localization run")
    parser.add_argument("--images", type=int, help="Fashion-MNIST test images (default 1000, quick 200)")
    parser.add_argument("--occlusion-images", type=int,
                        help="of those, explained by occlusion (default 300, quick 100)")
    parser.add_argument("--step", type=int, default=7, help="patches removed or revealed per step of the curves")
    parser.add_argument("--train-images", type=int, help="localization training images (default 2000, quick 1000)")
    parser.add_argument("--test-images", type=int, help="two-shape localization test images (default 200, quick 50)")
    parser.add_argument("--epochs", type=int, help="localization training epochs (default 10, quick 5)")
    parser.add_argument("--method", action="append", dest="methods",
                        help="a method to measure (repeat the option for several; default all)")
    parser.add_argument("--localization-model", help="a .keras path: the localization model is read from there "
                                                     "if trained with the same settings, else trained and saved there")
    parser.add_argument("--tag", help="added to the output's name: {full,quick}[-<parts>]-<tag>.{json,md}")
    parser.add_argument("--parts", default="faithfulness,localization",
                        help="comma-separated parts to run; a subset writes {full,quick}-<parts>.{json,md}")
    args = parser.parse_args(argv)
    full = dict(images=1000, occlusion_images=300, train_images=2000, test_images=200, epochs=10)
    quick = dict(images=200, occlusion_images=100, train_images=1000, test_images=50, epochs=5)
    for key, value in (quick if args.quick else full).items():
        setattr(args, key, value if getattr(args, key) is None else getattr(args, key))
    began = time.perf_counter()
    result = {"backend": keras.backend.backend(), "cpu": cpu_info(), "args": vars(args)}
    parts = {"faithfulness": lambda: faithfulness(args.images, min(args.occlusion_images, args.images), args.step,
                                                  methods=args.methods),
             "localization": lambda: localization(args.train_images, args.test_images, args.epochs,
                                                  args.localization_model, args.methods)}
    chosen = args.parts.split(",")
    if set(chosen) - set(parts):
        parser.error(f"--parts={args.parts!r}: use a comma-separated list of {tuple(parts)}")
    name = ("quick" if args.quick else "full") + ("" if set(chosen) == set(parts) else "-" + "-".join(chosen))
    name += f"-{args.tag}" if args.tag else ""
    for part in chosen:
        run = parts[part]  # written after each part, so that a stopped run keeps what it measured
        result[part] = run()
        result["seconds"] = round(time.perf_counter() - began, 1)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        (OUT / f"{name}.md").write_text(markdown(result))
    print(markdown(result) + f"\n{result['seconds']:.0f} s; written to {OUT / name}.{{json,md}}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()

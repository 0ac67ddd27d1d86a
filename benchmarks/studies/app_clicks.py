"""What each of the demo's requests costs on a CPU, to choose what `apps.inference.Predictor` computes
once per image and what it computes on a click (docs/app.md, "Cost of a click").

    KERAS_BACKEND=jax python -m benchmarks.studies.app_clicks                  # the shipped model and ViT-B/16
    KERAS_BACKEND=jax python -m benchmarks.studies.app_clicks --models shipped --repeats 20

For each model: the one pass of a new image (`attention_summary`: logits, summary rows, rollout),
`class_relevance` of the top class alone and of the top five together (one image, five classes),
one layer's full attention maps (a patch click in a layer not seen yet, first and last layer), and
the memory those maps take per image. ViT-B/16 has random weights: the cost does not depend on them.
Median wall time over `--repeats` runs after one warm-up run.
"""

import argparse

import numpy as np

from benchmarks import timing

MODELS = ("shipped", "ViT-B/16")


def build(name):
    import keras_vit
    from apps.sources import DEFAULT_CHECKPOINT

    if name == "shipped":
        return keras_vit.load(DEFAULT_CHECKPOINT)
    return keras_vit.ViT.from_preset(name, num_classes=1000)


def measure(model, repeats):
    """{what: milliseconds or bytes} for one image of random pixels."""
    import keras_vit
    import keras_vit.explain
    from keras import ops

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (1, *model.image_size, model.num_channels), dtype="uint8")
    x = model.normalize(ops.convert_to_tensor(pixels))
    logits = ops.convert_to_numpy(keras_vit.explain.attention_summary(model, x)[0])[0]
    top = [int(c) for c in np.argsort(-logits)[:5]]

    def sync(a):
        return ops.convert_to_numpy(a)

    def summary():
        return [sync(a) for a in keras_vit.explain.attention_summary(model, x)]

    calls = {
        "new image: one pass (logits, rows, rollout)": summary,
        "class relevance, top class": lambda: sync(keras_vit.class_relevance(model, x, top[:1])),
        "class relevance, top 5 together": lambda: sync(keras_vit.class_relevance(model, x, top)),
        "one layer's maps, first layer": lambda: sync(keras_vit.attention_maps(model, x, layers=(0,))),
        "one layer's maps, last layer": lambda: sync(keras_vit.attention_maps(model, x, layers=(-1,))),
    }
    # Each request alone: the figures are the cost of one click, not ratios between requests.
    ms = {what: 1000 * timing.alternate({what: fn}, repeats)[what] for what, fn in calls.items()}
    t = model.num_prefix_tokens + model.grid_size[0] * model.grid_size[1]
    return {
        **ms,
        "bytes of one layer's maps": model.num_heads * t * t * 4,
        "bytes of all layers' maps": model.num_layers * model.num_heads * t * t * 4,
    }


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.app_clicks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    import keras

    results = {name: measure(build(name), args.repeats) for name in args.models}
    print(f"backend {keras.backend.backend()}, median of {args.repeats} runs, one image\n")
    print("| | " + " | ".join(args.models) + " |\n|---|" + "---:|" * len(args.models))
    for what in results[args.models[0]]:
        cells = [results[m][what] for m in args.models]
        text = [f"{v / 2**20:.2f} MB" if what.startswith("bytes") else f"{v:.0f} ms" for v in cells]
        print(f"| {what} | " + " | ".join(text) + " |")


if __name__ == "__main__":
    main()

"""Explanations against the forward pass: wall time and peak memory, each in a fresh process.

    KERAS_BACKEND=jax python -m benchmarks.studies.rollout --preset ViT-B/16 --image-size 896
    python -m benchmarks.studies.rollout --image-size 224 --parts forward,class_relevance --backends torch
    python -m benchmarks.studies.rollout --image-size 224 --parts rollout,class_relevance --backends torch,jax \
        --reps 2 --out benchmarks/results/rollout/class_relevance-cost     # docs/explain.md, "Cost"

Each part ("forward": the plain `model(x)`; "rollout": `keras_vit.attention_rollout`;
"class_relevance": `keras_vit.class_relevance` of the top class) runs in its own child process, so
its peak resident memory (`ru_maxrss`, weights and imports included) is its own. Batch 1, random
weights (timing and memory do not depend on them), one warm-up call, then `--reps` timed calls;
the median is reported, with each part's time over the forward pass's: "time_ratio" from the
forward pass's own process, "same_process_ratio" from forward passes timed in the part's process,
in turn with it (`benchmarks.timing`). Prints one JSON line per backend with the CPU (`lscpu`); with
`--out PREFIX`, also writes PREFIX.json (every backend's figures) and PREFIX.md (their table).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from benchmarks import timing
from benchmarks.cpu import cpu_info

PARTS = ("forward", "rollout", "class_relevance")


def measure(part, preset, image_size, reps):
    """Runs in the child: builds the model, times `part`, returns its figures.

    Its peak memory is read before anything else runs. For a part other than the forward pass,
    the forward pass is then timed too, alternating with the part, so that the ratio of the two
    is taken under the same load (the machine may be shared).
    """
    import keras
    import numpy as np

    import keras_vit

    model = keras_vit.ViT.from_preset(preset, image_size=image_size)
    x = keras.ops.convert_to_tensor(
        np.random.default_rng(0).normal(size=(1, image_size, image_size, 3)).astype("float32"))
    calls = {"forward": lambda: model(x, training=False), "rollout": lambda: keras_vit.attention_rollout(model, x),
             "class_relevance": lambda: keras_vit.class_relevance(model, x)}
    # Each call until its result is in host memory.
    fns = {name: (lambda call=call: keras.ops.convert_to_numpy(call())) for name, call in calls.items()}
    # One warm-up call: the first compiles per op (eager JAX: the whole sweep).
    times = timing.samples({part: fns[part]}, reps)[part]
    result = {"part": part, "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}
    if part != "forward":
        fns["forward"]()  # its warm-up; the part is warm already
        both = timing.samples({"forward": fns["forward"], part: fns[part]}, reps, warmup=0)
        times += both[part]  # the part's figures count all its timed calls
        result["same_process_ratio"] = round(statistics.median(times) / statistics.median(both["forward"]), 2)
    result["seconds"] = statistics.median(times)
    return result


def compare(parts=("forward", "rollout"), preset="ViT-B/16", image_size=896, reps=2, backend=None):
    """Each of `parts` in a child process on `backend` (None: $KERAS_BACKEND); their figures and
    each part's time over the forward pass's ("time_ratio")."""
    backend = backend or os.environ.get("KERAS_BACKEND", "tensorflow")
    result = {"backend": backend, "preset": preset, "image_size": image_size, "batch": 1, "cpu": cpu_info()["model"]}
    for part in dict.fromkeys(("forward", *parts)):
        cmd = [sys.executable, "-m", "benchmarks.studies.rollout", "--part", part, "--preset", preset,
               "--image-size", str(image_size), "--reps", str(reps)]
        env = {**os.environ, "KERAS_BACKEND": backend}
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.strip().splitlines()[-1]
        result[part] = json.loads(out)
    result["time_ratio"] = {p: round(result[p]["seconds"] / result["forward"]["seconds"], 2)
                            for p in parts if p != "forward"}
    return result


def table(cost):
    """The Markdown table of `compare`'s results, one row per backend."""
    first = cost[0]
    parts = [p for p in first if p in PARTS and p != "forward"]
    lines = [f"Cost, {first['preset']} at {first['image_size']} px, batch 1, random weights:", "",
             "| backend | forward | " + " | ".join(f"{p} | {p} / forward (same process)" for p in parts)
             + " | peak RSS " + " / ".join(("forward", *parts)) + " |",
             "|---|---:|" + "---:|---:|" * len(parts) + "---:|"]
    for c in cost:
        cells = [f"{c[p]['seconds']:.2f} s | {c[p]['same_process_ratio']:.2f}x" for p in parts]
        rss = " / ".join(f"{c[p]['peak_rss_gib']:.2f}" for p in ("forward", *parts))
        lines.append(f"| {c['backend']} | {c['forward']['seconds']:.2f} s | " + " | ".join(cells) + f" | {rss} GiB |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="ViT-B/16")
    parser.add_argument("--image-size", type=int, default=896)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--parts", default="forward,rollout", help=f"comma-separated, of {PARTS}")
    parser.add_argument("--backends", help="comma-separated, of jax, tensorflow, torch (default: $KERAS_BACKEND)")
    parser.add_argument("--out", help="also write PREFIX.json and PREFIX.md")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args(argv)
    if args.part:
        print(json.dumps(measure(args.part, args.preset, args.image_size, args.reps)))
        return
    parts = tuple(args.parts.split(","))
    if set(parts) - set(PARTS):
        parser.error(f"--parts={args.parts!r}: use a comma-separated list of {PARTS}")
    backends = (args.backends or os.environ.get("KERAS_BACKEND", "tensorflow")).split(",")
    if set(backends) - {"jax", "tensorflow", "torch"}:
        parser.error(f"--backends={args.backends!r}: use a comma-separated list of jax, tensorflow, torch")
    began, cost = time.perf_counter(), []
    for backend in backends:
        cost.append(compare(parts, args.preset, args.image_size, args.reps, backend))
        print(json.dumps(cost[-1]), flush=True)
    if args.out:
        record = {"cpu": cpu_info(), "args": vars(args), "cost": cost, "seconds": round(time.perf_counter() - began, 1)}
        with open(f"{args.out}.json", "w") as f:
            f.write(json.dumps(record, indent=1) + "\n")
        with open(f"{args.out}.md", "w") as f:
            f.write(table(cost))


if __name__ == "__main__":
    main()

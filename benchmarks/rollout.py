"""Attention rollout against the forward pass: wall time and peak memory, each in a fresh process.

    KERAS_BACKEND=jax python -m benchmarks.rollout --preset ViT-B/16 --image-size 896

Each part ("forward": the plain `model(x)`; "rollout": `keras_vit.attention_rollout`) runs in its own
child process, so its peak resident memory (`ru_maxrss`, weights and imports included) is its own.
Batch 1, random weights (timing and memory do not depend on them), one warm-up call, then `--reps`
timed calls; the median is reported. Prints one JSON line with the CPU (`lscpu`).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from benchmarks.cpu import cpu_info


def measure(part, preset, image_size, reps):
    """Runs in the child: builds the model, times `part`, returns its figures."""
    import keras
    import numpy as np

    import keras_vit

    model = keras_vit.ViT.from_preset(preset, image_size=image_size)
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).normal(size=(1, image_size, image_size, 3)).astype("float32"))
    fn = {"forward": lambda: model(x, training=False), "rollout": lambda: keras_vit.attention_rollout(model, x)}[part]
    keras.ops.convert_to_numpy(fn())  # warm-up: per-op compilation
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        keras.ops.convert_to_numpy(fn())  # blocks until the result is there
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {"part": part, "seconds": statistics.median(times), "peak_rss_gib": round(peak, 3)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="ViT-B/16")
    parser.add_argument("--image-size", type=int, default=896)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--part", choices=("forward", "rollout"), help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args(argv)
    if args.part:
        print(json.dumps(measure(args.part, args.preset, args.image_size, args.reps)))
        return
    result = {"backend": os.environ.get("KERAS_BACKEND", "tensorflow"), "preset": args.preset,
              "image_size": args.image_size, "batch": 1, "cpu": cpu_info()["model"]}
    for part in ("forward", "rollout"):
        cmd = [sys.executable, "-m", "benchmarks.rollout", "--part", part, "--preset", args.preset,
               "--image-size", str(args.image_size), "--reps", str(args.reps)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        result[part] = json.loads(out)
    result["time_ratio"] = round(result["rollout"]["seconds"] / result["forward"]["seconds"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Where JAX spends the training step of the benchmark's small ViT on a CPU, by XLA operation kind.

    KERAS_BACKEND=jax python -m benchmarks.studies.jax_profile [--steps 3] [--erf-gelu]
    LD_PRELOAD=/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 KERAS_BACKEND=jax python -m benchmarks.studies.jax_profile
    XLA_FLAGS=--xla_cpu_use_xnnpack=false KERAS_BACKEND=jax python -m benchmarks.studies.jax_profile

`train_on_batch` of `benchmarks.cases.SMALL` (32 px, patch 4, D 192, 6 blocks, batch 128, AdamW,
jit-compiled as `benchmarks.run` compiles it) runs under `jax.profiler`; the XLA:CPU operations of
the trace are summed by kind (the fusion name without its number), and the matrix products'
GFLOP/s is the step's FLOPs over the wall time during which a product runs (the union of their
spans: XLA:CPU runs operations on two threads, so summed times overlap). `--erf-gelu` times
the exact GELU written as 0.5 x (1 + erf(x / sqrt 2)) instead of `jax.nn.gelu`'s erfc form, to
measure what that alone changes. A profiler trace, so it needs JAX only; the step times it prints
are medians of untraced steps, and it prints their kernel time and page faults, which show the
allocator's cost (commands/malloc.py).
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import resource
import statistics
import tempfile

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
from keras import ops  # noqa: E402

import keras_vit  # noqa: E402
from benchmarks import cases, impls, models, timing  # noqa: E402
from commands import cli, malloc  # noqa: E402

DOT_KINDS = ("ynn_fusion", "xnn_fusion", "dot", "onednn")  # where XLA:CPU puts the matrix products


def _erf_gelu_mlp(self, x, training=None):
    h = self.fc1(x)
    h = 0.5 * h * (1.0 + ops.erf(h * 0.7071067811865476))  # exact GELU through erf
    return self.dropout(self.fc2(self.dropout(h, training=training)), training=training)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=cli.HelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="traced steps (and 3x as many timed)")
    parser.add_argument("--erf-gelu", action="store_true", help="exact GELU via erf instead of jax.nn.gelu")
    args = parser.parse_args(argv)
    if keras.backend.backend() != "jax":
        raise SystemExit(f"KERAS_BACKEND={keras.backend.backend()!r}; this profile needs KERAS_BACKEND=jax")
    if args.erf_gelu:
        keras_vit.layers.TransformerBlock.mlp = _erf_gelu_mlp
    spec = dict(backend="jax", impl="keras_vit", task="train", model=cases.SMALL, batch=128)
    step = impls.keras_train_step(models.keras_model(spec), spec)  # as benchmarks.run builds it
    for _ in range(2):  # compiles; untimed and before the counters, which cover the timed steps only
        step()
    before = resource.getrusage(resource.RUSAGE_SELF)
    times = timing.samples({"step": step}, 3 * args.steps, warmup=0)["step"]
    after = resource.getrusage(resource.RUSAGE_SELF)
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        for _ in range(args.steps):
            step()
        jax.profiler.stop_trace()
        path = glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"), recursive=True)[0]
        with gzip.open(path) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    # XLA operations only: not Python frames ($...), not the executor's own spans.
    ops_ = [e for e in events if e.get("ph") == "X" and "dur" in e
            and not e["name"].startswith(("$", "ThunkExecutor", "SlinkyThreadPool"))]
    by_kind = collections.Counter()
    for e in ops_:
        by_kind[re.sub(r"[.\d]+$", "", e["name"])] += e["dur"] / 1e6 / args.steps  # seconds per step
    total = sum(by_kind.values())
    busy = _covered([e for e in ops_]) / args.steps
    dots = _covered([e for e in ops_ if e["name"].startswith(DOT_KINDS)]) / args.steps
    flops = cases.step_flops(spec)
    print(f"train step: median {statistics.median(times):.3f} s over {len(times)} untraced steps "
          f"({'erf' if args.erf_gelu else 'jax.nn.gelu'} GELU, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})")
    n = len(times)
    print(f"per untraced step: {(after.ru_stime - before.ru_stime) / n:.2f} s in the kernel, "
          f"{(after.ru_minflt - before.ru_minflt) / n:,.0f} minor page faults (malloc: {malloc.in_use()})")
    print(f"XLA operations cover {busy:.3f} s of a traced step; the matrix products cover {dots:.3f} s "
          f"({100 * dots / busy:.0f}%): {flops / 1e9:.0f} GFLOP per step -> {flops / dots / 1e9:.0f} GFLOP/s")
    print("time by kind, summed over threads (s per step):")
    for kind, t in by_kind.most_common(12):
        print(f"  {t:7.3f} s  {100 * t / total:5.1f}%  {kind}")


def _covered(events):
    """Seconds of wall time during which at least one of `events` runs (the union of their spans)."""
    total, end = 0.0, None
    for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in events):  # microseconds
        if end is None or start > end:
            total, end = total + (stop - start), stop
        elif stop > end:
            total, end = total + (stop - end), stop
    return total / 1e6


if __name__ == "__main__":
    main()

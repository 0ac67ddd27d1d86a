"""Where JAX spends a step of keras_vit on a CPU: the top XLA operations, and what each is in the model.

    KERAS_BACKEND=jax python -m benchmarks.studies.jax_profile [--steps 3] [--erf-gelu]
    LD_PRELOAD=/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python -m benchmarks.studies.jax_profile \
        --model vit-s16 --task train --dtype bfloat16 --steps 2
    XLA_FLAGS=--xla_cpu_use_xnnpack=false KERAS_BACKEND=jax python -m benchmarks.studies.jax_profile

`--model small` is `benchmarks.cases.SMALL` (32 px, patch 4, D 192, 6 blocks, batch 128); `vit-s16`
is ViT-S/16 at 224 px, batch 16, the benchmark's main case. `--task train` is `train_on_batch` with
AdamW, `infer` the jitted forward pass, both built as `benchmarks.run` builds them; `--dtype bfloat16`
is Keras' `mixed_bfloat16` policy. The step runs under `jax.profiler`. Each operation of the trace
(a fusion or a single op of the optimized HLO) is summed over XLA's threads, so the seconds per step
can add up to more than the step's wall time; its share is of that sum. The optimized HLO, dumped
by XLA as text, says what each operation is: its kind (a dot and the library that runs it, a
reduce, elementwise, transpose/copy, convert), its output dtype, and the Keras layer and primitives
of its `op_name` metadata (fwd: forward, bwd: backward). The matrix products' GFLOP/s is the step's
FLOPs over the wall time during which a product runs (the union of their spans). `--erf-gelu` times
the exact GELU written as 0.5 x (1 + erf(x / sqrt 2)) instead of `jax.nn.gelu`'s erfc form. The step
times are medians of untraced steps, with their kernel time and page faults, which show the
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
import shutil
import statistics
import tempfile

from benchmarks.hlo import describe, dot_dtypes, kind, parse_hlo
from commands import cli

DOT_KINDS = ("ynn_fusion", "xnn_fusion", "dot", "onednn")  # where XLA:CPU puts the matrix products
MODELS = ("small", "vit-s16")


def _erf_gelu_mlp(self, x, training=None):
    from keras import ops

    h = self.fc1(x)
    h = 0.5 * h * (1.0 + ops.erf(h * 0.7071067811865476))  # exact GELU through erf
    return self.dropout(self.fc2(self.dropout(h, training=training)), training=training)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=cli.HelpFormatter)
    parser.add_argument("--model", default="small", choices=MODELS, help="small: 32 px, b128; vit-s16: 224 px, b16")
    parser.add_argument("--task", default="train", choices=("train", "infer"),
                        help="the train step (train_on_batch) or inference (predict_on_batch)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="bfloat16: Keras' mixed_bfloat16 policy")
    parser.add_argument("--batch", type=int, help="default: 128 for small, 16 for vit-s16")
    parser.add_argument("--steps", type=int, default=3, help="traced steps (and 3x as many timed)")
    parser.add_argument("--top", type=int, default=10, help="rows of the table")
    parser.add_argument("--hlo-dir", help="keep XLA's dump (the optimized HLO) here; default: a temporary folder")
    parser.add_argument("--erf-gelu", action="store_true", help="exact GELU via erf instead of jax.nn.gelu")
    return parser.parse_args(argv)


def spec_of(args):
    """The benchmark's spec dict of the profiled step."""
    from benchmarks import cases

    model = cases.SMALL if args.model == "small" else cases.preset("ViT-S/16")
    batch = args.batch or (128 if args.model == "small" else 16)
    dtype = "mixed_bfloat16" if args.dtype == "bfloat16" else "float32"
    return dict(backend="jax", impl="keras_vit", task=args.task, model=model, batch=batch, dtype=dtype)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    dump = args.hlo_dir or tempfile.mkdtemp(prefix="jax-profile-hlo-")
    # Read when XLA's CPU client starts, which is after these imports: the optimized HLO, as text.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump} --xla_dump_hlo_as_text"
    try:
        _profile(args, dump)
    finally:
        if not args.hlo_dir:
            shutil.rmtree(dump, ignore_errors=True)


def _profile(args, dump):
    import jax
    import keras

    import keras_vit
    from benchmarks import cases, impls, models, timing
    from commands import malloc

    if keras.backend.backend() != "jax":
        raise SystemExit(f"KERAS_BACKEND={keras.backend.backend()!r}; this profile needs KERAS_BACKEND=jax")
    if args.erf_gelu:
        keras_vit.layers.TransformerBlock.mlp = _erf_gelu_mlp
    spec = spec_of(args)
    model = models.keras_model(spec)
    build = impls.keras_train_step if args.task == "train" else impls.keras_infer_step
    step = build(model, spec)  # as benchmarks.run builds it
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
    ops_ = xla_events(trace)
    module = max(collections.Counter(e["args"]["hlo_module"] for e in ops_).items(), key=lambda kv: kv[1])[0]
    ops_ = [e for e in ops_ if e["args"]["hlo_module"] == module]
    path = _module_path(dump, module, {e["name"] for e in ops_})
    with open(path) as f:
        hlo = parse_hlo(f.read())
    with open(path.replace(".cpu_after_optimizations.txt", ".before_optimizations.txt")) as f:
        before_passes = dot_dtypes(parse_hlo(f.read()))
    seconds = collections.Counter()
    for e in ops_:
        seconds[e["name"]] += e["dur"] / 1e6 / args.steps  # seconds per step
    total = sum(seconds.values())
    busy = _covered(ops_) / args.steps
    dots = _covered([e for e in ops_ if e["name"].startswith(DOT_KINDS)]) / args.steps
    flops = cases.step_flops(spec)
    n = len(times)
    print(f"{args.model} {args.task} b{spec['batch']} {spec['dtype']}: median {statistics.median(times):.3f} s "
          f"over {n} untraced steps ({'erf' if args.erf_gelu else 'jax.nn.gelu'} GELU, "
          f"XLA_FLAGS={os.environ['XLA_FLAGS'].split(' --xla_dump_to')[0].strip()!r}, "
          f"malloc: {malloc.in_use()}, load average {os.getloadavg()[0]:.1f})")
    print(f"per untraced step: {(after.ru_stime - before.ru_stime) / n:.2f} s in the kernel, "
          f"{(after.ru_minflt - before.ru_minflt) / n:,.0f} minor page faults")
    print(f"XLA operations of {module} cover {busy:.3f} s of a traced step and sum to {total:.3f} s over "
          f"threads; the matrix products cover {dots:.3f} s ({100 * dots / busy:.0f}%): "
          f"{flops / 1e9:.0f} GFLOP per step -> {flops / dots / 1e9:.0f} GFLOP/s\n")
    print(f"matrix products by operand dtype: {dict(before_passes)} before XLA's passes, "
          f"{dict(dot_dtypes(hlo))} as XLA:CPU runs them\n")
    print(table(seconds, hlo, args.top))
    print("\nThe same, each op summed with its copies in the other blocks:\n")
    print(table(by_layer(seconds, hlo), hlo, args.top))


def xla_events(trace):
    """The trace's XLA operations (complete events naming an HLO op), not Python frames or executor spans."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "hlo_op" in e.get("args", {})]


def _module_path(dump, module, names):
    """Path of the optimized HLO of `module` that defines every op in `names` (the latest such dump)."""
    for path in sorted(glob.glob(os.path.join(dump, f"*.{module}.cpu_after_optimizations.txt")), reverse=True):
        with open(path) as f:
            text = f.read()
        if all(f"%{name} = " in text for name in names):
            return path
    raise SystemExit(f"no optimized HLO of {module} in the dump defines all {len(names)} traced ops")


def by_layer(seconds, hlo):
    """`seconds` ({op: s}) summed over ops of the same kind and place in every block (block_3 -> block_*),
    keyed by the slowest op of each group and the group's size: {(op, count): s}."""
    groups = collections.defaultdict(list)
    for name, s in seconds.items():
        place = re.sub(r"block_\d+", "block_*", describe(hlo, name))
        groups[kind(hlo, name), hlo[name]["dtype"], place or name].append((s, name))
    return collections.Counter({(max(ops)[1], len(ops)): sum(s for s, _ in ops) for ops in groups.values()})


def table(seconds, hlo, top=10):
    """Markdown: the `top` ops ({op or (op, count): s}) by seconds per step, with their share of the sum,
    kind and place."""
    total = sum(seconds.values())
    rows = ["| op | s/step | % | kind | out | in the model |", "|---|---:|---:|---|---|---|"]
    for key, s in seconds.most_common(top):
        name, count = key if isinstance(key, tuple) else (key, 1)
        label = f"`{name}`" + (f" ×{count}" if count > 1 else "")
        place = describe(hlo, name)
        if count > 1:
            place = re.sub(r"block_\d+", "block_*", place)
        rows.append(f"| {label} | {s:.3f} | {100 * s / total:.1f} | {kind(hlo, name)} | {hlo[name]['dtype']} "
                    f"| {place} |")
    return "\n".join(rows)


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

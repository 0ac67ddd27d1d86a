"""keras_vit on the torch backend under `mixed_bfloat16` against timm under `torch.autocast(bfloat16)`.

    python -m benchmarks.studies.torch_bf16_profile [--preset ViT-S/16] [--batch 16] [--reps 6]
    python -m benchmarks.studies.torch_bf16_profile --task train --dtype float32 --reps 3 --top 10

Both models run inference on the same random (B, 224, 224, 3) batch under `torch.no_grad`, one
call at a time in turn (A B B A ...), so a change in machine load hits both alike; the ratio is
of the median step times. Then each runs two steps under `torch.profiler`, and the aten ops are
summed by name (self CPU time, ms per step, with their call counts): which kernels keras_vit calls
that timm does not, and which of the same kernels cost more. Prints markdown. `--task train` times
and profiles the train step instead, both built as `benchmarks.run` builds them (keras_vit's
`train_on_batch` with AdamW, timm's forward, backward and `AdamW.step`); `--dtype float32` runs
both without bf16.
"""

import argparse
import os

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import keras_vit  # noqa: E402
from benchmarks import cases, impls, models, timing  # noqa: E402
from benchmarks.cpu import cpu_info  # noqa: E402
from commands import cli  # noqa: E402


def keras_step(preset, x, policy="mixed_bfloat16"):
    """keras_vit.ViT built under the `policy`: () -> logits (B, classes)."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = keras_vit.ViT(**preset)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    xt = keras.ops.convert_to_tensor(x)  # (B, H, W, C) float32

    def step():
        with torch.no_grad():
            return model(xt, training=False)

    return step


def timm_step(preset, x, bf16=True):
    """timm's VisionTransformer, under torch.autocast(bfloat16) when `bf16`: () -> logits (B, classes)."""
    model = models.timm_model(preset).eval()
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()  # (B, H, W, C) -> (B, C, H, W)

    def step():
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            return model(xt)

    return step


def steps(args, preset, x):
    """{label: () -> anything}: keras_vit's step and timm's, for the task and dtype of `args`."""
    bf16 = args.dtype == "bfloat16"
    ours, theirs = ("mixed_bfloat16", "torch.autocast bf16") if bf16 else ("float32", "float32")
    if args.task == "infer":
        return {f"keras_vit (torch, {ours})": keras_step(preset, x, ours),
                f"timm ({theirs})": timm_step(preset, x, bf16)}
    spec = dict(backend="torch", impl="keras_vit", task="train", model=preset, batch=args.batch, dtype=ours)
    return {f"keras_vit train step (torch, {ours})": impls.keras_train_step(models.keras_model(spec), spec),
            f"timm train step ({theirs})": impls.timm_step(dict(spec, impl="timm", dtype=ours), "cpu")}


def op_table(step, steps=2, top=15):
    """[(aten op, self CPU ms per step, % of all ops' self time, calls per step)] of the `top` ops, largest first."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    rows = [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in prof.key_averages()]
    total = sum(ms for _, ms, _ in rows)
    return [(op, ms, 100 * ms / total, calls) for op, ms, calls in sorted(rows, key=lambda r: -r[1])[:top]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=cli.HelpFormatter)
    parser.add_argument("--preset", default="ViT-S/16", help="the paper preset, at 224 px")
    parser.add_argument("--batch", type=int, default=16, help="images per step")
    parser.add_argument("--reps", type=int, default=6, help="timed steps of each model, in turn")
    parser.add_argument("--task", default="infer", choices=("infer", "train"),
                        help="inference under no_grad, or the AdamW train step")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                        help="bfloat16: keras_vit's mixed_bfloat16 against timm's torch.autocast")
    parser.add_argument("--top", type=int, default=15, help="rows of each op table")
    args = parser.parse_args(argv)
    preset = cases.preset(args.preset)
    size = preset["image_size"]
    x = np.random.default_rng(0).standard_normal((args.batch, size, size, preset.get("num_channels", 3)), "float32")
    fns = steps(args, preset, x)
    medians = timing.alternate(fns, args.reps)
    keras_s, timm_s = medians.values()
    print(f"{args.preset}, {size} px, batch {args.batch}, {args.task}, {cpu_info()['model']}, "
          f"torch {torch.__version__}, "
          f"Keras {keras.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}\n")
    print("| model | median s/step | img/s |\n|---|---:|---:|")
    for name, s in medians.items():
        print(f"| {name} | {s:.3f} | {args.batch / s:.1f} |")
    print(f"\nkeras_vit / timm speed: {timm_s / keras_s:.2f}x ({args.reps} alternating steps each)\n")
    for name, step in fns.items():
        print(f"**{name}**, aten ops by self CPU time\n\n| op | ms/step | % | calls/step |\n|---|---:|---:|---:|")
        for op, ms, share, calls in op_table(step, top=args.top):
            print(f"| `{op}` | {ms:.1f} | {share:.1f} | {calls} |")
        print()


if __name__ == "__main__":
    main()

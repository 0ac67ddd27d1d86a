"""keras_vit on the torch backend under `mixed_bfloat16` against timm under `torch.autocast(bfloat16)`.

    python -m benchmarks.studies.torch_bf16_profile [--preset ViT-S/16] [--batch 16] [--reps 6]

Both models run inference on the same random (B, 224, 224, 3) batch under `torch.no_grad`, one
call at a time in turn (A B B A ...), so a change in machine load hits both alike; the ratio is
of the median step times. Then each runs two steps under `torch.profiler`, and the aten ops are
summed by name (self CPU time, ms per step, with their call counts): which kernels keras_vit calls
that timm does not, and which of the same kernels cost more. Prints markdown.
"""

import argparse
import os

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import keras_vit  # noqa: E402
from benchmarks import cases, models, timing  # noqa: E402
from benchmarks.cpu import cpu_info  # noqa: E402


def keras_step(preset, x):
    """keras_vit.ViT built under the mixed_bfloat16 policy: () -> logits (B, classes)."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = keras_vit.ViT(**preset)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    xt = keras.ops.convert_to_tensor(x)  # (B, H, W, C) float32

    def step():
        with torch.no_grad():
            return model(xt, training=False)

    return step


def timm_step(preset, x):
    """timm's VisionTransformer under torch.autocast(bfloat16): () -> logits (B, classes)."""
    model = models.timm_model(preset).eval()
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()  # (B, H, W, C) -> (B, C, H, W)

    def step():
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            return model(xt)

    return step


def op_table(step, steps=2, top=15):
    """[(aten op, self CPU ms per step, calls per step)] of the `top` ops, largest first."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    rows = [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r[1])[:top]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ViT-S/16")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--reps", type=int, default=6)
    args = parser.parse_args(argv)
    preset = cases.preset(args.preset)
    size = preset["image_size"]
    x = np.random.default_rng(0).standard_normal((args.batch, size, size, preset.get("num_channels", 3)), "float32")
    steps = {"keras_vit (torch, mixed_bfloat16)": keras_step(preset, x),
             "timm (torch.autocast bf16)": timm_step(preset, x)}
    medians = timing.alternate(steps, args.reps)
    keras_s, timm_s = medians.values()
    print(f"{args.preset}, {size} px, batch {args.batch}, {cpu_info()['model']}, torch {torch.__version__}, "
          f"Keras {keras.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}\n")
    print("| model | median s/step | img/s |\n|---|---:|---:|")
    for name, s in medians.items():
        print(f"| {name} | {s:.3f} | {args.batch / s:.1f} |")
    print(f"\nkeras_vit / timm speed: {timm_s / keras_s:.2f}x ({args.reps} alternating steps each)\n")
    for name, step in steps.items():
        print(f"**{name}**, aten ops by self CPU time\n\n| op | ms/step | calls/step |\n|---|---:|---:|")
        for op, ms, calls in op_table(step):
            print(f"| `{op}` | {ms:.1f} | {calls} |")
        print()


if __name__ == "__main__":
    main()

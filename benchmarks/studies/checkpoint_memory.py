"""Peak resident memory of `keras_vit.load`, as a multiple of the model's float32 size.

    python -m benchmarks.studies.checkpoint_memory [--preset ViT-S/16] [--backends jax torch tensorflow]

A random model of the preset is written once as a float32 and a bfloat16 `.npz` (vit_jax names)
and `.safetensors` (timm names). Each file is then loaded in a fresh process of each backend,
after a warm-up load of a one-block model, and the process's peak RSS during the load (VmHWM,
reset through /proc/self/clear_refs) is compared with its RSS before it. The figure includes the
new model's own variables (1x), the arrays read (1x) and every transient copy.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

FILES = ("float32.npz", "bfloat16.npz", "float32.safetensors", "bfloat16.safetensors")


def _write(folder, preset):
    """Writes the four files and a one-block warm-up file; returns the model's float32 MiB."""
    import numpy as np
    import safetensors

    import keras_vit
    from keras_vit.checkpoints import google, rules
    from tests.checkpoints.hostile_files import save_npz, save_safetensors

    model = keras_vit.ViT.from_preset(preset, num_classes=1000)
    weights = rules.tensors(google.rules("", False, False, model.num_prefix_tokens), model)  # vit_jax names
    keras_vit.save_checkpoint(model, folder / "timm.safetensors")
    with safetensors.safe_open(str(folder / "timm.safetensors"), framework="numpy") as f:
        timm, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    for dtype in ("float32", "bfloat16"):
        save_npz(folder / f"{dtype}.npz", weights, dtype)
        save_safetensors(folder / f"{dtype}.safetensors", timm, dtype, meta)
    small = keras_vit.ViT.from_preset(preset, num_classes=1000, num_layers=1)
    keras_vit.save_checkpoint(small, folder / "warmup.safetensors")
    return sum(np.asarray(v).nbytes for v in weights.values()) / 2**20


def _status_mib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def _measure(path, warmup):
    """Run in a child: prints the peak RSS growth (MiB) while `path` loads."""
    import keras_vit

    keras_vit.load(warmup)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # restarts VmHWM, which ru_maxrss (inherited across fork and exec) cannot
    before = _status_mib("VmRSS")
    keras_vit.load(path)
    print(json.dumps(_status_mib("VmHWM") - before))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ViT-S/16")
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"])
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)  # the child's entry point
    args = parser.parse_args()
    if args.measure:
        return _measure(*args.measure)
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        size = _write(folder, args.preset)
        print(f"{args.preset}: float32 model {size:.1f} MiB; peak RSS growth while loading")
        for backend in args.backends:
            for name in FILES:
                cmd = [sys.executable, "-m", "benchmarks.studies.checkpoint_memory", "--measure", str(folder / name),
                       str(folder / "warmup.safetensors")]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                     env={**os.environ, "KERAS_BACKEND": backend}).stdout
                growth = json.loads(out.strip().splitlines()[-1])
                print(f"  {backend:10s} {name:22s} {growth:7.1f} MiB  {growth / size:.2f}x")


if __name__ == "__main__":
    main()

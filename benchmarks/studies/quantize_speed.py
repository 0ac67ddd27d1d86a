"""Speed of Keras' own `model.quantize` modes on each backend, and of the OpenVINO int8 serving path.

    python -m benchmarks.studies.quantize_speed                  # ViT-S/16, 224 px, batch 8, every backend
    python -m benchmarks.studies.quantize_speed --backends jax --reps 5

One worker process per backend (TensorFlow, JAX, torch) times `predict_on_batch` of a ViT with
random weights in float32, then of copies quantized by `ViT.quantize("int8")` and `("int4")`. The
torch worker also exports the float32 model with `keras_vit.export(format="openvino")` and times
OpenVINO float32 and NNCF int8 (`keras_vit.serving.quantize_int8`) on the same images, as uint8
pixels (the serving graph normalizes them). Each figure is the median of `--reps` timed batches
after two untimed ones. Prints one JSON object with the CPU (lscpu's model name and flags: AMX and
AVX-512 VNNI decide which int8 kernels exist) and every time, and the ratios to float32 of the same
backend; `--out` also writes it to a file.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from benchmarks import timing

BACKENDS = ("tensorflow", "jax", "torch")
MODES = ("float32", "int8", "int4")


def worker(preset, image_size, batch, reps):
    """{mode: seconds per batch} on the current backend (and "openvino f32" / "openvino int8" on torch)."""
    import keras

    import keras_vit
    from benchmarks.cases import preset as preset_args

    config = preset_args(preset, image_size=image_size)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (batch, image_size, image_size, 3), dtype="uint8")
    times = {}
    for mode in MODES:
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT(**config)
        if mode != "float32":
            model.quantize(mode)
        x = model.normalize(pixels)
        times[mode] = timing.alternate({mode: lambda model=model: np.asarray(model.predict_on_batch(x))}, reps,
                                       warmup=2)[mode]
        if mode == "float32" and keras.backend.backend() == "torch":
            times.update(_openvino(model, pixels, reps))
        del model
    return times


def _openvino(model, pixels, reps):
    import tempfile

    import keras_vit
    from keras_vit import serving

    with tempfile.TemporaryDirectory(prefix="quantize-speed-") as folder:
        path = keras_vit.export(model, os.path.join(folder, "model.xml"), format="openvino")
        calibration = np.random.default_rng(1).integers(0, 256, (32, *pixels.shape[1:]), dtype="uint8")
        int8 = serving.quantize_int8(path, os.path.join(folder, "int8.xml"), calibration)
        out = {}
        for name, artifact in (("openvino f32", path), ("openvino int8", int8)):
            fn = serving.load(artifact, "openvino", precision="f32")
            out[name] = timing.alternate({name: lambda: fn(pixels)}, reps, warmup=2)[name]
        return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="ViT-S/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"comma-separated, of {', '.join(BACKENDS)}")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # one backend, chosen by KERAS_BACKEND; the reply is the last stdout line
        print(json.dumps(worker(args.preset, args.image_size, args.batch, args.reps)))
        return
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"--backends {','.join(unknown)} is not allowed; use some of {', '.join(BACKENDS)}")
    from benchmarks.cpu import cpu_info, emit

    result = {"preset": args.preset, "image_size": args.image_size, "batch": args.batch, "reps": args.reps,
              "cpu": cpu_info(), "seconds": {}, "ratio_to_float32": {}}
    for backend in backends:
        command = [sys.executable, "-m", "benchmarks.studies.quantize_speed", "--worker", "--preset", args.preset,
                   "--image-size", str(args.image_size), "--batch", str(args.batch), "--reps", str(args.reps)]
        done = subprocess.run(command, env={**os.environ, "KERAS_BACKEND": backend}, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"the {backend} worker failed:\n{done.stderr[-3000:]}")
        times = json.loads(done.stdout.strip().splitlines()[-1])
        result["seconds"][backend] = times
        result["ratio_to_float32"][backend] = {k: round(v / times["float32"], 3) for k, v in times.items()}
    emit(result, args.out)


if __name__ == "__main__":
    main()

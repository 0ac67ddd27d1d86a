"""Transfer from the shipped Fashion-MNIST checkpoint to handwritten digits: full fine-tuning
against LoRA, each run through the training CLI.

    KERAS_BACKEND=tensorflow python -m experiments.lora_transfer --out experiments/results/lora_transfer.json

Every run is `python -m training.train --recipe fine_tune --weights <shipped model.keras> --dataset
digits --val-split validation` (a new zero-initialized head for the 10 digits, SGD with momentum,
warmup then cosine) for `--epochs`, with `--lora-rank 4` or `8` for LoRA (query and value, plus the
head) or without it for full fine-tuning. Each method tries every learning rate of
`--learning-rates`; the one with the best validation accuracy (200 held-out training images, also
the best-epoch choice) is reported with its test accuracy on the 500 test images, never chosen by
them. Reported per method: test accuracy, trainable and total parameters (metrics.json), the median
training step time after the first epoch (metrics.json's step_seconds), and the peak resident memory
of the training process (ru_maxrss of the child). Prints one JSON object, with the CPU.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from benchmarks.cpu import cpu_info, emit
from experiments.common import CHECKPOINT

METHODS = {"full": None, "lora r4": 4, "lora r8": 8}
# Runs the CLI as a child and prints its peak RSS in KiB: the child's own, since this wrapper waits
# for nothing else (RUSAGE_CHILDREN of a fresh process covers that one command only).
WRAPPER = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")


def train(out, rank, learning_rate, args):
    """metrics.json of one CLI run, with "peak_rss_mb" added."""
    command = [sys.executable, "-m", "training.train", "--recipe", "fine_tune", "--weights", args.checkpoint,
               "--dataset", "digits", "--val-split", "validation", "--test-split", "test", "--image-size", "28",
               "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
               "--learning-rate", str(learning_rate), "--out", out, "--verbose", "0"]
    if rank:
        command += ["--lora-rank", str(rank)]
    done = subprocess.run([sys.executable, "-c", WRAPPER, *command], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
    metrics["peak_rss_mb"] = round(int(done.stdout.strip().splitlines()[-1]) / 1024, 1)
    with open(os.path.join(out, "log.csv")) as f:
        rows = f.read().strip().splitlines()
    header = rows[0].split(",")
    column = header.index("val_accuracy")
    metrics["val_accuracy"] = max(float(r.split(",")[column]) for r in rows[1:])
    return metrics


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=CHECKPOINT)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rates", default="0.03,0.1,0.3", help="comma-separated, tried per method")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.learning_rates.split(",")]
    methods = [m.strip() for m in args.methods.split(",")]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"--methods {unknown} are not allowed; use some of {list(METHODS)}")
    result = {"checkpoint": os.path.relpath(args.checkpoint), "dataset": "digits", "epochs": args.epochs,
              "batch_size": args.batch_size, "backend": os.environ.get("KERAS_BACKEND", "tensorflow"),
              "cpu": cpu_info(), "runs": {}, "chosen": {}}
    with tempfile.TemporaryDirectory(prefix="lora-transfer-") as folder:
        for method in methods:
            runs = {}
            for rate in rates:
                m = train(os.path.join(folder, f"{method.replace(' ', '-')}-{rate}"), METHODS[method], rate, args)
                runs[str(rate)] = {k: m[k] for k in ("val_accuracy", "test_accuracy", "trainable_parameters",
                                                     "parameters", "step_seconds", "peak_rss_mb")}
                print(method, rate, json.dumps(runs[str(rate)]), file=sys.stderr, flush=True)
            result["runs"][method] = runs
            best = max(runs, key=lambda r: runs[r]["val_accuracy"])
            result["chosen"][method] = {"learning_rate": float(best), **runs[best],
                                        "trainable_percent": round(100 * runs[best]["trainable_parameters"]
                                                                   / runs[best]["parameters"], 2)}
    emit(result, args.out)


if __name__ == "__main__":
    main()

"""Peak memory growth of each process while a multi-process model-parallel run saves, per format.

    python -m benchmarks.studies.save_memory [--hidden-dim 768 --num-layers 6 --mlp-dim 3072 --num-heads 12]

writes benchmarks/results/save_memory/save_memory.json and .md (with lscpu's CPU model and flags)
and prints the table that docs/distributed.md quotes.

Two JAX processes on 127.0.0.1, one CPU device each, hold a ViT on a 1x2 mesh (every block split
between them, `keras_vit.layout_map`) after one AdamW step, so the optimizer moments are real
values (zeros would compress to nothing). Each process then saves the whole training state once,
as the training loop does each epoch:

    gather  `--checkpoint-format keras`: `ViT.save` gathers the model and its optimizer state
            whole into every process (`keras_vit.distribution.host_copy`) and writes model.keras;
    orbax   `--checkpoint-format orbax`: `keras.callbacks.OrbaxCheckpoint` writes each process'
            own shards, in the background; the figure covers the save until it is committed.

Each format runs in fresh processes. Before the save the libraries it uses are imported and the
peak RSS (VmHWM) is restarted through /proc/self/clear_refs; the figure is the peak minus the RSS
before, against the bytes of the whole training state (weights and AdamW moments of both
processes). Last, `training.export_checkpoint` writes the Orbax checkpoint as one .keras and one
.safetensors file, each in a fresh single process, whose growth is compared with the weights'
bytes (the source of its MEMORY_FACTOR).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

MIB = 2**20
MODULE = "benchmarks.studies.save_memory"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _status_bytes(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) * 1024


def _restart_peak():
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # restarts VmHWM
    return _status_bytes("VmRSS")


def _trained_model(args, dist):
    """The ViT of `args` on the run's mesh after one AdamW step on random data."""
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit

    with dist.scope():
        model = keras_vit.ViT(image_size=32, patch_size=4, hidden_dim=args.hidden_dim, num_layers=args.num_layers,
                              num_heads=args.num_heads, mlp_dim=args.mlp_dim, num_classes=10, name="vit")
        model.compile(keras.optimizers.AdamW(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices((rng.normal(size=(4, 32, 32, 3)).astype("float32"),
                                               rng.integers(0, 10, 4))).batch(4, drop_remainder=True)
    model.fit(dist.shard(data).repeat(), epochs=1, steps_per_epoch=1, verbose=0)
    return model


def _state_bytes(model):
    """(bytes of the whole training state, bytes this process holds of it)."""
    variables = model.variables + model.optimizer.variables
    whole = sum(v.value.size * v.value.dtype.itemsize for v in variables)
    local = sum(s.data.size * s.data.dtype.itemsize for v in variables for s in v.value.addressable_shards)
    return whole, local


def _worker(args):
    """One process of the 2-process job: trains a step, saves once, prints its figures as JSON."""
    import types

    from training import checkpoint_files, checkpointing, distribute

    spec = types.SimpleNamespace(distribution="model_parallel", mesh="1x2", coordinator=args.coordinator,
                                 num_processes=2, process_id=args.process_id)
    dist = distribute.from_args(spec)
    model = _trained_model(args, dist)
    whole, local = _state_bytes(model)
    import h5py  # noqa: F401  the gather save's writer
    import keras
    import tensorstore  # noqa: F401  Orbax's

    before = _restart_peak()
    if args.worker == "gather":
        dist.save(model, os.path.join(args.dir, "model.keras"))
    else:
        checkpoint_files.add_chunk_checksums()  # as training.train does
        callback = keras.callbacks.OrbaxCheckpoint(os.path.join(args.dir, "model"))
        callback.set_model(model)
        callback.on_epoch_end(0, {})
        callback.wait_until_finished()
    growth = _status_bytes("VmHWM") - before
    if args.worker == "orbax":
        checkpointing.latest_step(os.path.join(args.dir, "model"))  # committed (a collective: every process)
    print(json.dumps(dict(process=args.process_id, growth=growth, whole=whole, local=local)))


def _export_worker(args):
    """A fresh process: writes the Orbax checkpoint as one .keras file; prints its growth."""
    os.environ["KERAS_BACKEND"] = "jax"
    import h5py  # noqa: F401
    import tensorflow  # noqa: F401  Keras' .keras writer imports it
    import tensorstore  # noqa: F401

    from training import checkpointing, export_checkpoint

    step = checkpointing.latest_step(args.dir)
    _, weights = export_checkpoint.needed_bytes(step)
    before = _restart_peak()
    target = os.path.join(os.path.dirname(args.dir), "exported" + args.suffix)
    export_checkpoint.export(args.dir, target, max_memory=2**62)
    print(json.dumps(dict(growth=_status_bytes("VmHWM") - before, weights=weights)))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_job(args, method, folder):
    """Runs the 2-process job for `method`; returns each process' figures."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("XLA_FLAGS", None)
    coordinator = f"127.0.0.1:{_free_port()}"
    sizes = ["--hidden-dim", str(args.hidden_dim), "--num-layers", str(args.num_layers), "--mlp-dim",
             str(args.mlp_dim), "--num-heads", str(args.num_heads)]
    os.makedirs(folder)
    logs = [open(os.path.join(folder, f"process{i}.log"), "w+") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", MODULE, "--worker", method, "--dir", folder,
                               "--coordinator", coordinator, "--process-id", str(i), *sizes],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=logs[i], text=True)
             for i in range(2)]
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        tails = []
        for log in logs:
            log.seek(0)
            tails.append(log.read()[-3000:])
        raise RuntimeError(f"the {method} job failed: exit statuses {[p.returncode for p in procs]}\n"
                           + "\n".join(tails))
    for log in logs:
        log.close()
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


TARGETS = {"orbax": 0.6, "gather": 1.0}  # docs/distributed.md: orbax at most, the gather at least
DEFAULT_OUT = os.path.join("benchmarks", "results", "save_memory")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-dim", type=int, default=768)
    parser.add_argument("--num-layers", type=int, default=6)
    parser.add_argument("--mlp-dim", type=int, default=3072)
    parser.add_argument("--num-heads", type=int, default=12)
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder for save_memory.json and save_memory.md "
                        "(default: %(default)s)")
    parser.add_argument("--worker", choices=("gather", "orbax", "export"), help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--suffix", default=".keras", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "export":
        return _export_worker(args)
    if args.worker:
        return _worker(args)
    from benchmarks.cpu import cpu_info

    start = time.time()
    cpu = cpu_info()
    results = {"command": " ".join([f"python -m {MODULE}", *(argv if argv is not None else sys.argv[1:])]),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu["model"],
               "cpu_cores": cpu["cores"], "cpu_key_flags": cpu["key_flags"], "cpu_flags": cpu["flags"],
               "load_before": os.getloadavg()[0],
               "config": {k: getattr(args, k) for k in ("hidden_dim", "num_layers", "mlp_dim", "num_heads")}}
    with tempfile.TemporaryDirectory() as tmp:
        for method in ("gather", "orbax"):
            results[method] = _run_job(args, method, os.path.join(tmp, method))
        for suffix in (".keras", ".safetensors"):
            out = subprocess.run([sys.executable, "-m", MODULE, "--worker", "export", "--dir",
                                  os.path.join(tmp, "orbax", "model"), "--suffix", suffix], cwd=ROOT,
                                 capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                                 check=True).stdout
            results["export" + suffix] = json.loads(out.strip().splitlines()[-1])
    results["load_after"], results["wall_s"] = os.getloadavg()[0], time.time() - start
    results["targets"] = targets(results)
    text = markdown(results)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "save_memory.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "save_memory.md"), "w") as f:
        f.write(text)


def targets(results):
    """[{"save", "goal", "measured", "met"}]: the largest orbax growth against at most 0.6x the
    whole state, and the smallest gather growth against at least 1x."""
    rows = []
    for method, goal in TARGETS.items():
        ratios = [row["growth"] / row["whole"] for row in results[method]]
        measured = max(ratios) if method == "orbax" else min(ratios)
        met = measured <= goal if method == "orbax" else measured >= goal
        rows.append(dict(save=method, goal=goal, measured=round(measured, 3), met=met))
    return rows


def markdown(results):
    """The record as the Markdown that docs/distributed.md quotes."""
    from benchmarks.cpu import KEY_FLAGS

    whole = results["orbax"][0]["whole"]
    flags = ", ".join(results["cpu_key_flags"]) or "none of " + ", ".join(KEY_FLAGS)
    lines = [f"Run: `{results['command']}`, {results['date']}, {results['wall_s'] / 60:.1f} min; CPU {results['cpu']} "
             f"({results['cpu_cores']} CPUs; flags {flags}; 1-min load average {results['load_before']:.1f} before, "
             f"{results['load_after']:.1f} after).", "",
             f"ViT {results['config']}: training state (weights + AdamW moments) {whole / MIB:.0f} MiB, held by "
             "2 JAX processes on 127.0.0.1 on a 1x2 mesh.", "",
             "| save | process | holds (MiB) | peak RSS growth (MiB) | growth / whole state |",
             "|---|---:|---:|---:|---:|"]
    for method in ("gather", "orbax"):
        for row in results[method]:
            lines.append(f"| {method} | {row['process']} | {row['local'] / MIB:.0f} | {row['growth'] / MIB:.0f} | "
                         f"{row['growth'] / row['whole']:.2f}x |")
    lines += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
    for t in results["targets"]:
        goal = f"<= {t['goal']}x" if t["save"] == "orbax" else f">= {t['goal']}x"
        lines.append(f"| {t['save']}: growth / whole state, every process | {t['measured']:.2f}x | {goal} | "
                     f"{'yes' if t['met'] else 'no'} |")
    lines.append("")
    for suffix in (".keras", ".safetensors"):
        export = results["export" + suffix]
        lines.append(f"- `training.export_checkpoint` to one {suffix} file (1 process): growth "
                     f"{export['growth'] / MIB:.0f} MiB = {export['growth'] / export['weights']:.2f}x the weights "
                     f"({export['weights'] / MIB:.0f} MiB)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

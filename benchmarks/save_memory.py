"""Peak memory growth of each process while a multi-process model-parallel run saves, per format.

    python -m benchmarks.save_memory [--hidden-dim 768 --num-layers 6 --mlp-dim 3072 --num-heads 12]

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

MIB = 2**20


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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("XLA_FLAGS", None)
    coordinator = f"127.0.0.1:{_free_port()}"
    sizes = ["--hidden-dim", str(args.hidden_dim), "--num-layers", str(args.num_layers), "--mlp-dim",
             str(args.mlp_dim), "--num-heads", str(args.num_heads)]
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.save_memory", "--worker", method, "--dir", folder,
                               "--coordinator", coordinator, "--process-id", str(i), *sizes],
                              cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for i in range(2)]
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"the {method} job failed: exit statuses {[p.returncode for p in procs]}")
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-dim", type=int, default=768)
    parser.add_argument("--num-layers", type=int, default=6)
    parser.add_argument("--mlp-dim", type=int, default=3072)
    parser.add_argument("--num-heads", type=int, default=12)
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--worker", choices=("gather", "orbax", "export"), help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--suffix", default=".keras", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "export":
        return _export_worker(args)
    if args.worker:
        return _worker(args)
    from benchmarks.cpu import cpu_info

    results = {"cpu": cpu_info()["model"], "config": {k: getattr(args, k) for k in
                                                       ("hidden_dim", "num_layers", "mlp_dim", "num_heads")}}
    with tempfile.TemporaryDirectory() as tmp:
        for method in ("gather", "orbax"):
            results[method] = _run_job(args, method, os.path.join(tmp, method))
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for suffix in (".keras", ".safetensors"):
            out = subprocess.run([sys.executable, "-m", "benchmarks.save_memory", "--worker", "export", "--dir",
                                  os.path.join(tmp, "orbax", "model"), "--suffix", suffix], cwd=root,
                                 capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                                 check=True).stdout
            results["export" + suffix] = json.loads(out.strip().splitlines()[-1])
    _print(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _print(results):
    whole = results["orbax"][0]["whole"]
    print(f"CPU: {results['cpu']}; ViT {results['config']}; training state (weights + AdamW moments) "
          f"{whole / MIB:.0f} MiB, 2 processes on a 1x2 mesh")
    print("| save | process | holds (MiB) | peak RSS growth (MiB) | growth / whole state |")
    print("|---|---:|---:|---:|---:|")
    for method in ("gather", "orbax"):
        for row in results[method]:
            print(f"| {method} | {row['process']} | {row['local'] / MIB:.0f} | {row['growth'] / MIB:.0f} | "
                  f"{row['growth'] / row['whole']:.2f}x |")
    for suffix in (".keras", ".safetensors"):
        export = results["export" + suffix]
        print(f"training.export_checkpoint to one {suffix} file (1 process): growth {export['growth'] / MIB:.0f} "
              f"MiB = {export['growth'] / export['weights']:.2f}x the weights ({export['weights'] / MIB:.0f} MiB)")


if __name__ == "__main__":
    main()

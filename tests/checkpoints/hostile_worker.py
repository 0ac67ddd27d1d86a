"""Loads checkpoint files under an address-space limit and reports what happened to each.

Usage: python -m tests.checkpoints.hostile_worker JOBS.json RESULTS.json (in the checkout's root)

JOBS.json: {"warmup": path, "images": path, "headroom_gib": n, "jobs": [{"case", "path",
"kwargs", "out"}]}. After importing the backend and loading `warmup` once (so that every code
path and the backend's thread pools exist), the worker caps its address space (RLIMIT_AS) at its
current size plus `headroom_gib`: a reader that allocated what a hostile file declares fails with
MemoryError instead of taking the machine. Each job then runs `keras_vit.load`; a
model that loads has its logits on `images` and its weights saved to `out`. RESULTS.json gets,
per case: "error" (exception type) and "message", or "dtype"; "seconds"; the resident memory
before it and its peak (VmHWM) in MiB.
"""

import json
import resource
import sys
import time

import numpy as np


def _status(key):
    """A size from /proc/self/status in bytes: VmSize (address space), VmRSS, VmHWM (peak RSS)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) * 1024


def _reset_peak():
    """Starts a new peak-RSS window. VmHWM, unlike ru_maxrss, belongs to this program alone:
    ru_maxrss starts at the parent's RSS at fork and survives exec, hiding a smaller peak."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _google_table(model):
    from keras_vit.checkpoints import google

    return google.rules("", False, False, model.num_prefix_tokens)


def google_tensors(model):
    """{vit_jax name: float32 array} of `model`'s weights, by keras_vit's table of the format."""
    from keras_vit.checkpoints import rules

    return rules.tensors(_google_table(model), model)


def assign_google(model, tensors):
    """Sets `model`'s weights from vit_jax-named `tensors`; returns `model`."""
    from keras_vit.checkpoints import rules
    from keras_vit.models.resize import variable_path

    shapes = {variable_path(v, model): tuple(v.shape) for v in model.weights}
    values = rules.to_model(rules.plan(_google_table(model), shapes), tensors)
    for v in model.weights:
        v.assign(values[variable_path(v, model)])
    return model


def _run(job, images):
    import keras

    import keras_vit

    _reset_peak()
    result = {"rss_before_mib": _status("VmRSS") / 2**20}
    start = time.perf_counter()
    try:
        model = keras_vit.load(job["path"], **job["kwargs"])
        logits = keras.ops.convert_to_numpy(model(images))
        weights = google_tensors(model)
        np.savez(job["out"], logits=np.asarray(logits, np.float32), **{"w/" + k: v for k, v in weights.items()})
        result["dtype"] = model.patch_embedding.conv.kernel.dtype
    except Exception as e:  # reported, not raised: the test asserts on the type and message
        result.update(error=type(e).__name__, message=str(e)[:2000])
    result.update(seconds=time.perf_counter() - start, peak_rss_mib=_status("VmHWM") / 2**20)
    return result


def main(jobs_path, results_path):
    with open(jobs_path) as f:
        spec = json.load(f)
    import keras_vit

    images = np.load(spec["images"])
    keras_vit.load(spec["warmup"])(images)
    limit = _status("VmSize") + int(spec["headroom_gib"] * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    results = {"limit_gib": limit / (1 << 30), "cases": {}}
    for job in spec["jobs"]:
        results["cases"][job["case"]] = _run(job, images)
    with open(results_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])

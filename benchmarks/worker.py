"""A benchmark worker: one process, one Keras backend, driven line by line over a pipe.

Requests (one JSON object per line on stdin) and replies (one per line on the protocol pipe):
  {"cmd": "setup", "key": k, "spec": {...}, "warmup": n} -> {"ok", "setup_s", "rss_mb", "peak_rss_mb"}
  {"cmd": "time", "key": k}                               -> {"ok", "s"}: one timed step
  {"cmd": "drop", "key": k}                               -> {"ok"}
  {"cmd": "quit"}
Anything the libraries print goes to stderr, never into the protocol.

    KERAS_BACKEND=jax python -m benchmarks.worker --device cpu
"""

import argparse
import gc
import json
import os
import sys
import threading
import time
import traceback

import psutil
from commands import cli


class PeakRss:
    """Samples this process's RSS every 10 ms, since ru_maxrss only ever grows across cases."""

    def __init__(self):
        self.proc, self.peak = psutil.Process(), 0
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self):
        while True:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    def reset(self):
        self.peak = self.proc.memory_info().rss


def handle(req, steps, rss, device):
    from benchmarks import impls

    cmd, key = req["cmd"], req.get("key")
    if cmd == "setup":
        gc.collect()
        rss.reset()
        before = rss.proc.memory_info().rss
        start = time.perf_counter()
        step, items, info = impls.build(req["spec"], device)
        for _ in range(req.get("warmup", 1) if step else 0):
            step()
        steps[key] = (step, items)
        return dict(setup_s=time.perf_counter() - start, items=items, info=info, rss_mb=before / 2**20,
                    peak_rss_mb=rss.peak / 2**20)
    if cmd == "time":
        step = steps[key][0]
        start = time.perf_counter()
        step()
        return dict(s=time.perf_counter() - start, peak_rss_mb=rss.peak / 2**20)
    if cmd == "drop":
        steps.pop(key, None)
        gc.collect()
        return {}
    raise ValueError(f"unknown command {cmd!r}; use setup, time, drop or quit")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=cli.HelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"], help="where this worker computes")
    args = parser.parse_args(argv)
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # library output (C and Python) goes to stderr
    sys.stdout = sys.stderr
    steps, rss = {}, PeakRss()
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            break
        try:
            reply = dict(ok=True, **handle(req, steps, rss, args.device))
        except Exception as err:  # report it to the driver, which marks the candidate failed
            traceback.print_exc()
            reply = dict(ok=False, error=f"{type(err).__name__}: {err}"[:500])
        proto.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()

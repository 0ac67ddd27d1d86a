"""Times keras_vit against timm and keras-hub and writes the results table and plot.

    python -m benchmarks.run            # full: every case, 7 repetitions; writes results/full.*
    python -m benchmarks.run --quick    # fewer cases and repetitions (< 10 min on 2 cores)

One worker process per backend; each case's candidates are warmed up, then timed one repetition
at a time in turn (A B C C B A ...). Reported: the median, ratios measured in the same run, the
achieved GFLOP/s and its share of the matmul peak measured by the same run.
"""

import argparse
import json
import os
import platform
import select
import shlex
import subprocess
import sys
import time

import psutil

from benchmarks import cases, report
from benchmarks.cpu import cpu_info
from commands import cli, malloc

BACKENDS = ("tensorflow", "jax", "torch")
HERE = os.path.dirname(os.path.abspath(__file__))


class Worker:
    """A `benchmarks.worker` process for one backend, named as `cases.worker_name` names it, with
    the library settings of keras_vit's own processes (`commands.cli.library_defaults`); requests
    wait at most `timeout` seconds."""

    def __init__(self, name, device, log_dir, allocator="auto"):
        backend = name.split("-")[0]
        env = dict(cli.library_defaults(malloc.environ(allocator)), KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
        if name.endswith("-no-onednn"):
            env["TF_ENABLE_ONEDNN_OPTS"] = "0"
        self.backend, self.log = name, open(os.path.join(log_dir, f"worker-{name}.log"), "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", "--device", device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            cwd=os.path.dirname(HERE), env=env,
        )

    def alive(self):
        return self.proc.poll() is None

    def ask(self, timeout, **req):
        if not self.alive():
            return dict(ok=False, error=f"{self.backend} worker exited ({self.proc.returncode}); see {self.log.name}")
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it died since the last reply and has not been reaped yet
            return dict(ok=False, error=f"{self.backend} worker died; see {self.log.name}")
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:  # a hung compile: this worker is lost, its later candidates fail
            self.proc.kill()
            return dict(ok=False, error=f"no reply within {timeout} s")
        line = self.proc.stdout.readline()
        return json.loads(line) if line else dict(ok=False, error=f"worker died; see {self.log.name}")

    def close(self):
        """Asks the worker to quit; one still busy after 30 s (a candidate's step still running) is killed,
        so that the run's results are written all the same."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"cmd": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def machine_load():
    """The 1-minute load average and the other processes using the CPU now (not this benchmark)."""
    mine = {os.getpid()} | {c.pid for c in psutil.Process().children(recursive=True)}
    procs = [p for p in psutil.process_iter(["pid", "cmdline"]) if p.pid not in mine]
    for p in procs:
        try:
            p.cpu_percent()
        except psutil.Error:
            pass
    time.sleep(0.5)
    busy = []
    for p in procs:
        try:
            cpu = p.cpu_percent()
        except psutil.Error:
            continue
        if cpu > 20:
            # One line; each argument's folders dropped, so that the record names no machine's paths.
            cmd = " ".join(os.path.basename(a.rstrip("/")) if os.path.isabs(a) else a
                           for a in " ".join(p.info["cmdline"] or []).split())
            busy.append(dict(cpu_percent=cpu, cmd=cmd[:70]))
    return dict(loadavg_1m=os.getloadavg()[0], busy_processes=sorted(busy, key=lambda b: -b["cpu_percent"]))


def run_case(case, workers, reps, warmup, timeout):
    """Sets up every candidate, then times them alternately; returns the case's result dict."""
    cands = [dict(spec=s, label=cases.label(s), flops=cases.step_flops(s), times=[]) for s in case["candidates"]]
    load_before = machine_load()
    for i, c in enumerate(cands):
        w = workers[cases.worker_name(c["spec"])]
        reply = w.ask(timeout, cmd="setup", key=str(i), spec=c["spec"], warmup=warmup)
        c.update(setup=reply)
        print(f"  setup {c['label']}: {'%.1f s' % reply['setup_s'] if reply['ok'] else reply['error']}", flush=True)
    live = [c for c in cands if c["setup"]["ok"]]
    n = {"latency": reps * 5, "check": 0}.get(case["kind"], reps)
    for rep in range(n):
        # A B C, then C B A, ...: a load change hits every candidate alike, and a steady drift in
        # load over one pass favours no position.
        for c in live if rep % 2 == 0 else live[::-1]:
            reply = workers[cases.worker_name(c["spec"])].ask(timeout, cmd="time", key=str(cands.index(c)))
            if reply["ok"]:
                c["times"].append(reply["s"])
                c["peak_rss_mb"] = reply["peak_rss_mb"]
            else:
                c["error"] = reply["error"]
    for i, c in enumerate(cands):
        workers[cases.worker_name(c["spec"])].ask(timeout, cmd="drop", key=str(i))
        c.setdefault("peak_rss_mb", c["setup"].get("peak_rss_mb"))
    return dict(name=case["name"], kind=case["kind"], candidates=cands, load_before=load_before,
                load_after=machine_load())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=cli.HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer cases and repetitions (< 10 min)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"],
                        help="where the workers compute (auto: a GPU when one is visible)")
    parser.add_argument("--reps", type=int, help="timed repetitions per candidate (default: 3 with --quick, else 7)")
    parser.add_argument("--only", help="run only the cases whose name contains this text, and the matmul peaks "
                        "of their dtypes (default: all)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile candidates (slow setup)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"),
                        help="folder for the JSON record and the tables")
    parser.add_argument("--page", help="also rewrite this docs page's results block, e.g. docs/performance.md "
                        "(default: none)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated backends to run; the others' candidates are left out (a GPU "
                        "image without TensorFlow: --backends jax,torch)")
    malloc.add_argument(parser, "every worker's")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"--backends {args.backends!r}: give some of {', '.join(BACKENDS)}, comma-separated")
    if args.page and (args.quick or args.only):
        parser.error("--page rewrites the docs' table of the full run; run it without --quick and --only")
    device = args.device if args.device != "auto" else ("gpu" if _has_gpu() else "cpu")
    reps, warmup = args.reps or (3 if args.quick else 7), (1 if args.quick else 2)
    todo = selected(cases.cases(full=not args.quick), args.only)
    for c in todo:
        c["candidates"] = [s for s in c["candidates"] if s["backend"] in backends
                           and not (args.no_compile and s.get("compile"))]
    todo = [c for c in todo if c["candidates"]]
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    start = time.time()
    allocator = malloc.resolve(args.malloc)[0]  # the same for every worker, so ratios compare like with like
    logs = os.path.join(args.out, "logs")
    names = list(dict.fromkeys(cases.worker_name(s) for c in todo for s in c["candidates"]))
    for name in names:  # each worker appends to its log: a restarted one keeps what its predecessor wrote
        open(os.path.join(logs, f"worker-{name}.log"), "w").close()
    workers = {name: Worker(name, device, logs, args.malloc) for name in names}
    results = []
    try:
        for case in todo:
            for b, w in workers.items():  # a worker that died (a crash in a runtime) loses only its case
                if not w.alive():
                    w.close()
                    workers[b] = Worker(b, device, logs, args.malloc)
            print(f"{case['name']}", flush=True)
            results.append(run_case(case, workers, reps, warmup, timeout=900 if device == "cpu" else 300))
    finally:
        for w in workers.values():
            w.close()
    cpu = cpu_info()
    meta = dict(mode="quick" if args.quick else "full", device=device, reps=reps, warmup=warmup,
                wall_s=time.time() - start, cpu=cpu["model"] or platform.machine(),
                cpu_flags=cpu["key_flags"], lscpu_flags=" ".join(cpu["flags"]),
                cores=os.cpu_count(), malloc=allocator,
                library_env=cli.library_defaults({k: os.environ[k] for k in cli.LIBRARY_ENV if k in os.environ}),
                date=time.strftime("%Y-%m-%d %H:%M"),
                command=command(sys.argv[1:] if argv is None else argv))
    summary = report.write(results, meta, args.out)
    print(summary)
    if args.page:
        record_path = os.path.join(args.out, meta["mode"] + ".json")
        with open(record_path) as f:
            report.update_page(args.page, json.load(f), record_path)


def selected(all_cases, only):
    """The cases whose name contains `only` (all when it is empty), and the matmul peak of each
    dtype that they use, so that every run reports its share of the peak measured in the same run.
    The bf16 peak is left out of a run with no bf16 case: on a CPU without native bf16 (AVX2 only)
    torch's 2048^2 bf16 product takes minutes a call."""
    chosen = [c for c in all_cases if c["kind"] != "peak" and (not only or only in c["name"])]
    bf16 = any("bf16" in c["name"] for c in chosen)
    return [c for c in all_cases if c in chosen or (c["kind"] == "peak" and (bf16 or "bf16" not in c["name"]))]


def command(argv):
    """The command line as `python -m benchmarks.run ...`, with paths relative to the current folder,
    so that a recorded run names no machine's folders."""
    args = [_relative(a) for a in argv]
    return shlex.join(["python", "-m", "benchmarks.run", *args])


def _relative(arg):
    """An absolute path as a path relative to the current folder; one outside it as its last part."""
    if not os.path.isabs(arg):
        return arg
    rel = os.path.relpath(arg)
    return os.path.basename(arg) if rel.startswith("..") else rel


def _has_gpu():
    """Whether torch sees a CUDA device (the workers then use it; TF and JAX pick it by themselves)."""
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    main()

"""The studies' timing loop: callables timed one call at a time, in turn, the order reversed every
round (A B C, C B A, A B C, ...), and the median of each one's calls.

In turn, so that a change in the machine's load hits every callable alike; reversed, so that a
steady drift in load over a round favours no position; the median, so that a few calls slowed by
another process do not move the figure. `benchmarks.run` times its candidates the same way, one
request at a time to its worker processes.
"""

import statistics
import time


def samples(fns, repeats, warmup=1):
    """{name: [seconds of each timed call]} of the callables `fns`, {name: () -> anything}.

    Each callable is first called `warmup` times, untimed (compilation, caches, first-touch
    allocations), then all are called `repeats` times each, in turn. A call's time is its wall time
    until it returns, so a callable whose work runs asynchronously must wait for its result
    (`block_until_ready`, `convert_to_numpy`). With one callable this is a plain loop of `repeats` calls.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    order = list(fns)
    for rep in range(repeats):
        for name in order if rep % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


def alternate(fns, repeats, warmup=1):
    """{name: median seconds per call}: `samples(fns, repeats, warmup)`, each list's median."""
    return {name: statistics.median(t) for name, t in samples(fns, repeats, warmup).items()}

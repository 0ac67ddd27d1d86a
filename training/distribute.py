"""Distribution of a training run over devices and processes.

The training CLI calls only this interface:

    distribute.add_arguments(parser)       # --distribution and its options
    dist = distribute.from_args(args)
    with dist.scope():                     # build and compile the model here
        ...
    train_ds = dist.shard(train_ds)        # per-process input sharding (identity on one process)
    if dist.is_chief: ...                  # only one process writes checkpoints and reports

Only "none" exists so far; the distributed-training work adds the other modes behind it.
"""

import contextlib
import dataclasses

MODES = ("none",)


def add_arguments(parser):
    parser.add_argument("--distribution", default="none", choices=MODES, help="how to spread training")


@dataclasses.dataclass(frozen=True)
class Distribution:
    mode: str = "none"
    num_replicas: int = 1
    is_chief: bool = True

    def scope(self):
        return contextlib.nullcontext()

    def shard(self, dataset):
        return dataset


def from_args(args):
    mode = getattr(args, "distribution", "none")
    if mode not in MODES:
        raise ValueError(f"--distribution={mode!r} is not available; use one of {MODES}")
    return Distribution(mode=mode)

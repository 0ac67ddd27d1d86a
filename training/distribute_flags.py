"""The flags of `training.distribute`, in a module without Keras, so that `--help` and flag errors
come before any deep-learning library loads (`training.preflight`)."""

MODES = ("none", "mirrored", "tpu", "data_parallel", "model_parallel")


def add_arguments(parser):
    """Adds `--distribution` and the options of its modes to an argparse parser."""
    group = parser.add_argument_group("distribution")
    group.add_argument("--distribution", default="none", choices=MODES, help="how to spread training")
    group.add_argument("--devices", default=None,
                       help="mirrored: comma-separated devices, e.g. GPU:0,GPU:1 (default: all visible)")
    group.add_argument("--tpu", default=None,
                       help='tpu: TPU name or address ("local" on a TPU VM; default: from the environment)')
    group.add_argument("--mesh", default=None, help="model_parallel: BATCHxMODEL, e.g. 2x4 (default 1xN)")
    group.add_argument("--coordinator", default=None,
                       help="multi-host JAX: HOST:PORT of process 0 (default: single process)")
    group.add_argument("--num-processes", type=int, default=None,
                       help="multi-host JAX: process count (default: single process)")
    group.add_argument("--process-id", type=int, default=None,
                       help="multi-host JAX: this process, 0..N-1 (default: single process)")


from training.checkpoint_formats import FORMATS  # noqa: E402  (keras-free)

CHECKPOINT_FORMATS = tuple(FORMATS)


def add_checkpoint_format(parser):
    """Adds `--checkpoint-format` (`training.checkpointing`) to an argparse parser."""
    parser.add_argument("--checkpoint-format", default=None, choices=CHECKPOINT_FORMATS,
                        help="how the run's checkpoints are written: 'keras' (model.keras and backup/, gathered into "
                        "one process) or 'orbax' (model/ and backup/ written as shards by every process, in the "
                        "background) (default: a resumed run's own; for a new run orbax for multi-process JAX runs, "
                        "keras otherwise)")

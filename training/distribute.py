"""Distribution of a training run over devices and processes, on the engines Keras already has.

The training CLI calls only this interface:

    distribute.add_arguments(parser)       # --distribution and its options
    dist = distribute.from_args(args)      # call first: multi-host JAX must start before any op
    with dist.scope():                     # build and compile the model here
        ...
    train_ds = dist.shard(train_ds)        # per-process input sharding (identity on one process)
    if dist.is_chief: ...                  # only one process reports
    dist.save(model, path)                 # on every process; only the chief's file is kept

Modes:
    none            one device.
    mirrored        TensorFlow `MirroredStrategy`: all local GPUs, or `--devices GPU:0,GPU:1`;
                    `--devices CPU:0,CPU:1` splits the CPU into logical devices (for tests).
    tpu             TensorFlow `TPUStrategy` on `--tpu NAME` ("local" on a Cloud TPU VM).
    data_parallel   JAX `keras.distribution.DataParallel` over every device of every process.
    model_parallel  JAX `keras.distribution.ModelParallel` on a `--mesh BATCHxMODEL` mesh with
                    `keras_vit.distribution.RULES` (Megatron-style sharding of every block).
    Multi-host JAX adds `--coordinator HOST:PORT --num-processes N --process-id I` to either JAX
    mode. Multi-worker TensorFlow is not offered: Keras 3's trainer fails on
    `MultiWorkerMirroredStrategy` (https://github.com/keras-team/keras/issues/20585).

Semantics: `--batch-size` is the global batch, split evenly over replicas and processes, and
the learning rate is stated for that global batch (it is not rescaled here). Every mode
computes the mean loss over the global batch, so a step equals the one-device step.

Keras, TensorFlow and keras_vit are imported by the functions that use them: the CLI adds these
flags (`add_arguments`, `add_checkpoint_format`) and answers `--help` before any of them loads.
"""

import contextlib
import dataclasses
import hashlib
import os
import re
import tempfile
from typing import Any

from training.checkpoint_formats import FORMATS

MODES = ("none", "mirrored", "tpu", "data_parallel", "model_parallel")
CHECKPOINT_FORMATS = tuple(FORMATS)
BACKENDS = {"mirrored": "tensorflow", "tpu": "tensorflow", "data_parallel": "jax", "model_parallel": "jax"}
MULTI_WORKER_TF = "https://github.com/keras-team/keras/issues/20585"


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


def add_checkpoint_format(parser):
    """Adds `--checkpoint-format` (`training.checkpoint_formats`) to an argparse parser."""
    parser.add_argument("--checkpoint-format", default=None, choices=CHECKPOINT_FORMATS,
                        help="how the run's checkpoints are written: 'keras' (model.keras and backup/, gathered into "
                        "one process) or 'orbax' (model/ and backup/ written as shards by every process, in the "
                        "background) (default: a resumed run's own; for a new run orbax for multi-process JAX runs, "
                        "keras otherwise)")


@dataclasses.dataclass(frozen=True)
class Distribution:
    """A chosen distribution. `engine` is the `tf.distribute.Strategy` or
    `keras.distribution.Distribution` behind it (None for "none")."""

    mode: str = "none"
    num_replicas: int = 1
    is_chief: bool = True
    process_id: int = 0
    num_processes: int = 1
    engine: Any = None

    @contextlib.contextmanager
    def scope(self):
        """Build and compile the model inside this scope (variables are placed at creation)."""
        if self.engine is None:
            yield
            return
        with self.engine.scope():
            yield
        from keras_vit.distribution import ModelParallel

        if isinstance(self.engine, ModelParallel):
            self.engine.check_all_rules_matched()

    def shard(self, dataset):
        """This process' part of a `tf.data.Dataset` of global batches.

        Checks that the global batch divides evenly over replicas and processes. With several
        processes each keeps every N-th slice of each global batch; Keras then assembles the
        processes' slices into one global array (auto-sharding is turned off so that it is not
        done twice)."""
        batch = _static_batch_size(dataset)
        if batch is not None and batch % self.num_replicas:
            raise ValueError(
                f"the global batch size {batch} does not divide over {self.num_replicas} replicas; "
                f"use a multiple of {self.num_replicas}"
            )
        if self.num_processes == 1:
            return dataset
        if batch is None:
            raise ValueError("multi-process input sharding needs batches of static size; "
                             "batch with drop_remainder=True")
        # The global batch splits into one slice per batch row of the mesh (`num_replicas`), and
        # the processes, whose devices Keras lists process by process, cover those rows in order.
        # More rows than processes: process i gets the i-th of N equal slices. More processes than
        # rows (the model axis spans processes): the processes sharing a row all get its slice,
        # since JAX assembles the global batch from their identical copies.
        if self.num_replicas % self.num_processes == 0:
            slices, index = self.num_processes, self.process_id
        elif self.num_processes % self.num_replicas == 0:
            slices, index = self.num_replicas, self.process_id // (self.num_processes // self.num_replicas)
        else:
            raise ValueError(
                f"{self.num_processes} processes cannot share a mesh with {self.num_replicas} batch rows; "
                f"use a batch axis that divides or is a multiple of the process count"
            )
        # (global,) -> (slices, global / slices): this process keeps slice `index` of every batch.
        return dataset.rebatch(batch // slices).shard(slices, index)

    def checkpoint_dir(self, out_dir):
        """Where this process writes its checkpoints and reports of the run in `out_dir`: `out_dir`
        on the chief; on the other processes a folder outside it that stays the same when the
        command is run again, so that their backups resume too. Saving is a collective under
        multi-process JAX (see `save`), so every process writes, and only the chief's copy counts."""
        if self.is_chief:
            return out_dir
        key = hashlib.sha1(os.path.abspath(out_dir).encode()).hexdigest()[:12]
        return os.path.join(tempfile.gettempdir(), f"keras_vit_{key}_process{self.process_id}")

    def checkpoint_path(self, path):
        """`path` on the chief, the same name in `checkpoint_dir` on the others: give it to
        checkpointing callbacks (ModelCheckpoint, BackupAndRestore) created on every process."""
        if self.is_chief:
            return path
        return os.path.join(self.checkpoint_dir(os.path.dirname(os.path.abspath(path))), os.path.basename(path))

    def save(self, model, path):
        """Writes `model` (`.keras`) or its weights (`.weights.h5`) to `path`; call it on every
        process. Only the chief's file is kept.

        Keras' saving creates a variable (a fresh optimizer's step counter), and under a
        multi-process JAX distribution creating a variable is a collective: a chief-only
        `model.save` would wait forever for the other processes. So the others write too, to a
        temporary file that is then removed (TensorFlow's multi-worker recipe does the same).
        The file holds plain arrays and loads on any topology: one device or a mesh. Variables
        sharded over several processes (multi-process `model_parallel`) are gathered whole first
        by `keras_vit.ViT.save` (see `keras_vit.distribution.host_copy`)."""
        target = self.checkpoint_path(path)
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        if str(path).endswith(".weights.h5"):
            model.save_weights(target)
        else:
            model.save(target)
        if not self.is_chief:
            os.remove(target)


def from_args(args):
    """The `Distribution` that the parsed arguments ask for; ValueError on a bad combination."""
    import keras

    from keras_vit import distribution as vit_distribution

    mode = getattr(args, "distribution", "none") or "none"
    if mode not in MODES:
        raise ValueError(f"--distribution={mode!r} is not available; use one of {MODES}")
    _check_backend(mode, args)
    if mode == "none":
        return Distribution()
    if mode == "mirrored":
        return _mirrored(getattr(args, "devices", None))
    if mode == "tpu":
        return _tpu(getattr(args, "tpu", None))
    process_id, num_processes = _initialize_jax_processes(args)
    if mode == "data_parallel":
        engine = keras.distribution.DataParallel(auto_shard_dataset=False)
        replicas = len(keras.distribution.list_devices())
    else:
        mesh = _mesh(getattr(args, "mesh", None))
        engine = vit_distribution.ModelParallel(mesh)
        replicas = mesh.shape[0]
    # Global as well as scoped: Keras' JAX trainer places each input batch with the
    # distribution that is current when fit() runs, which may be outside `scope()`.
    keras.distribution.set_distribution(engine)
    return Distribution(mode, replicas, process_id == 0, process_id, num_processes, engine)


def _check_backend(mode, args):
    import keras

    backend = keras.backend.backend()
    needed = BACKENDS.get(mode)
    if needed and backend != needed:
        raise ValueError(f"--distribution={mode} runs on KERAS_BACKEND={needed}; this process uses {backend}")
    multi = any(getattr(args, a, None) is not None for a in ("coordinator", "num_processes", "process_id"))
    if multi and mode not in ("data_parallel", "model_parallel"):
        raise ValueError(
            f"--coordinator/--num-processes/--process-id need --distribution data_parallel or "
            f"model_parallel (JAX); got --distribution={mode}. Multi-worker TensorFlow is not "
            f"supported by Keras 3's trainer ({MULTI_WORKER_TF}); use the JAX backend for multi-host"
        )


def _mirrored(devices):
    import tensorflow as tf

    names = _parse_devices(devices)
    _ensure_logical_cpus(tf, names)
    strategy = tf.distribute.MirroredStrategy(devices=names or None)
    return Distribution("mirrored", strategy.num_replicas_in_sync, engine=strategy)


def _parse_devices(devices):
    if not devices:
        return []
    names = []
    for name in devices.split(","):
        match = re.fullmatch(r"/?(cpu|gpu):(\d+)", name.strip(), re.IGNORECASE)
        if match is None:
            raise ValueError(f"--devices entry {name!r} is not allowed; use GPU:i or CPU:i, e.g. GPU:0,GPU:1")
        names.append(f"/{match.group(1).lower()}:{int(match.group(2))}")
    return names


def _ensure_logical_cpus(tf, names):
    """Splits the one physical CPU into as many logical devices as `names` asks for."""
    count = 1 + max([int(n.split(":")[1]) for n in names if n.startswith("/cpu")], default=0)
    if count == 1:
        return
    try:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        raise ValueError(
            f"--devices={','.join(names)} needs {count} logical CPU devices, but TensorFlow was "
            "already initialized; choose the distribution before running any TensorFlow op"
        ) from None


def _tpu(name):
    import tensorflow as tf

    if not name:
        raise ValueError('--distribution tpu needs --tpu NAME (the TPU name, or "local" on a Cloud TPU VM)')
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    except (ValueError, OSError, RuntimeError, tf.errors.OpError) as error:
        # TF's own message is several screens of op names; keep the first line, drop its traceback.
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"--tpu={name!r}: no TPU could be reached ({type(error).__name__}: {first}). Run on a "
            'Cloud TPU VM with --tpu local, or give the name of a TPU in this project and zone'
        ) from None
    return Distribution("tpu", strategy.num_replicas_in_sync, engine=strategy)


def _initialize_jax_processes(args):
    """Joins the multi-host JAX cluster when --coordinator is given. Returns (process_id, count)."""
    coordinator = getattr(args, "coordinator", None)
    count, index = getattr(args, "num_processes", None), getattr(args, "process_id", None)
    if coordinator is None and count is None and index is None:
        return 0, 1
    if coordinator is None or count is None or index is None:
        raise ValueError("multi-host JAX needs all of --coordinator HOST:PORT, --num-processes N, --process-id I")
    if not re.fullmatch(r"[\w.\-]+:\d+", coordinator):
        raise ValueError(f"--coordinator={coordinator!r} is not allowed; use HOST:PORT, e.g. 10.0.0.1:1234")
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"--process-id={index} with --num-processes={count}; use 0 <= I < N")
    if index == 0:
        _check_port_free(coordinator)
    import keras

    keras.distribution.initialize(job_addresses=coordinator, num_processes=count, process_id=index)
    return index, count


def _check_port_free(coordinator):
    """Raises ConnectionError when the coordinator's port is taken on this host. Process 0 serves the
    coordinator on every interface of its host at that port; where the port is taken, JAX's gRPC
    server logs "Failed to add port to server" and the process dies with a segmentation fault."""
    import socket

    port = int(coordinator.rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as e:
            raise ConnectionError(f"--coordinator={coordinator}: port {port} is already in use on this host, where "
                                  f"process 0 serves the coordinator ({e.strerror}); choose a free port for every "
                                  "process") from None


def _mesh(spec):
    import keras

    from keras_vit.distribution import MODEL_AXIS

    match = re.fullmatch(r"(\d+)x(\d+)", (spec or "1x0").strip())
    if match is None:
        raise ValueError(f"--mesh={spec!r} is not allowed; use BATCHxMODEL, e.g. 2x4")
    devices = keras.distribution.list_devices()
    # No --mesh: one batch row, every device on the model axis.
    shape = (int(match.group(1)), int(match.group(2)) or len(devices))
    if shape[0] * shape[1] != len(devices):
        raise ValueError(f"--mesh={shape[0]}x{shape[1]} needs {shape[0] * shape[1]} devices; there are {len(devices)}")
    return keras.distribution.DeviceMesh(shape, ("batch", MODEL_AXIS), devices)


def _static_batch_size(dataset):
    specs = getattr(dataset, "element_spec", None)
    if specs is None:
        return None
    import tensorflow as tf

    first = tf.nest.flatten(specs)[0]
    return first.shape[0] if first.shape.rank else None

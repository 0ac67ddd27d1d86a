"""A few AdamW steps of a tiny ViT under one `training.distribute` mode, for the equivalence tests.

Run as a subprocess with its own environment (backend, forced device count), e.g.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax \
        python -m tests.training.distribute_worker --distribution data_parallel --out run.npz

The initial weights and the data come from NumPy with fixed seeds, so every topology starts from
the same point and sees the same global batches. The chief writes the per-step losses, every
weight, and the sharding of each weight to `--out` (.npz), and `--checkpoint` if given.
"""

import argparse
import json
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import distribution  # noqa: E402
from training import distribute  # noqa: E402

# The house tiny config, with 4 heads so that a model axis of 4 divides heads and MLP width.
CONFIG = dict(image_size=32, patch_size=4, hidden_dim=48, num_layers=2, num_heads=4, mlp_dim=96, num_classes=5)


def initial_weights(model, seed=0):
    """Same starting point on every topology: N(0, 0.05), plus 1 for LayerNorm scales."""
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 0.05, v.shape).astype("float32") + v.path.endswith("gamma") for v in model.weights]


def dataset(steps, batch_size, seed=1):
    """`steps` global batches of (images (B, 32, 32, 3), labels (B,))."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * batch_size, 32, 32, 3)).astype("float32")
    y = rng.integers(0, CONFIG["num_classes"], size=(steps * batch_size,)).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size, drop_remainder=True)


def optimizer(name):
    """SGD with momentum by default: Adam divides by sqrt(v), so on the few near-zero gradient
    entries it turns float32 reduction-order noise (~1e-7) into weight differences of ~1e-5
    after three steps, on any two topologies, which would hide the comparison's real signal."""
    if name == "adamw":
        return keras.optimizers.AdamW(learning_rate=1e-3, weight_decay=0.05)
    return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, weight_decay=1e-4)


class StepLosses(keras.callbacks.Callback):
    """Per-step losses, recovered from Keras' running mean over the epoch."""

    def on_train_begin(self, logs=None):
        self.means = []

    def on_train_batch_end(self, batch, logs=None):
        self.means.append(float(logs["loss"]))

    def losses(self):
        k = np.arange(1, len(self.means) + 1)
        totals = np.asarray(self.means, "float64") * k  # sum of the first k step losses
        return np.diff(totals, prepend=0.0)


def train(args, dist):
    keras.utils.set_random_seed(0)
    with dist.scope():
        model = keras_vit.ViT(**CONFIG)
        start = initial_weights(model)
        model.set_weights(start)
        model.compile(
            optimizer=optimizer(args.optimizer),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    losses = StepLosses()
    model.fit(dist.shard(dataset(args.steps, args.batch_size)), epochs=1, verbose=0, callbacks=[losses])
    moved = max(float(np.abs(distribution.host_value(v) - w).max()) for v, w in zip(model.weights, start))
    return model, losses.losses(), moved


def sharding_specs(model):
    """Path -> (PartitionSpec as text, per-device shard shape) of each model and optimizer
    variable; (None, None) where the backend has no sharding (TensorFlow)."""
    specs = {}
    for v in model.weights + model.optimizer.variables:
        sharding = getattr(v.value, "sharding", None)
        spec = getattr(sharding, "spec", None)
        specs[v.path] = (None, None) if spec is None else (str(spec), sharding.shard_shape(tuple(v.shape)))
    return specs


def main():
    parser = argparse.ArgumentParser()
    distribute.add_arguments(parser)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", default=None, help="also save the weights here (.weights.h5)")
    args = parser.parse_args()
    dist = distribute.from_args(args)
    model, losses, moved = train(args, dist)
    weights = {v.path: distribution.host_value(v) for v in model.weights}
    if args.checkpoint:
        dist.save(model, args.checkpoint)
    if dist.is_chief:
        info = dict(moved=moved, num_replicas=dist.num_replicas, num_processes=dist.num_processes,
                    sharding=sharding_specs(model))
        np.savez(args.out, losses=losses, info=json.dumps(info), **{f"w:{k}": v for k, v in weights.items()})


if __name__ == "__main__":
    main()

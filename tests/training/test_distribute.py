"""Fast checks of `keras_vit.layout_map` and `training.distribute` that need no extra devices.

The meshes here name 8 devices that need not exist: a `LayoutMap` only reads the mesh's axes.
The equivalence runs on real (forced or logical) devices are in test_distribute_equivalence.py.
"""

import argparse

import keras
import numpy as np
import pytest
import tensorflow as tf
from tests.conftest import tiny_vit, to_numpy

import keras_vit
from training import distribute


def fake_mesh(shape=(2, 4), axes=("batch", "model")):
    return keras.distribution.DeviceMesh(shape, axes, devices=[f"cpu:{i}" for i in range(8)])


EXPECTED = {  # variable name suffix -> layout axes (Megatron style)
    "attn/query/kernel": (None, "model", None),
    "attn/key/bias": ("model", None),
    "attn/value/kernel": (None, "model", None),
    "attn/attention_output/kernel": ("model", None, None),
    "attn/attention_output/bias": None,
    "fc1/kernel": (None, "model"),
    "fc1/bias": ("model",),
    "fc2/kernel": ("model", None),
    "fc2/bias": None,
    "norm1/gamma": None,
    "patch_embedding/conv/kernel": None,
    "position_embedding/embedding": None,
    "class_token/token": None,
    "head/classifier/kernel": None,
}


def test_layout_map_shards_attention_over_heads_and_mlp_megatron_style():
    model = tiny_vit(num_heads=4)
    layouts = keras_vit.layout_map(model, fake_mesh())
    seen = set()
    for v in model.weights:
        for suffix, axes in EXPECTED.items():
            if v.path.endswith(suffix):
                layout = layouts[v.path]
                assert (None if layout is None else layout.axes) == axes, v.path
                seen.add(suffix)
    assert seen == set(EXPECTED)


def test_layout_map_rejects_heads_or_mlp_width_not_dividing_the_model_axis():
    with pytest.raises(ValueError, match=r"num_heads=3 .*'model' mesh axis of size 4"):
        keras_vit.layout_map(tiny_vit(num_heads=3), fake_mesh())
    with pytest.raises(ValueError, match=r"mlp_dim=90 .*size 4"):
        keras_vit.layout_map(tiny_vit(num_heads=4, mlp_dim=90), fake_mesh())


def test_layout_map_refuses_rules_that_match_nothing():
    # A model without ViT blocks: every rule would silently replicate, so it must raise.
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    with pytest.raises(ValueError, match="match no variable"):
        keras_vit.layout_map(model, fake_mesh())


def test_layout_map_needs_a_model_axis():
    with pytest.raises(ValueError, match="axis named 'model'"):
        keras_vit.layout_map(tiny_vit(num_heads=4), fake_mesh(axes=("batch", "tensor")))


def parse(*argv):
    parser = argparse.ArgumentParser()
    distribute.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_none_is_one_chief_replica():
    dist = distribute.from_args(parse())
    assert (dist.mode, dist.num_replicas, dist.is_chief, dist.num_processes) == ("none", 1, True, 1)
    with dist.scope():
        pass


def test_tpu_needs_a_name():
    expected = "--tpu NAME" if keras.backend.backend() == "tensorflow" else "runs on KERAS_BACKEND=tensorflow"
    with pytest.raises(ValueError, match=expected):
        distribute.from_args(parse("--distribution", "tpu"))


def test_multi_host_outside_jax_points_to_the_keras_issue():
    with pytest.raises(ValueError, match="keras/issues/20585"):
        distribute.from_args(parse("--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "0"))


def test_wrong_backend_is_named():
    other = "jax" if keras.backend.backend() != "jax" else "tensorflow"
    mode = "data_parallel" if other == "jax" else "mirrored"
    with pytest.raises(ValueError, match=f"runs on KERAS_BACKEND={other}"):
        distribute.from_args(parse("--distribution", mode))


@pytest.mark.parametrize("devices", ["gpu0", "TPU:0", "CPU:x"])
def test_bad_device_names_are_refused(devices):
    with pytest.raises(ValueError, match="GPU:i or CPU:i"):
        distribute._parse_devices(devices)


def test_bad_mesh_spec_is_refused():
    with pytest.raises(ValueError, match="BATCHxMODEL"):
        distribute._mesh("2by4")


def batches(n=3, batch=8):
    x = np.arange(n * batch, dtype="float32")
    return tf.data.Dataset.from_tensor_slices((x, x)).batch(batch, drop_remainder=True)


def test_shard_gives_each_process_its_slice_of_every_global_batch():
    parts = [
        [x.numpy().tolist() for x, _ in distribute.Distribution("data_parallel", 2, i == 0, i, 2).shard(batches())]
        for i in range(2)
    ]
    assert parts[0] == [[0, 1, 2, 3], [8, 9, 10, 11], [16, 17, 18, 19]]
    assert parts[1] == [[4, 5, 6, 7], [12, 13, 14, 15], [20, 21, 22, 23]]


def test_shard_gives_processes_sharing_a_batch_row_the_same_slice():
    # A (2, 2) mesh over 4 processes: the model axis spans processes 0-1 and 2-3.
    parts = [
        [x.numpy().tolist() for x, _ in distribute.Distribution("model_parallel", 2, i == 0, i, 4).shard(batches())]
        for i in range(4)
    ]
    assert parts[0] == parts[1] == [[0, 1, 2, 3], [8, 9, 10, 11], [16, 17, 18, 19]]
    assert parts[2] == parts[3] == [[4, 5, 6, 7], [12, 13, 14, 15], [20, 21, 22, 23]]
    # One batch row: every process gets the whole global batch.
    assert [x.numpy().tolist()
            for x, _ in distribute.Distribution("model_parallel", 1, False, 1, 2).shard(batches())][0] == list(range(8))
    with pytest.raises(ValueError, match="3 processes cannot share a mesh with 2 batch rows"):
        distribute.Distribution("model_parallel", 2, True, 0, 3).shard(batches())


def test_host_copy_rebuilds_the_model_with_its_weights_and_optimizer_state(tmp_path):
    # The path multi-host model_parallel saving takes (gathering is tested with 2 processes in
    # test_distribute_equivalence.py): a fresh model from the config, compiled the same way,
    # holding equal weights and optimizer moments, and saved by Keras.
    from keras_vit import distribution

    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32,
                          num_classes=3)
    model.compile(optimizer=keras.optimizers.AdamW(1e-2), loss="sparse_categorical_crossentropy")
    x, y = np.random.default_rng(0).normal(size=(4, 16, 16, 3)).astype("float32"), np.array([0, 1, 2, 0])
    model.fit(x, y, epochs=1, verbose=0)
    assert not distribution.spans_processes(model)
    copy = distribution.host_copy(model)
    assert copy is not model and type(copy) is keras_vit.ViT and copy.get_config() == model.get_config()
    for a, b in zip(model.variables + model.optimizer.variables, copy.variables + copy.optimizer.variables):
        assert a.path == b.path
        np.testing.assert_array_equal(to_numpy(a.value), to_numpy(b.value))
    assert int(to_numpy(copy.optimizer.iterations.value)) == 1
    copy.save(tmp_path / "copy.keras")
    restored = keras.saving.load_model(tmp_path / "copy.keras", safe_mode=True)
    np.testing.assert_allclose(to_numpy(restored.predict(x, verbose=0)), to_numpy(model.predict(x, verbose=0)),
                               atol=1e-6)


def test_shard_is_identity_on_one_process_and_checks_the_global_batch():
    ds = batches()
    assert distribute.Distribution("mirrored", 2).shard(ds) is ds
    with pytest.raises(ValueError, match="global batch size 8 does not divide over 3 replicas"):
        distribute.Distribution("mirrored", 3).shard(ds)


@pytest.mark.parametrize("pooling", ["token", "gap"])
def test_memory_table_counts_the_parameters_keras_builds(pooling):
    from training import memory

    config = dict(patch_size=4, hidden_dim=48, num_layers=2, num_heads=4, mlp_dim=96, pooling=pooling)
    model = tiny_vit(num_classes=1000, **config)
    assert sum(memory.parameter_counts(config, image_size=32)) == model.count_params()


def test_memory_per_device_shrinks_with_the_model_axis_and_checks_divisibility():
    from training import memory

    config = memory.vit_22b_sized()
    one, sixteen = (memory.per_device_gib(memory.Row("g", config, 224, (1, m), 4)) for m in (1, 16))
    sharded, replicated = memory.parameter_counts(config)
    assert sixteen["weights"] == pytest.approx((sharded / 16 + replicated) * 4 / memory.GIB)
    assert one["adamw"] == pytest.approx(2 * one["weights"]) and sixteen["activations"] < one["activations"]
    with pytest.raises(ValueError, match="num_heads=48 is not divisible by the model axis 32"):
        memory.per_device_gib(memory.Row("g", config, 224, (1, 32), 4))


def test_layout_map_covers_the_vit_22b_style_block_without_qkv_biases():
    model = tiny_vit(num_heads=4, qk_norm=True, parallel_block=True, use_bias=False, pooling="gap")
    layouts = keras_vit.layout_map(model, fake_mesh())
    assert layouts["vit/encoder/block_0/attn/key/kernel"].axes == (None, "model", None)
    assert layouts["vit/encoder/block_0/attn/q_norm/gamma"] is None


@pytest.mark.one_backend
def test_a_taken_coordinator_port_is_one_line_and_no_crash(tmp_path):
    """JAX's coordinator server dies with a segmentation fault on a taken port; the CLI says so first."""
    import os
    import socket
    import subprocess
    import sys

    from tests import ROOT

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "training.train", "--recipe", "shapes", "--dataset", "shapes:64", "--epochs", "1",
               "--out", str(tmp_path / "run"), "--distribution", "data_parallel", "--coordinator",
               f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "0"]
        run = subprocess.run(cmd, env={**os.environ, "KERAS_BACKEND": "jax"}, cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == (
        f"python -m training.train: error: --coordinator=127.0.0.1:{port}: port {port} is already in use on this "
        "host, where process 0 serves the coordinator (Address already in use); choose a free port for every process")
    assert not (tmp_path / "run").exists()

"""Training on patch sequences (`--naflex`): the tf.data pipeline's batches, the CLI's refusals, and
`python -m training.train --naflex` on a folder of mixed-shape photos (trains, resumes, exports) and
on tfds, on JAX (with data_parallel), TensorFlow and PyTorch."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests import ROOT
from training import recipes, train
from training.datasets import folder

SHAPES = [(40, 40), (24, 72), (72, 24), (30, 60), (60, 30), (36, 48)]


def mixed_folder(root, per_class=20):
    """3 classes of `per_class` PNGs of six shapes, 1:3 to 3:1: dark, mid-grey and bright noise."""
    rng = np.random.default_rng(1)
    for c, name in enumerate(("dark", "grey", "bright")):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(rng.normal(40 + 90 * c, 25, (*SHAPES[i % len(SHAPES)], 3)), 0, 255).astype("uint8")
            Image.fromarray(pixels).save(root / name / f"{i:02d}.png")
    folder._SCANNED.clear()
    return root


@pytest.mark.one_backend
def test_training_batches_have_one_shape_per_budget_and_about_constant_tokens(tmp_path, monkeypatch):
    from training.datasets import load
    from training.datasets import naflex as naflex_data

    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "cache"))
    ds, info = load(str(mixed_folder(tmp_path / "photos")), "all")
    recipe = recipes.get("shapes", naflex=True, seq_lens="8,16")
    sizes = naflex_data.batch_sizes((8, 16), 8 * 16)
    assert sizes == {8: 16, 16: 8}
    batches = naflex_data.pipeline(ds, info, 4, (0.5,) * 3, (0.5,) * 3, 16, 8, True, (8, 16), recipe, seed=0)
    seen = []
    for epoch in range(2):
        for x, y in batches:
            b, length, width = x["patches"].shape
            assert sizes[length] == b and width == 48 and y.shape == (b, 3)
            valid = x["patch_valid"].numpy()
            assert valid.any(axis=1).all() and valid.sum() > 0.6 * 128  # padding stays a minority
            seen.append((epoch, length))
    assert {length for _, length in seen} == {8, 16}  # both budgets, and only their two shapes
    assert len({x for x in seen if x[0] == 0}) == 2 and len(seen) >= 6
    evaluation = naflex_data.pipeline(ds, info, 4, (0.5,) * 3, (0.5,) * 3, 16, 8, False)
    assert {tuple(x["patches"].shape[1:]) for x, _ in evaluation} == {(16, 48)}
    assert sum(len(y) for _, y in evaluation) == 60  # every image once, at max_seq_len


def test_naflex_options_that_cannot_work_are_one_line_errors(tmp_path, capsys):
    base = ["--recipe", "shapes", "--dataset", "shapes:64", "--out", str(tmp_path / "run")]
    for extra, message in [
        (["--naflex", "--mixup", "0.2"], "--mixup 0.2 work on batches of one image size"),
        (["--naflex", "--seq-lens", "8,x"], "seq_lens='8,x' is not allowed"),
        (["--naflex", "--max-seq-len", "0"], "max_seq_len=0 is smaller than one patch"),
        (["--max-seq-len", "16"], "max_seq_len and seq_lens are the token budgets of patch sequences; add --naflex"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            train.main(base + extra)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def naflex_run(out, data, backend, *args, devices=None):
    cmd = [sys.executable, "-m", "training.train", "--recipe", "shapes", "--dataset", str(data), "--naflex",
           "--image-size", "16", "--seq-lens", "8,16", "--batch-size", "8", "--hidden-dim", "48", "--num-heads", "3",
           "--mlp-dim", "96", "--out", str(out), "--verbose", "2", *args]
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3",
           "KERAS_VIT_CACHE": str(out.parent / "cache")}
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    run = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    return run


@pytest.mark.slow
def test_a_naflex_folder_run_trains_resumes_and_exports(tmp_path):
    """On JAX with data_parallel over 2 devices: one epoch, then a rerun with two resumes at the
    second; the model serves patch sequences of its budget, its timm file is NaFlexVit's, and it
    exports to one ONNX artifact that gives its probabilities on a wide and a tall photo."""
    import keras
    import safetensors.numpy

    import keras_vit
    from keras_vit import naflex

    photos, out = mixed_folder(tmp_path / "photos"), tmp_path / "run"
    split = ["--val-split", "validation", "--test-split", "validation", "--distribution", "data_parallel"]
    first = naflex_run(out, photos, "jax", "--epochs", "1", *split, devices=2)
    assert "test accuracy" in first.stdout
    again = naflex_run(out, photos, "jax", "--epochs", "2", *split, devices=2)
    assert "Epoch 2/2" in again.stdout and "Epoch 1/2" not in again.stdout  # resumed at the second epoch
    rows = (out / "log.csv").read_text().splitlines()
    assert len(rows) == 3 and float(rows[2].split(",")[rows[0].split(",").index("loss")]) > 0
    with open(out / "metrics.json") as f:
        metrics = json.load(f)
    assert metrics["test_examples"] == 6 and metrics["test_accuracy"] > 0.34
    model = keras.saving.load_model(out / "model.keras", safe_mode=True)
    assert model.max_seq_len == 16 and model.patch_size == 4
    photo = np.asarray(Image.open(photos / "bright" / "01.png"))  # 24 x 72: a 2 x 6 grid under 16 tokens
    batch = naflex.patch_sequences([photo], 4, 16, model.image_mean, model.image_std)
    assert batch["patch_valid"].sum() == 12 and np.isfinite(keras.ops.convert_to_numpy(model(batch))).all()
    keras_vit.save_checkpoint(model, tmp_path / "model.safetensors")
    names = safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))
    assert "embeds.proj.weight" in names and "embeds.pos_embed" in names
    # The run's model exported as docs/export.md does it (ONNX, on TensorFlow): one artifact gives
    # the model's probabilities on a wide and a tall photo.
    photos_wide_tall = [photos / "bright" / "01.png", photos / "grey" / "02.png"]  # 24 x 72 and 72 x 24
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("XLA_FLAGS", None)
    export = subprocess.run([sys.executable, "-c", EXPORT, str(out / "model.keras"), str(tmp_path / "vit.onnx"),
                             *map(str, photos_wide_tall)], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert export.returncode == 0, export.stderr[-3000:]
    result = json.loads(export.stdout.splitlines()[-1])
    assert result["grids"] == [[2, 6], [6, 2]] and result["max_difference"] < 1e-4, result


# What a user runs after training (docs/export.md), in a TensorFlow process: argv is the run's
# model.keras, the artifact's path and photos; prints the photos' grids and the largest difference
# between the artifact's probabilities and the Keras model's.
EXPORT = """
import json, sys
import keras, numpy as np
from PIL import Image
import keras_vit
from keras_vit import naflex, serving

model_path, artifact, *photos = sys.argv[1:]
model = keras_vit.load(model_path)
keras_vit.export(model, artifact, format="onnx")
images = [np.asarray(Image.open(p).convert("RGB")) for p in photos]
raw = naflex.patch_sequences(images, model.patch_size, model.max_seq_len, normalize=False)
probs = serving.load(artifact, "onnx")(raw)
inputs = naflex.patch_sequences(images, model.patch_size, model.max_seq_len, model.image_mean, model.image_std)
expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(inputs)))
grids = [[int(v) for v in c[m].max(0) + 1] for c, m in zip(raw["patch_coord"], raw["patch_valid"])]
print(json.dumps({"grids": grids, "max_difference": float(np.abs(probs - expected).max())}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend, data", [
    ("tensorflow", "fashion_mnist"),
    # On torch the tool imports triton before TensorFlow (commands.cli.import_tensorflow): the other
    # order segfaults with TensorFlow 2.21 and triton 3.8.
    ("torch", "photos"),
])
def test_a_naflex_run_trains_on_tensorflow_and_torch(tmp_path, backend, data):
    """TensorFlow on a tfds dataset (Fashion-MNIST, 28 x 28), torch on the folder of mixed shapes."""
    source = mixed_folder(tmp_path / "photos") if data == "photos" else data
    split = (["--val-split", "none", "--test-split", "validation"] if data == "photos"
             else ["--train-split", "train[:512]", "--test-split", "test[:128]", "--image-size", "28",
                   "--max-seq-len", "49", "--seq-lens", "25,49"])
    run = naflex_run(tmp_path / "run", source, backend, "--epochs", "2", *split)
    rows = (tmp_path / "run" / "log.csv").read_text().splitlines()
    loss = rows[0].split(",").index("loss")
    assert len(rows) == 3 and float(rows[2].split(",")[loss]) < float(rows[1].split(",")[loss]), rows
    assert "test accuracy" in run.stdout

"""`python -m apps.demo` before any model loads: the checks of --checkpoint, --labels and --examples,
answered before a deep-learning library is imported, and the choice of example images."""

import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from PIL import Image

from apps.sources import check_source
from apps.sources import (ASSETS, MAX_EXAMPLES, PER_CLASS, check_folder, fashion_mnist_examples, find_examples,
                           read_folder)
from training import examples
from tests import ROOT

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once

FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def demo_cli(*args, tmp_path):
    """Runs `python -m apps.demo ARGS` as a user would; returns (exit code, stderr, the deep-learning
    libraries it had loaded when it exited, as tests/fixtures/hide_modules logs them)."""
    log = tmp_path / "loaded.txt"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "fixtures" / "hide_modules"), str(ROOT)]),
           "KERAS_VIT_IMPORT_LOG": str(log)}
    out = subprocess.run([sys.executable, "-m", "apps.demo", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=env)
    loaded = log.read_text() if log.exists() else "not logged"
    return out.returncode, out.stderr + out.stdout, loaded.split(",") if loaded else []


def images(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        Image.new("RGB", (8, 8), (200, 10, 10)).save(folder / name)
    return folder


def test_help_and_bad_paths_are_answered_before_any_library_loads(tmp_path):
    # No Keras, JAX, TensorFlow or torch loads first, so each answer takes a Python start (about 0.3 s).
    code, text, loaded = demo_cli("--help", tmp_path=tmp_path)
    assert code == 0 and "--examples" in text and loaded == [], (text, loaded)
    garbage = tmp_path / "model.keras"
    garbage.write_bytes(b"not a zip")
    cases = [
        (["--checkpoint", str(tmp_path / "nope.keras")], "nope.keras': no such file or folder"),
        (["--checkpoint", "hf://"], "the repo must be 'org/name'"),
        # A file of a repo: the advice is a URL, which --checkpoint takes, and filename= only as Python's way.
        (["--checkpoint", "hf://org/name/model.npz"], "give the file's URL, https://huggingface.co/ORG/NAME/resolve/"
                                                      "main/FILE (in Python, load_checkpoint("),
        (["--checkpoint", "gs://bucket"], "is not gs://bucket/path/to/object"),
        (["--checkpoint", str(garbage)], "is not a .keras file: a .keras or .npz file is a zip archive"),
        (["--checkpoint", "ViT-B_16.imagenet21k+imagenet201"],
         "catalog names like it: ['ViT-B_16.imagenet21k+imagenet2012'"),
        (["--labels", str(tmp_path / "labels.txt")], "--labels"),
        (["--examples", str(tmp_path / "photos")], "--examples"),
    ]
    for args, message in cases:
        code, text, loaded = demo_cli(*args, tmp_path=tmp_path)
        assert code == 2 and message in text and text.count("\n") == 1, (args, text)
        assert text.startswith("python -m apps.demo: error: ") and loaded == [], (text, loaded)


def test_a_taken_port_is_one_line_naming_the_port_before_any_library_loads(tmp_path):
    import socket

    with socket.socket() as holder:  # another demo listening on the port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, text, loaded = demo_cli("--port", str(port), tmp_path=tmp_path)
    assert code == 2 and text.count("\n") == 1 and loaded == [], (text, loaded)
    assert text.startswith(f"python -m apps.demo: error: --port {port}: 127.0.0.1:{port} cannot be listened on")
    assert f"pass another --port, such as --port {port + 1}" in text and "GRADIO" not in text, text
    code, text, loaded = demo_cli("--port", "70000", tmp_path=tmp_path)
    assert code == 2 and "--port 70000 is not a port; use 1-65535" in text and loaded == [], text


def test_the_checks_import_no_deep_learning_library(tmp_path):
    script = (
        "import sys\nfrom apps import demo\n"
        f"try:\n    demo.main(['--checkpoint', {str(tmp_path / 'x.keras')!r}])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('keras', 'jax', 'tensorflow', 'torch', 'gradio', 'keras_vit') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_check_source_accepts_what_the_loader_reads(tmp_path):
    check_source("hf://google/vit-base-patch16-224")
    check_source("vit_base_patch16_224.augreg2_in21k_ft_in1k")  # a catalog name
    check_source(tmp_path)  # a folder (Hugging Face)
    with zipfile.ZipFile(tmp_path / "m.keras", "w") as z:
        z.writestr("config.json", "{}")
    check_source(tmp_path / "m.keras")
    (tmp_path / "model.weights.h5").write_bytes(b"x")  # a keras-hub preset's weights, beside its config.json
    check_source(tmp_path / "model.weights.h5")
    (tmp_path / "m.png").write_bytes(b"x")
    with pytest.raises(ValueError, match="m.png': cannot load it; use a .keras file, an official .npz, a timm "
                       ".safetensors, a keras-hub preset folder or a Hugging Face folder$"):
        check_source(tmp_path / "m.png")


def test_the_demo_serves_a_keras_hub_preset_by_its_weights_file(tmp_path):
    import keras_vit
    from tests.conftest import random_vit

    model = random_vit()
    keras_vit.save_checkpoint(model, tmp_path / "preset", format="keras_hub")
    loaded = keras_vit.load(tmp_path / "preset" / "model.weights.h5")
    x = np.random.default_rng(0).uniform(size=(1, *model.image_size, 3)).astype("float32")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-5)


def test_examples_follow_the_checkpoint(tmp_path):
    other = [f"class {c}" for c in "ABC"]
    assert find_examples("model.keras", other) is None  # no Fashion-MNIST images for other classes
    fashion = find_examples("model.keras", FASHION)
    assert fashion.paths == fashion_mnist_examples() and len(fashion.paths) == 22 and "Fashion-MNIST" in fashion.source
    run = tmp_path / "run"
    (run / "model.keras").parent.mkdir()
    (run / "model.keras").write_bytes(b"")
    images(run / "examples" / "cat", ["0.png", "1.png"])
    images(run / "examples" / "rocket", ["0.png"])
    beside = find_examples(run / "model.keras", other)
    assert [p.relative_to(run).as_posix() for p in beside.paths] == [
        "examples/cat/0.png", "examples/rocket/0.png", "examples/cat/1.png"]  # classes interleaved
    assert find_examples(run / "model.keras", FASHION).paths == beside.paths  # the checkpoint's own come first
    (images(tmp_path / "photos", ["b.jpg", "a.png"]) / "notes.txt").write_text("not an image")
    chosen = find_examples(run / "model.keras", other, tmp_path / "photos")
    assert [p.name for p in chosen.paths] == ["a.png", "b.jpg"] and chosen.source == "the folder photos"


def test_example_folders_are_capped_and_checked(tmp_path):
    images(tmp_path / "many", [f"{i:03d}.png" for i in range(MAX_EXAMPLES + 5)])
    assert len(read_folder(tmp_path / "many")) == MAX_EXAMPLES
    images(tmp_path / "classes" / "a", [f"{i}.png" for i in range(PER_CLASS + 3)])
    assert len(read_folder(tmp_path / "classes")) == PER_CLASS
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_folder(tmp_path / "missing")
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds no images"):
        check_folder(tmp_path / "empty")
    assert ASSETS.is_dir()


def test_the_examples_a_training_run_keeps_are_offered(tmp_path):
    """training.examples writes <out>/examples/<class>/<n>.png; the demo serving <out>/model.keras offers them."""
    names = ["T-shirt/top", "Trouser", "Pullover"]
    picked = {0: [np.full((28, 28, 1), 10, "uint8")] * 2, 1: [np.full((28, 28, 1), 200, "uint8")], 2: []}
    assert examples.save(picked, names, str(tmp_path / "examples")) == 3
    (tmp_path / "model.keras").write_bytes(b"")
    found = find_examples(tmp_path / "model.keras", names)
    assert [p.relative_to(tmp_path).as_posix() for p in found.paths] == [
        "examples/T-shirt_top/0.png", "examples/Trouser/0.png", "examples/T-shirt_top/1.png"]

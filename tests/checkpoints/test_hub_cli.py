"""The demo, the training CLI and the evaluation CLI take handles: each runs as its own process
against the stand-in Hub on 127.0.0.1 (see hub_standin)."""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import os
import subprocess
import sys
import time

import httpx
import pytest
from gradio_client import Client, handle_file
from tests import ROOT
from tests.checkpoints.hub_standin import StandIn
from tests.app.test_app_helpers import free_port
from transformers import ViTConfig, ViTForImageClassification

REPO = "test/shapes-vit"


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """A transformers ViT for the `shapes` data (1 channel, 32 px, 4 classes), served as a Hub repo."""
    folder = tmp_path_factory.mktemp("repo")
    config = ViTConfig(image_size=32, patch_size=4, num_channels=1, hidden_size=48, num_hidden_layers=2,
                       num_attention_heads=3, intermediate_size=96, num_labels=4)
    ViTForImageClassification(config).save_pretrained(str(folder), safe_serialization=True)
    with StandIn() as s:
        s.repos[REPO] = {p.name: p.read_bytes() for p in folder.iterdir()}
        yield s


def _env(standin, tmp_path):
    return {**os.environ, "HF_ENDPOINT": standin.url, "HF_HOME": str(tmp_path / "hf"), "KERAS_BACKEND": "jax",
            "TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.mark.slow
def test_training_and_evaluation_clis_take_a_handle(standin, tmp_path):
    env = _env(standin, tmp_path)
    train = [sys.executable, "-m", "training.train", "--recipe", "shapes", "--weights", f"hf://{REPO}",
             "--epochs", "1", "--steps-per-epoch", "5", "--dataset", "shapes:200", "--image-size", "32",
             "--out", str(tmp_path / "run"), "--verbose", "2"]
    subprocess.run(train, env=env, cwd=ROOT, check=True, timeout=600)
    assert (tmp_path / "run" / "model.keras").stat().st_size > 0
    evaluate = [sys.executable, "-m", "training.evaluate", f"hf://{REPO}", "--dataset", "shapes:200"]
    out = subprocess.run(evaluate, env=env, cwd=ROOT, check=True, timeout=600, capture_output=True, text=True)
    assert "top-1" in out.stdout
    assert standin.gets("model.safetensors") == 1  # the evaluation read the training run's cached copy


@pytest.mark.slow
def test_demo_serves_a_handle(standin, tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "apps.demo", "--checkpoint", f"hf://{REPO}", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=_env(standin, tmp_path), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        image = ROOT / "apps" / "assets"
        example = sorted(image.glob("*.png"))[0]
        client = Client(url, verbose=False)
        top = client.predict(handle_file(str(example)), api_name="/predict")[0]  # the API's defaults
        assert len(top["confidences"]) == 4  # the served model's four classes
    finally:
        proc.terminate()
        proc.wait(timeout=30)

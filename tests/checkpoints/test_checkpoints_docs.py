"""The fine-tuning example of docs/checkpoints.md runs as written.

The checkpoint it names is replaced by a stand-in with the same file name and layout: a random
2-layer ViT-Ti/16 timm state dict (no network here). The block runs in a fresh interpreter on the
current backend, in a folder that holds only that file.
"""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import os
import re
import subprocess
import sys

import pytest
import safetensors.numpy
from tests import ROOT
from tests.checkpoints.checkpoint_oracles import timm_state, timm_vit



def docs_example():
    """The python block of docs/checkpoints.md that calls keras_vit.load and fit."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "checkpoints.md").read_text(), flags=re.S)
    return next(b for b in blocks if "keras_vit.load(" in b and ".fit(" in b)


@pytest.mark.slow  # a fresh interpreter and a fit at 160 x 224: ~20-40 s
def test_docs_fine_tuning_example_runs(tmp_path):
    code = docs_example()
    name = re.search(r'"([\w.]+\.safetensors)"', code).group(1)
    stand_in = timm_vit(img_size=224, patch_size=16, embed_dim=192, depth=2, num_heads=3, mlp_ratio=4.0,
                        num_classes=1000)
    safetensors.numpy.save_file(timm_state(stand_in), str(tmp_path / name))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [float(v) for v in re.search(r"loss per epoch: \[(.*)\]", result.stdout).group(1).split(",")]
    assert len(losses) == 2 and all(loss == loss and loss > 0 for loss in losses)  # finite, positive

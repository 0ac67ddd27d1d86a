"""`.keras` files saved by an earlier layout of the layers still load and give the same outputs.

The files in tests/model/fixtures were saved with keras_vit at commit bb52701 (Keras 3.15.1), before the
transformer block took one config and the parallel block became a class of its own:
- `pre_refactor_plain.keras`: a plain ViT (32 px, patch 4, 2 blocks, width 48, 10 classes);
- `pre_refactor_variant.keras`: the same with the ViT-22B switches (parallel block, QK-norm, no
  biases), LayerScale, two register tokens and MAP pooling;
- `pre_refactor_user.keras`: a functional model that embeds a `TransformerBlock` (parallel, with
  LayerScale) and an `Encoder` (QK-norm) given as flat arguments, as a user's model would.
Every weight was set to random values before saving, so a weight that loads into the wrong place
changes the output. `pre_refactor_outputs.npz` holds the inputs and the outputs computed then.
They must not be regenerated: they stand for files that users already have.

The `pre_merge_*` files were saved at commit 2596341 (Keras 3.15.1), while the parallel block was the
class `ParallelTransformerBlock` (registered name `keras_vit>ParallelTransformerBlock`) and
`ClassifierHead` took the MAP head's and `fc_norm`'s options as flat arguments (`num_heads`,
`mlp_dim`, `layer_norm_epsilon`, `gelu_approximate`, `norm_bias`):
- `pre_merge_variant.keras`: a ViT with the parallel block, QK-norm, no biases, LayerScale, two
  register tokens and MAP pooling;
- `pre_merge_gap.keras`: a ViT with the parallel block, average pooling, `fc_norm` and a
  representation layer;
- `pre_merge_user.keras`: a functional model that embeds a `ParallelTransformerBlock` and two
  `ClassifierHead`s (MAP without norm biases and with tanh GELU; `fc_norm` with epsilon 1e-5).
`pre_merge_outputs.npz` holds their inputs and outputs, with every weight random as above.
"""

from pathlib import Path

import keras
import numpy as np
import pytest

import keras_vit  # noqa: F401  (registers the classes)

FIXTURES = Path(__file__).parent / "fixtures"


SAVED = [("pre_refactor", "plain"), ("pre_refactor", "variant"), ("pre_refactor", "user"), ("pre_merge", "variant"),
         ("pre_merge", "gap"), ("pre_merge", "user")]


@pytest.mark.parametrize("layout, name", SAVED, ids=[f"{layout}_{name}" for layout, name in SAVED])
def test_file_saved_by_an_earlier_layout_loads_with_the_same_outputs(layout, name):
    saved = np.load(FIXTURES / f"{layout}_outputs.npz", allow_pickle=False)
    model = keras.saving.load_model(FIXTURES / f"{layout}_{name}.keras", safe_mode=True)
    x = saved["tokens"] if name == "user" else saved["images"]
    out = keras.ops.convert_to_numpy(model(x, training=False))
    assert np.abs(saved[name]).max() > 0.1  # the saved outputs are not trivially small
    np.testing.assert_allclose(out, saved[name], rtol=1e-5, atol=1e-5)

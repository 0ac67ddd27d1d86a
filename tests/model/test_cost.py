"""Multiply-adds and parameter counts (keras_vit/cost.py)."""

import pytest
from tests.conftest import tiny_vit

import keras_vit


@pytest.mark.parametrize(
    "patch,tokens,attention,linear",
    [(8, 785, 0.947, 5.556), (16, 197, 0.060, 1.394), (32, 50, 0.004, 0.354)],
)
def test_block_macs_reproduce_the_seed_table(patch, tokens, attention, linear):
    """Seed 000, "Patch size as a cost dial": 224 px, D = 768, GMAC per block to 3 decimals."""
    cost = keras_vit.model_macs(dict(keras_vit.preset_config(f"ViT-B/{patch}"), image_size=224))
    assert cost["tokens"] == tokens
    assert round(cost["block"]["attention"] / 1e9, 3) == attention
    assert round(cost["block"]["linear"] / 1e9, 3) == linear


def test_vit_s16_costs_4_60_gmac():
    cost = keras_vit.model_macs(dict(keras_vit.preset_config("ViT-S/16"), image_size=224, num_classes=1000))
    assert round(cost["total"] / 1e9, 2) == 4.60


def test_model_macs_accepts_a_model():
    model = tiny_vit()
    cost = keras_vit.model_macs(model)
    assert cost["tokens"] == 65
    assert cost["total"] == cost["patch_embedding"] + cost["blocks"] + cost["head"]
    assert cost["patch_embedding"] == 64 * 4 * 4 * 3 * 48

"""big_vision `.npz` -> keras_vit parity: MAP heads, every pool_type, rep_size, sin-cos models,
looped and scan-stacked blocks, and the prefixes params/, opt/target/ and params/img/ (the image
tower of a SigLIP two-tower checkpoint).

The files are written from random timm models by the test-side writers (checkpoint_oracles, and
the MAP-head writer below); timm's own npz reader (`_load_weights`, which reads MAP heads and all
three prefixes) checks that they are faithful. The sin-cos oracle is NumPy code written from
big_vision's `posemb_sincos_2d` formula. big_vision's GELU is the tanh form.
"""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import numpy as np
import pytest
import torch
from tests.checkpoints.checkpoint_oracles import (
    assert_parity, big_vision_npz, relative_error, save_npz, tanh_gelu, timm_state, timm_vit, torch_logits,
)
from tests.conftest import images, tiny_vit, to_numpy
from timm.models.vision_transformer import _load_weights

import keras_vit
from keras_vit.io import npz

# (scan-stacked blocks, prefix): each layout and each prefix at least once.
LAYOUTS = [(False, "params/"), (True, "params/"), (False, "opt/target/"), (True, "params/img/")]
LAYOUT_IDS = ["loop_params", "scan_params", "loop_opt_target", "scan_params_img"]
# big_vision pool_type -> (timm arguments of the reference, keras_vit override).
POOL_TYPES = {
    "tok": (dict(no_embed_class=True), {}),
    "gap": (dict(class_token=False, global_pool="avg", fc_norm=False), {}),
    "map": (dict(class_token=False, global_pool="map"), {}),
    "0": (dict(class_token=False, global_pool=""), dict(pooling="token")),
    "none": (dict(class_token=False, global_pool=""), dict(pooling="none")),
}


def sincos_oracle(h, w, width, temperature=10_000.0):
    """big_vision's posemb_sincos_2d, (h * w, width), computed in float32 as there: for the patch
    at (y, x) in raster order, [sin(x w_k), cos(x w_k), sin(y w_k), cos(y w_k)] with
    w_k = 1 / temperature ** (k / (width / 4 - 1)), k < width / 4."""
    y, x = np.mgrid[:h, :w].astype("float32")
    omega = 1.0 / temperature ** (np.arange(width // 4, dtype="float32") / np.float32(width // 4 - 1))
    y, x = np.outer(y.ravel(), omega), np.outer(x.ravel(), omega)  # (h * w, width / 4)
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype("float32")


def map_head_tensors(model):
    """timm's attn_pool as big_vision's MAPHead_0 (probe, attention (D, K, Dh) / (K, Dh, D),
    LayerNorm_0, MlpBlock_0)."""
    sd, d, k = timm_state(model), model.embed_dim, model.attn_pool.num_heads
    p, mha = "attn_pool.", "MAPHead_0/MultiHeadDotProductAttention_0/"
    kw, vw = np.split(sd[p + "kv.weight"], 2)  # rows [k; v]
    kb, vb = np.split(sd[p + "kv.bias"], 2)
    out = {"MAPHead_0/probe": sd[p + "latent"]}
    for n, w, b in (("query", sd[p + "q.weight"], sd[p + "q.bias"]), ("key", kw, kb), ("value", vw, vb)):
        out[f"{mha}{n}/kernel"], out[f"{mha}{n}/bias"] = w.T.reshape(d, k, d // k), b.reshape(k, d // k)
    out[mha + "out/kernel"], out[mha + "out/bias"] = sd[p + "proj.weight"].T.reshape(k, d // k, d), sd[p + "proj.bias"]
    out["MAPHead_0/LayerNorm_0/scale"], out["MAPHead_0/LayerNorm_0/bias"] = sd[p + "norm.weight"], sd[p + "norm.bias"]
    for j in range(2):
        out[f"MAPHead_0/MlpBlock_0/Dense_{j}/kernel"] = sd[f"{p}mlp.fc{j + 1}.weight"].T
        out[f"MAPHead_0/MlpBlock_0/Dense_{j}/bias"] = sd[f"{p}mlp.fc{j + 1}.bias"]
    return out


def bv_tensors(model, scan=False, prefix="params/", sincos=False):
    """A timm model's tensors in big_vision's layout under `prefix`; no position table if `sincos`."""
    out = {k[len("params/"):]: v for k, v in big_vision_npz(model, scan).items()}
    if model.attn_pool is not None:
        out.update(map_head_tensors(model))
    if sincos:
        out.pop("pos_embedding")
    return {prefix + k: v for k, v in out.items()}


def reference(pool_type="map", seed=0, **kwargs):
    return timm_vit(seed=seed, act_layer=tanh_gelu, **POOL_TYPES[pool_type][0], **kwargs)


def two_tower_file(path, ref):
    """A SigLIP-like two-tower file: the image tower under params/img/ next to a text tower and the
    temperature and bias, which the loader must ignore."""
    rng = np.random.default_rng(3)
    tensors = bv_tensors(ref, prefix="params/img/")
    tensors.update({"params/txt/Embed_0/embedding": rng.normal(size=(1000, 48)).astype("float32"),
                    "params/txt/head/kernel": rng.normal(size=(48, 48)).astype("float32"),
                    "params/t": np.ones(1, "float32"), "params/b": -np.ones(1, "float32")})
    return save_npz(path, tensors)


@pytest.mark.parametrize("scan,prefix", LAYOUTS, ids=LAYOUT_IDS)
def test_map_writer_is_faithful_to_timm_loader(tmp_path, scan, prefix):
    ref = reference()
    path = save_npz(tmp_path / "w.npz", bv_tensors(ref, scan, prefix))
    other = reference(seed=1)
    with torch.no_grad():
        _load_weights(other, str(path))
    x = images()
    assert relative_error(torch_logits(other, x), torch_logits(ref, x)) < 1e-6


@pytest.mark.parametrize("scan,prefix", LAYOUTS, ids=LAYOUT_IDS)
def test_map_logits_equal(tmp_path, scan, prefix):
    ref = reference()
    model = keras_vit.load(save_npz(tmp_path / "w.npz", bv_tensors(ref, scan, prefix)))
    assert (model.pooling, model.class_token, model.gelu_approximate) == ("map", False, True)
    x = images()
    assert_parity(f"big_vision/map_{'scan' if scan else 'loop'}_{prefix.strip('/').replace('/', '_')}",
                  model(x), torch_logits(ref, x))


@pytest.mark.parametrize("pool_type", sorted(POOL_TYPES))
def test_every_pool_type(tmp_path, pool_type):
    """pool_type "0" and "none" store nothing that tells them from "gap": they need pooling=."""
    ref = reference(pool_type)
    path = save_npz(tmp_path / "w.npz", bv_tensors(ref))
    model = keras_vit.load(path, **POOL_TYPES[pool_type][1])
    x = images()
    expected = torch_logits(ref, x)  # (B, N, C) for the unpooled references
    expected = expected[:, 0] if pool_type == "0" else expected
    assert_parity(f"big_vision/pool_{pool_type}", model(x), expected)


@pytest.mark.parametrize("pool_type", ["tok", "gap", "map"])
def test_rep_size(tmp_path, pool_type):
    """rep_size: logits = head(tanh(pre_logits(pooled))); timm has no such layer, so the reference
    applies it in NumPy to timm's pooled features."""
    ref = reference(pool_type)
    rng = np.random.default_rng(0)
    shapes = {"pre_logits/kernel": (48, 16), "pre_logits/bias": (16,), "head/kernel": (16, 5)}
    tensors = {**bv_tensors(ref), **{"params/" + n: rng.normal(0, 0.2, s).astype("float32") for n, s in shapes.items()}}
    model = keras_vit.load(save_npz(tmp_path / "w.npz", tensors))
    assert model.representation_size == 16
    x = images()
    with torch.no_grad():
        pooled = ref.forward_head(ref.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2))), pre_logits=True)
    hidden = np.tanh(pooled.double().numpy() @ tensors["params/pre_logits/kernel"] + tensors["params/pre_logits/bias"])
    assert_parity(f"big_vision/rep_size_{pool_type}", model(x),
                  hidden @ tensors["params/head/kernel"] + tensors["params/head/bias"])


@pytest.mark.parametrize("grid", [(8, 8), (8, 12), (12, 8), (5, 16)])
def test_sincos_table_equals_big_vision_formula(grid):
    model = tiny_vit(image_size=(grid[0] * 4, grid[1] * 4), position_embedding="sincos", pooling="gap")
    table = to_numpy(model.position_embedding.embedding)[0]
    # float32 round-off: the oracle's arguments x * w_k are rounded to float32 before sin / cos.
    assert relative_error(table, sincos_oracle(*grid, 48)) < 2e-6
    with_token = to_numpy(tiny_vit(image_size=(grid[0] * 4, grid[1] * 4),
                                   position_embedding="sincos").position_embedding.embedding)[0]
    assert not with_token[0].any() and relative_error(with_token[1:], table) == 0


@pytest.mark.parametrize("pool_type,size", [("gap", (48, 32)), ("tok", (32, 48)), ("map", (32, 32))])
def test_sincos_checkpoint(tmp_path, pool_type, size):
    """No pos_embedding in the file: the loader builds ViT(position_embedding="sincos") at the
    image_size asked for; the reference is timm's model holding the oracle's table."""
    ref = reference(pool_type, img_size=size)
    with torch.no_grad():
        ref.pos_embed.copy_(torch.from_numpy(sincos_oracle(size[0] // 4, size[1] // 4, 48)[None]))
    path = save_npz(tmp_path / "w.npz", bv_tensors(ref, sincos=True))
    with pytest.raises(ValueError, match="image_size"):
        keras_vit.load(path)
    model = keras_vit.load(path, image_size=size)
    assert model.position_embedding_kind == "sincos" and model.image_size == size
    x = images((2, *size, 3))
    assert_parity(f"big_vision/sincos_{pool_type}_{size[0]}x{size[1]}", model(x), torch_logits(ref, x))


def test_siglip_image_tower(tmp_path):
    """params/img/ of a two-tower file: the ViT with its MAP head and projection head; features
    (the MAP output) with num_classes=0. timm reads the same file."""
    ref = reference(num_classes=48)  # SigLIP's image "head" projects to the embedding width
    path = two_tower_file(tmp_path / "siglip.npz", ref)
    other = reference(seed=1, num_classes=48)
    with torch.no_grad():
        _load_weights(other, str(path))
    x = images()
    assert relative_error(torch_logits(other, x), torch_logits(ref, x)) < 1e-6
    assert_parity("big_vision/siglip_img_head", keras_vit.load(path)(x), torch_logits(ref, x))
    features = keras_vit.load(path, num_classes=0)
    assert features.num_classes == 0 and features.pooling == "map"
    with torch.no_grad():
        expected = ref.forward_head(ref.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2))), pre_logits=True)
    assert_parity("big_vision/siglip_img_features", features(x), expected.numpy())


def test_the_text_tower_is_never_read(tmp_path):
    """The text tower's data is damaged (a bad CRC, which zipfile reports once a member is read to
    its end) while its headers are whole: the image tower loads, as the headers are all it reads
    of the text tower."""
    ref = reference(num_classes=48)
    path = two_tower_file(tmp_path / "siglip.npz", ref)
    raw = bytearray(path.read_bytes())
    text = np.random.default_rng(3).normal(size=(1000, 48)).astype("float32")  # as two_tower_file writes it
    raw[raw.index(text[-2].tobytes())] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="the data of 'params/txt/Embed_0/embedding.npy' cannot be read"):
        npz.read(path)
    x = images()
    assert_parity("big_vision/siglip_img_text_damaged", keras_vit.load(path)(x), torch_logits(ref, x))


def test_naflex_is_named(tmp_path):
    """SigLIP 2 NaFlex towers keep a Dense patch embedding (P * P * C, D) and an (h, w, D) table."""
    tensors = bv_tensors(reference(), prefix="params/img/")
    tensors["params/img/embedding/kernel"] = tensors["params/img/embedding/kernel"].reshape(-1, 48)
    tensors["params/img/pos_embedding"] = tensors["params/img/pos_embedding"].reshape(8, 8, 48)
    with pytest.raises(ValueError, match="NaFlex"):
        keras_vit.load(save_npz(tmp_path / "naflex.npz", tensors))


def test_map_pooling_needs_a_map_head(tmp_path):
    path = save_npz(tmp_path / "w.npz", bv_tensors(reference("gap")))
    with pytest.raises(ValueError, match="pooling='map' needs the checkpoint's MAP head"):
        keras_vit.load(path, pooling="map")

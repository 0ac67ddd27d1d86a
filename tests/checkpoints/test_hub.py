"""Handles (hf://, gs://, URLs, catalog names) against a stand-in Hub and GCS on 127.0.0.1.

The stand-in serves files written from reference models (timm, transformers, and Google's `.npz`
layout written from a timm model), so each handle kind is checked for logits, not just for bytes.
"""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import pathlib
import re
import subprocess
import time

import huggingface_hub
import numpy as np
import pytest
import timm
import torch
from tests import ROOT
from tests.checkpoints.checkpoint_oracles import (
    assert_parity, randomize_torch, save_npz, tanh_gelu, timm_vit, torch_logits, vit_jax_npz,
)
from tests.conftest import images, random_vit, to_numpy
from tests.checkpoints.hub_standin import StandIn
from tests.checkpoints.kerashub_oracles import keras_hub_preset
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

import keras_vit
from keras_vit import catalog, hub

TIMM_REPO, HF_REPO, NPZ_REPO = "test/tiny-timm", "test/tiny-vit-hf", "test/tiny-npz"
NAMES = ("ant", "bee", "cat", "dog", "eel")


def _files(folder):
    return {p.name: p.read_bytes() for p in pathlib.Path(folder).iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """Reference models and the bytes of their repos: a timm repo as timm's `save_for_hf` writes it
    (no num_heads anywhere: the name says "tiny"; width 96 is in no width table), a transformers
    repo with a preprocessor config, and Google `.npz` files."""
    root = tmp_path_factory.mktemp("repos")
    args = dict(img_size=32, patch_size=4, embed_dim=96, depth=2, num_classes=5, global_pool="avg")
    torch.manual_seed(0)
    tm = randomize_torch(timm.create_model("vit_tiny_patch16_224", pretrained=False, **args))
    timm.models.save_for_hf(tm, root / "timm", model_config=dict(label_names=list(NAMES)),
                            model_args={k: v for k, v in args.items() if k != "num_classes"}, safe_serialization=True)
    hf = randomize_torch(ViTForImageClassification(ViTConfig(
        image_size=32, patch_size=4, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
        intermediate_size=96, num_labels=5)))
    hf.save_pretrained(str(root / "hf"), safe_serialization=True)
    ViTImageProcessor(image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.3, 0.4]).save_pretrained(str(root / "hf"))
    google = timm_vit(act_layer=tanh_gelu)
    npz = save_npz(root / "a.npz", vit_jax_npz(google)).read_bytes()
    other = save_npz(root / "b.npz", vit_jax_npz(timm_vit(seed=3, act_layer=tanh_gelu))).read_bytes()
    return dict(timm=(tm, _files(root / "timm")), hf=(hf, _files(root / "hf")), google=(google, npz, other))


@pytest.fixture
def standin(refs, tmp_path, monkeypatch):
    """The stand-in, serving the reference repos and a bucket; every cache in tmp_path."""
    with StandIn() as s:
        s.repos[TIMM_REPO] = refs["timm"][1]
        s.repos[HF_REPO] = refs["hf"][1]
        s.repos[NPZ_REPO] = {"a.npz": refs["google"][1], "b.npz": refs["google"][2], "README.md": b"# two"}
        s.repos["test/one-npz"] = {"ViT-Ti_4.npz": refs["google"][1]}
        s.buckets["vit_models"] = {"augreg/Ti_4.npz": refs["google"][1]}
        s.buckets["files"] = {"Ti_4.npz": refs["google"][1]}
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", s.url)
        monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        # huggingface_hub reads HF_HUB_CACHE once, at import; users set it before starting Python.
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
        yield s


def _check_timm(model, refs):
    ref = refs["timm"][0]
    x = images()
    assert model.num_heads == 3 and model.pooling == "gap" and model.class_names == NAMES
    assert_parity("hub/timm", model(x), torch_logits(ref, x))


def _check_google(model, refs):
    x = images()
    assert_parity("hub/google", model(x), torch_logits(refs["google"][0], x))


def test_hf_timm_repo_loads_without_hints(standin, refs):
    _check_timm(keras_vit.load(f"hf://{TIMM_REPO}"), refs)
    commit = standin.commit(TIMM_REPO)
    _check_timm(keras_vit.load(f"hf://{TIMM_REPO}@{commit}"), refs)


def test_hf_transformers_repo_loads_with_its_preprocessing(standin, refs):
    model = keras_vit.load(f"hf://{HF_REPO}")
    assert model.image_mean == (0.4, 0.5, 0.6) and model.image_std == (0.2, 0.3, 0.4)
    x = images()
    assert_parity("hub/transformers", model(x), torch_logits(refs["hf"][0], x))


def test_hf_keras_hub_preset_loads(standin, tmp_path):
    ref = keras_hub_preset(tmp_path / "preset", head=dict(num_classes=3, intermediate_dim=24))
    standin.repos["keras/tiny-vit"] = _files(tmp_path / "preset")
    model = keras_vit.load("hf://keras/tiny-vit")
    x = images()
    assert_parity("hub/keras_hub", model(x), to_numpy(ref(x)), tol=1e-5)


def test_load_takes_a_handle_with_overrides_and_from_preset_points_to_it(standin, refs):
    """keras_vit.load is the one way in: a handle gives its weights, overrides act on them, and
    from_preset, which builds architectures only, names keras_vit.load for a handle."""
    _check_timm(keras_vit.load(f"hf://{TIMM_REPO}"), refs)
    loaded = keras_vit.load(f"hf://{TIMM_REPO}", num_classes=3, image_size=48)
    assert loaded.image_size == (48, 48) and loaded.num_classes == 3
    assert not np.any(to_numpy(loaded.head.classifier.kernel))  # the paper's new head, zero-initialized
    with pytest.raises(ValueError, match=r"Unknown preset 'hf://test/tiny-timm'.*keras_vit.load\('hf://test/tiny-timm'\)"):
        keras_vit.ViT.from_preset(f"hf://{TIMM_REPO}")


@pytest.mark.parametrize("fmt", ["transformers", "keras_hub", "timm"])
def test_push_to_hub_then_load(standin, monkeypatch, fmt):
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    model = random_vit(class_names=tuple("abcde"))
    url = keras_vit.push_to_hub(model, f"org/pushed-{fmt}", format=fmt, private=True, commit_message="first")
    assert standin.private[f"org/pushed-{fmt}"] and standin.messages[-1] == "first" and f"org/pushed-{fmt}" in url
    again = keras_vit.load(f"hf://org/pushed-{fmt}")
    assert again.get_config() == model.get_config()
    x = images()
    np.testing.assert_allclose(to_numpy(again(x)), to_numpy(model(x)), rtol=1e-5, atol=1e-6)


def test_a_cut_upload_leaves_the_repo_as_it_was(standin, monkeypatch):
    standin.cut.add("/api/models/org/cut/commit/")
    monkeypatch.setattr(huggingface_hub.utils._http.time, "sleep", lambda s: None)  # huggingface_hub's 5 retries
    with pytest.raises(ConnectionError, match=r"pushing to org/cut failed .*; the repo is as it was"):
        keras_vit.push_to_hub(random_vit(), "org/cut")
    assert standin.repos["org/cut"] == {}  # created, but no file of the cut commit
    with pytest.raises(ValueError, match="config.json"):
        keras_vit.load("hf://org/cut")


def test_hf_npz_repo_needs_filename_when_it_holds_several(standin, refs):
    with pytest.raises(ValueError, match=r"holds 2 \.npz files, \['a\.npz', 'b\.npz'\]; give the URL of one, "
                       r"such as (http\S+/resolve/main/a\.npz) \(in Python, filename='a\.npz'\)") as error:
        keras_vit.load(f"hf://{NPZ_REPO}")
    # The advice works as given: the URL is what a CLI's --checkpoint or --weights takes.
    _check_google(keras_vit.load(re.search(r"such as (\S+) ", str(error.value)).group(1)), refs)
    _check_google(keras_vit.load(f"hf://{NPZ_REPO}", filename="a.npz"), refs)
    _check_google(keras_vit.load("hf://test/one-npz"), refs)


def test_gs_and_url_handles_load(standin, refs):
    _check_google(keras_vit.load("gs://vit_models/augreg/Ti_4.npz"), refs)
    _check_google(keras_vit.load(f"{standin.url}/files/Ti_4.npz"), refs)
    cached = list((pathlib.Path(hub.keras_home()) / "keras_vit").glob("*/Ti_4.npz"))
    assert len(cached) == 2, cached  # one per URL


def test_an_https_url_loads(refs, tmp_path, monkeypatch):
    # A certificate for 127.0.0.1 that the client trusts through SSL_CERT_FILE, as for a private mirror.
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    with StandIn(tls=(cert, key)) as s:
        s.buckets["files"] = {"Ti_4.npz": refs["google"][1]}
        assert s.url.startswith("https://")
        _check_google(keras_vit.load(f"{s.url}/files/Ti_4.npz"), refs)


def test_a_second_load_downloads_nothing(standin, refs):
    keras_vit.load(f"hf://{TIMM_REPO}")
    keras_vit.load("gs://vit_models/augreg/Ti_4.npz")
    before = standin.gets()
    assert before == 3  # config.json, model.safetensors, the .npz
    _check_timm(keras_vit.load(f"hf://{TIMM_REPO}"), refs)
    _check_google(keras_vit.load("gs://vit_models/augreg/Ti_4.npz"), refs)
    assert standin.gets() == before


def test_offline_loads_from_the_cache_with_the_server_gone(standin, refs, monkeypatch):
    keras_vit.load(f"hf://{TIMM_REPO}")
    keras_vit.load("hf://test/one-npz")
    keras_vit.load("gs://vit_models/augreg/Ti_4.npz")
    standin.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _check_timm(keras_vit.load(f"hf://{TIMM_REPO}"), refs)
    _check_google(keras_vit.load("hf://test/one-npz"), refs)
    _check_google(keras_vit.load("gs://vit_models/augreg/Ti_4.npz"), refs)
    with pytest.raises(keras_vit.DownloadError, match=rf"HF_HUB_OFFLINE is set and hf://{HF_REPO} is not in the cache"):
        keras_vit.load(f"hf://{HF_REPO}")


@pytest.mark.parametrize("handle", [f"hf://{TIMM_REPO}", "gs://vit_models/augreg/Ti_4.npz"])
def test_no_server_and_nothing_cached_fails_fast_and_clearly(standin, handle):
    url = standin.url
    standin.stop()
    start = time.monotonic()
    with pytest.raises(keras_vit.DownloadError) as info:
        keras_vit.load(handle)
    assert time.monotonic() - start < 20
    message = str(info.value)
    assert handle in message and url in message and "by hand" in message


@pytest.mark.parametrize("handle, path", [(f"hf://{TIMM_REPO}", "model.safetensors"),
                                          ("gs://vit_models/augreg/Ti_4.npz", "Ti_4.npz")])
def test_a_download_cut_short_is_not_kept(standin, refs, handle, path):
    standin.cut.add(path)
    with pytest.raises(keras_vit.DownloadError):
        keras_vit.load(handle)
    leftovers = [p for root in (huggingface_hub.constants.HF_HUB_CACHE, hub.keras_home())
                 for p in pathlib.Path(root).rglob("*") if p.is_file() and p.stat().st_size > 10_000]
    assert leftovers == []  # the weights are larger; config.json and lock files are not
    standin.cut.clear()
    model = keras_vit.load(handle)
    (_check_timm if handle.startswith("hf") else _check_google)(model, refs)


@pytest.mark.parametrize("handle, path", [(f"hf://{TIMM_REPO}", "model.safetensors"),
                                          ("gs://vit_models/augreg/Ti_4.npz", "Ti_4.npz")])
def test_a_damaged_download_is_deleted(standin, refs, handle, path):
    if handle.startswith("gs"):  # a body that ends early with a matching length: only its structure tells
        standin.buckets["vit_models"]["augreg/Ti_4.npz"] = refs["google"][1][:-100]
    else:
        standin.corrupt.add(path)
    with pytest.raises(keras_vit.DownloadError, match="deleted"):
        keras_vit.load(handle)
    standin.corrupt.clear()
    standin.buckets["vit_models"]["augreg/Ti_4.npz"] = refs["google"][1]
    model = keras_vit.load(handle)
    (_check_timm if handle.startswith("hf") else _check_google)(model, refs)


def test_a_short_safetensors_url_download_is_deleted(standin, refs):
    weights = refs["timm"][1]["model.safetensors"]
    standin.buckets["files"]["model.safetensors"] = weights[:-64]
    url = f"{standin.url}/files/model.safetensors"
    with pytest.raises(keras_vit.DownloadError, match="damaged.*deleted"):
        keras_vit.load(url)
    assert not list(pathlib.Path(hub.keras_home()).rglob("model.safetensors*"))
    standin.buckets["files"]["model.safetensors"] = weights
    assert keras_vit.load(url, num_heads=3).num_heads == 3  # no config.json beside a URL's file


def test_unknown_repo_revision_file_and_object_are_named(standin):
    with pytest.raises(ValueError, match=r"no repo 'nobody/nothing'"):
        keras_vit.load("hf://nobody/nothing")
    with pytest.raises(ValueError, match=r"has no revision 'v9'"):
        keras_vit.load(f"hf://{TIMM_REPO}@v9")
    with pytest.raises(ValueError, match=r"has no file 'c\.npz'"):
        keras_vit.load(f"hf://{NPZ_REPO}", filename="c.npz")
    with pytest.raises(keras_vit.DownloadError, match=r"gs://vit_models/augreg/missing\.npz.*404"):
        keras_vit.load("gs://vit_models/augreg/missing.npz")


@pytest.mark.parametrize("bad, message", [
    ("hf://just/too/deep", "the repo must be 'org/name'"),
    ("gs://vit_models", "is not gs://bucket/path/to/object"),
    ("https://example.invalid/model.pth", "is not a checkpoint file keras_vit reads"),
    ("vit_base_patch16_224.augreg_in21k_ft_1k", "did you mean 'vit_base_patch16_224.augreg_in21k_ft_in1k'"),
])
def test_malformed_handles_and_unknown_names(bad, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.load(bad)


def test_a_catalog_name_is_a_handle(standin, refs):
    entry = catalog.lookup("vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    standin.repos[entry.handle[len("hf://"):]] = refs["timm"][1]  # served here with the tiny model
    _check_timm(keras_vit.load(entry.name), refs)


@pytest.mark.parametrize("entry", keras_vit.list_pretrained(), ids=lambda e: e.name)
def test_catalog_entries_parse_and_match_timm_parameter_counts(entry):
    parsed = hub.parse(entry.handle)
    assert parsed.kind in ("hf", "gs") and str(parsed) == entry.handle
    assert entry.license == "Apache-2.0" and 70 < entry.top1 < 90 and entry.resolution in (224, 384)
    config = dict(keras_vit.preset_config(entry.preset), image_size=entry.resolution, num_classes=1000)
    with torch.device("meta"):  # timm's model without allocating its weights
        reference = timm.create_model(entry.timm_name, pretrained=False)
    assert keras_vit.count_params(config) == sum(p.numel() for p in reference.parameters())


def test_the_docs_catalog_table_is_the_catalog():
    readme = (ROOT / "docs" / "checkpoints.md").read_text()
    table = readme.split("<!-- catalog -->")[1].split("<!-- /catalog -->")[0].strip().splitlines()[2:]
    rows = [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in table]
    expected = [[e.name, e.handle, str(e.resolution), f"{e.top1:g}",
                 e.top1_source.split()[0].lower().replace("dosovitskiy", "paper")]
                for e in keras_vit.list_pretrained()]
    assert rows == expected

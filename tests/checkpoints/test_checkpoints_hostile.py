"""Hostile and half-precision checkpoint files, loaded in a subprocess under a memory limit.

One worker process (tests/checkpoints/hostile_worker.py) loads every case in turn with its address space
capped at its size after start-up plus 3 GiB, so a reader that allocated what a file declares
(8 GiB) fails with MemoryError instead of passing. Each case must end in a clear ValueError, or
load with the right weights. The reader-level checks that need no big allocation run in-process
in test_checkpoints_readers.py.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
from tests import ROOT
from tests.checkpoints.checkpoint_oracles import relative_error
from tests.conftest import images, randomize, tiny_vit, to_numpy
from tests.checkpoints.hostile_files import lying_npz, raw_safetensors, rounded, save_npz, save_safetensors, zip_bomb
from tests.checkpoints.hostile_worker import assign_google, google_tensors

import keras_vit
from keras_vit.checkpoints.google import DEFAULTS as GOOGLE_DEFAULTS

NAN = "Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"
INF = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/kernel"
INF_TIMM = "blocks.0.attn.proj.weight"  # INF in the timm file
HALF = ("float16", "bfloat16")


def _timm_tensors(model, tmp):
    """The timm state dict and metadata that save_checkpoint writes for `model`."""
    import safetensors

    keras_vit.save_checkpoint(model, tmp / "timm.safetensors")
    with safetensors.safe_open(str(tmp / "timm.safetensors"), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def _files(tmp, weights, timm, meta):
    """{case: (path, load kwargs)} for every hostile and half-precision case."""
    nan = {**weights, NAN: weights[NAN].copy()}
    nan[NAN][0, :3] = np.nan
    inf = {**timm, INF_TIMM: timm[INF_TIMM].copy()}
    inf[INF_TIMM][1, 1] = -np.inf
    whole = tmp / "whole.npz"
    whole_st = save_safetensors(tmp / "whole.safetensors", timm, "float32", meta)
    for name, src in (("cut.npz", whole), ("cut.safetensors", whole_st)):
        (tmp / name).write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    np.savez(tmp / "object.npz", **{**weights, NAN: np.array([{"a": 1}], dtype=object)})
    claims = {"patch_embed.proj.weight": {"dtype": "F32", "shape": [1 << 31], "data_offsets": [0, 1 << 33]}}
    files = {
        "zip_bomb": (zip_bomb(tmp / "bomb.npz"), {}),
        "lying_npz_header": (lying_npz(tmp / "lying.npz"), {}),
        "lying_safetensors_header": (raw_safetensors(tmp / "lying.safetensors", claims, bytes(1024), meta), {}),
        "object_array": (tmp / "object.npz", {}),
        "truncated_npz": (tmp / "cut.npz", {}), "truncated_safetensors": (tmp / "cut.safetensors", {}),
        "nan_npz": (save_npz(tmp / "nan.npz", nan, "float32"), {}),
        "nan_npz_allowed": (tmp / "nan.npz", {"allow_nonfinite": True}),
        "inf_safetensors": (save_safetensors(tmp / "inf.safetensors", inf, "float32", meta), {}),
        "inf_safetensors_allowed": (tmp / "inf.safetensors", {"allow_nonfinite": True}),
    }
    for dtype in HALF:
        files[f"{dtype}_npz"] = (save_npz(tmp / f"{dtype}.npz", weights, dtype), {})
        files[f"{dtype}_safetensors"] = (save_safetensors(tmp / f"{dtype}.safetensors", timm, dtype, meta), {})
    return files


def _worker(tmp, files):
    """Runs hostile_worker.py on `files` ({case: (path, kwargs)}); returns its results."""
    jobs = [{"case": c, "path": str(p), "kwargs": kw, "out": str(tmp / f"{c}.out.npz")} for c, (p, kw) in files.items()]
    spec = {"warmup": str(tmp / "whole.npz"), "images": str(tmp / "images.npy"), "headroom_gib": 3, "jobs": jobs}
    (tmp / "jobs.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-m", "tests.checkpoints.hostile_worker", str(tmp / "jobs.json"),
                           str(tmp / "results.json")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp / "results.json").read_text())
    print(json.dumps(results, indent=1))  # the peak memory of every case, shown with pytest -s
    return results["cases"]


def _reference_logits(weights, x):
    """{(format, dtype): logits of a float32 model holding `weights` rounded to dtype}; the npz
    model has the Google family's defaults (tanh GELU), the timm file restores the original."""
    out = {}
    for fmt, config in (("npz", GOOGLE_DEFAULTS), ("safetensors", {})):
        model = tiny_vit(**config)
        for dtype in ("float32",) + HALF:
            out[fmt, dtype] = to_numpy(assign_google(model, rounded(weights, dtype))(x))
    return out


def _setup(tmp):
    """(weights, timm tensors, metadata) of a random tiny model, with whole.npz and images.npy."""
    model = randomize(tiny_vit())
    weights = google_tensors(model)
    timm, meta = _timm_tensors(model, tmp)
    save_npz(tmp / "whole.npz", weights, "float32")
    np.save(tmp / "images.npy", images())
    return weights, timm, meta


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(results per case, reference logits, weights, folder) of the worker's run over `_files`."""
    tmp = tmp_path_factory.mktemp("hostile")
    weights, timm, meta = _setup(tmp)
    return _worker(tmp, _files(tmp, weights, timm, meta)), _reference_logits(weights, images()), weights, tmp


def _refused(case, result, match):
    assert result.get("error") == "ValueError", f"{case}: {result}"
    assert match in result["message"], f"{case}: {result['message']}"
    # A hang guard, not a speed measure: inflating the 8 GiB alone takes tens of seconds.
    assert result["seconds"] < 20, result


@pytest.mark.parametrize("case, match", [
    ("zip_bomb", "refusing a likely zip bomb"),
    ("lying_npz_header", "declares shape (2147483648,)"),
    ("lying_safetensors_header", "declares shape [2147483648]"),
])
def test_declared_sizes_are_refused_before_allocation(run, case, match):
    result = run[0][case]
    _refused(case, result, match)
    # Nothing the size of the claim was touched: the high-water mark of resident memory holds still.
    assert result["peak_rss_mib"] - result["rss_before_mib"] < 64, result


@pytest.mark.parametrize("case, match", [
    ("object_array", "has dtype '|O'; checkpoints hold float, integer or bool arrays"),
    ("truncated_npz", "is it truncated"),
    ("truncated_safetensors", "is the file truncated"),
    ("nan_npz", f"{NAN} (3 NaN, 0 Inf)"),
    ("inf_safetensors", f"{INF_TIMM} (0 NaN, 1 Inf)"),
])
def test_bad_files_are_refused(run, case, match):
    _refused(case, run[0][case], match)


@pytest.mark.parametrize("case, name", [("nan_npz_allowed", NAN), ("inf_safetensors_allowed", INF)])
def test_nonfinite_loads_when_allowed(run, case, name):
    result, tmp = run[0][case], run[3]
    assert "error" not in result, result
    loaded = np.load(tmp / f"{case}.out.npz")
    bad = ~np.isfinite(loaded["w/" + name])
    assert bad.sum() == (3 if case.startswith("nan") else 1)
    np.testing.assert_array_equal(loaded["w/" + name][~bad], run[2][name][~bad])


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_half_precision_files_load_into_float32(run, dtype, fmt):
    case = f"{dtype}_{fmt}"
    result, tmp = run[0][case], run[3]
    assert result.get("dtype") == "float32", result
    loaded = np.load(tmp / f"{case}.out.npz")
    for name, value in rounded(run[2], dtype).items():
        np.testing.assert_array_equal(loaded["w/" + name], value, err_msg=name)
    assert relative_error(loaded["logits"], run[1][fmt, dtype]) < 5e-5


@pytest.mark.slow  # building a half-precision model compiles every op anew: ~20 s per dtype on JAX
def test_half_precision_files_load_into_the_dtype_asked(tmp_path):
    weights, timm, meta = _setup(tmp_path)
    files = {}
    for dtype in HALF:
        files[f"{dtype}_npz"] = (save_npz(tmp_path / f"{dtype}.npz", weights, dtype), {"dtype": dtype})
        files[f"{dtype}_safetensors"] = (save_safetensors(tmp_path / f"{dtype}.safetensors", timm, dtype, meta),
                                         {"dtype": dtype})
    results, reference = _worker(tmp_path, files), _reference_logits(weights, images())
    for case, result in results.items():
        dtype, fmt = case.split("_")
        assert result.get("dtype") == dtype, result
        loaded = np.load(tmp_path / f"{case}.out.npz")
        for name, value in rounded(weights, dtype).items():
            np.testing.assert_array_equal(loaded["w/" + name], value, err_msg=f"{case}: {name}")
        # Computing in half precision moves the logits by its round-off (2^-8 relative for bfloat16).
        assert relative_error(loaded["logits"], reference[fmt, dtype]) < 5e-2, case

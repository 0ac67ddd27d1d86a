"""The `.npz` and `.safetensors` readers: header checks, expected shapes, dtypes and peak memory.

Every file here is small, so a reader that trusted a lie could not take much memory; the lies
that promise gigabytes are loaded under a memory limit in test_checkpoints_hostile.py.
"""

from tests.checkpoints import checkpoint_oracles  # noqa: F401  (first: it keeps triton out next to TensorFlow; see there)

import tracemalloc
import zipfile

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from tests.checkpoints.hostile_files import npy_bytes, raw_safetensors

from keras_vit.io import npz
from keras_vit.io import safetensors as safetensors_io

pytestmark = pytest.mark.one_backend  # the same on every backend: scripts/test runs it once

F32 = {"dtype": "F32", "shape": [4, 8]}  # 128 bytes


def _entries(*spans, **changes):
    return {f"t{i}": {**F32, "data_offsets": list(span), **changes} for i, span in enumerate(spans)}


@pytest.mark.parametrize("entries, data, match", [
    (_entries((0, 128), (64, 192)), bytes(192), "overlaps the tensor before it"),
    (_entries((0, 128), (136, 264)), bytes(264), "leaves a gap of 8 bytes"),
    (_entries((0, 128)), bytes(64), "of the data section, which holds 64 bytes; is the file truncated"),
    (_entries((0, 128)), bytes(256), "end at byte 128 of the data section, which holds 256 bytes"),
    (_entries((0, 64)), bytes(64), "has shape (4, 8) F32 (128 bytes) but data_offsets [0, 64]"),
    (_entries((64, 0)), bytes(64), "data_offsets [64, 0]"),
    (_entries((0, 128), dtype="F8_E4M3"), bytes(128), "has dtype 'F8_E4M3'; readable dtypes are"),
    (_entries((0, 128), shape=[-4, 8]), bytes(128), "declares shape [-4, 8]"),
    (_entries((0, 0), shape=[0, 1 << 62]), b"", "declares shape [0, 4611686018427387904]"),
    ({"t": {"dtype": "F32", "shape": [1], "offsets": [0, 4]}}, bytes(4), "needs exactly dtype, shape and data_offsets"),
    ({"t": [1, 2]}, b"", "malformed"),
])
def test_safetensors_header_lies_are_named(tmp_path, entries, data, match):
    path = raw_safetensors(tmp_path / "w.safetensors", entries, data)
    with pytest.raises(ValueError, match="corrupt or hostile|truncated|readable dtypes|malformed") as info:
        safetensors_io.read(path)
    assert match in str(info.value)


@pytest.mark.parametrize("header_len, match", [(1 << 40, "does not fit"), (0, "does not fit"), (5, "not JSON")])
def test_safetensors_header_length_is_bounded(tmp_path, header_len, match):
    path = raw_safetensors(tmp_path / "w.safetensors", _entries((0, 128)), bytes(128), header_len=header_len)
    with pytest.raises(ValueError, match=match):
        safetensors_io.read(path)


def test_safetensors_duplicate_names_and_metadata(tmp_path):
    path = tmp_path / "w.safetensors"
    raw = (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
           b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}')
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(8))
    with pytest.raises(ValueError, match=r"duplicate names \['a'\]"):
        safetensors_io.read(path)
    raw_safetensors(path, _entries((0, 128)), bytes(128), metadata={"heads": 3})
    with pytest.raises(ValueError, match="__metadata__ must map strings to strings"):
        safetensors_io.read(path)


def test_safetensors_reads_what_the_library_writes(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"f32": rng.normal(size=(3, 5)).astype("float32"), "f16": rng.normal(size=(7,)).astype("float16"),
               "i64": np.arange(4, dtype="int64"), "empty": np.zeros((0, 3), "float32"),
               "flag": np.array([True, False])}
    safetensors.numpy.save_file(tensors, str(tmp_path / "w.safetensors"), {"k": "v"})
    out = safetensors_io.read(tmp_path / "w.safetensors")
    shapes, metadata = safetensors_io.headers(tmp_path / "w.safetensors")
    assert metadata == {"k": "v"} and sorted(out) == sorted(tensors) == sorted(shapes)
    for k, v in tensors.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
        np.testing.assert_array_equal(out[k], v)


def test_bfloat16_safetensors_without_torch_matches_torch(tmp_path):
    import safetensors.torch
    import torch

    t = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    safetensors.torch.save_file({"w": t}, str(tmp_path / "w.safetensors"))
    out = safetensors_io.read(tmp_path / "w.safetensors")
    assert out["w"].dtype == np.float32
    np.testing.assert_array_equal(out["w"], t.float().numpy())


def test_npz_dtypes_orders_and_bfloat16(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 6)).astype("float32")
    arrays = {"fortran": np.asfortranarray(x), "big_endian": x.astype(">f4"), "f16": x.astype("float16"),
              "bf16": x.astype(ml_dtypes.bfloat16), "step": np.array(7, "int32")}
    np.savez_compressed(tmp_path / "w.npz", **arrays)
    out = npz.read(tmp_path / "w.npz")
    np.testing.assert_array_equal(out["fortran"], x)
    np.testing.assert_array_equal(out["big_endian"], x)
    assert out["big_endian"].dtype == np.float32 and out["f16"].dtype == np.float16
    # bfloat16 is stored as void V2, as big_vision writes it, and comes back as exact float32.
    assert np.load(tmp_path / "w.npz")["bf16"].dtype == np.dtype("V2")
    assert out["bf16"].dtype == np.float32
    np.testing.assert_array_equal(out["bf16"], x.astype(ml_dtypes.bfloat16).astype("float32"))
    assert out["step"].dtype == np.int32 and out["step"] == 7


@pytest.mark.parametrize("member, match", [
    (npy_bytes((50,)) + bytes(100), "declares shape (50,) float32 (200 bytes) but its zip entry holds 100 bytes"),
    (npy_bytes((4,), "<c8") + bytes(32), "has dtype '<c8'"),
    (npy_bytes((4,), "|S4") + bytes(16), "has dtype '|S4'"),
    (b"\x93NUMPY\x03\x00" + bytes(20), "format version (3, 0)"),
    (b"not an array", "not a readable .npy header"),
])
def test_npz_member_headers_are_checked(tmp_path, member, match):
    with zipfile.ZipFile(tmp_path / "w.npz", "w") as zf:
        zf.writestr("w.npy", member)
    with pytest.raises(ValueError) as info:
        npz.read(tmp_path / "w.npz")
    assert match in str(info.value)


@pytest.mark.parametrize("patch, match", [("encrypted", "is encrypted"), ("method", "compression method")])
def test_npz_zip_features_that_cannot_be_read(tmp_path, patch, match):
    np.savez(tmp_path / "w.npz", w=np.ones(3, "float32"))
    raw = bytearray((tmp_path / "w.npz").read_bytes())
    central = raw.index(b"PK\x01\x02")
    if patch == "encrypted":
        raw[6] |= 1
        raw[central + 8] |= 1  # the general-purpose flag's encryption bit
    else:
        raw[8] = raw[central + 10] = 99  # compression method 99 (AES), which zipfile cannot read
    (tmp_path / "w.npz").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=f"not a readable .npy header.*{match}"):
        npz.read(tmp_path / "w.npz")


def test_headers_bound_the_inflation_and_read_takes_only_the_names_asked(tmp_path):
    # 32 MiB of zeros deflate to ~32 KiB: refused as a likely bomb from the headers alone.
    np.savez_compressed(tmp_path / "z.npz", w=np.zeros((1024, 8192), "float32"))
    for reader in (npz.headers, npz.read):
        with pytest.raises(ValueError, match="refusing a likely zip bomb"):
            reader(tmp_path / "z.npz")
    # A member that is not asked for is never inflated: here its data is damaged (a bad CRC).
    b = np.arange(1 << 18, dtype="float32")  # 1 MiB: its header is read without reaching its end
    np.savez(tmp_path / "two.npz", a=np.ones(3, "float32"), b=b)
    raw = bytearray((tmp_path / "two.npz").read_bytes())
    raw[raw.index(b[-100:-98].tobytes())] ^= 0xFF
    (tmp_path / "two.npz").write_bytes(bytes(raw))
    assert npz.headers(tmp_path / "two.npz") == ({"a": (3,), "b": (1 << 18,)}, {})
    np.testing.assert_array_equal(npz.read(tmp_path / "two.npz", ["a"])["a"], np.ones(3))
    with pytest.raises(ValueError, match="the data of 'b.npy' cannot be read"):
        npz.read(tmp_path / "two.npz", ["b"])
    with pytest.raises(ValueError, match=r"has no \['c'\]"):
        npz.read(tmp_path / "two.npz", ["a", "c"])
    safetensors.numpy.save_file({"w": np.zeros((64, 64), "float32"), "v": np.ones(3, "float32")},
                                str(tmp_path / "w.safetensors"), {"k": "v"})
    assert safetensors_io.headers(tmp_path / "w.safetensors") == ({"v": (3,), "w": (64, 64)}, {"k": "v"})
    assert list(safetensors_io.read(tmp_path / "w.safetensors", ["v"])) == ["v"]


def _peak(read):
    """(bytes of the arrays `read` returns, peak bytes traced while it ran)."""
    tracemalloc.start()
    try:
        out = read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out = out[0] if isinstance(out, tuple) else out
    return sum(v.nbytes for v in out.values()), peak


@pytest.mark.parametrize("stored", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", ["npz", "npz_compressed", "safetensors"])
def test_peak_memory_is_the_arrays_returned(tmp_path, fmt, stored):
    """Reading allocates the arrays it returns plus a few 1 MiB chunks (zipfile's and zlib's
    buffers) or, for bfloat16, one stored tensor: never the file twice."""
    x = np.random.default_rng(0).normal(size=(4, 1024, 1024)).astype("float32")
    tensors = {f"t{i}": x[i].astype(ml_dtypes.bfloat16 if stored == "bfloat16" else "float32") for i in range(4)}
    if fmt == "safetensors":
        from tests.checkpoints.hostile_files import save_safetensors

        path = save_safetensors(tmp_path / "w.safetensors", {k: x[i] for i, k in enumerate(tensors)}, stored)
        returned, peak = _peak(lambda: safetensors_io.read(path))
    else:
        path = tmp_path / "w.npz"
        (np.savez_compressed if fmt == "npz_compressed" else np.savez)(path, **tensors)
        returned, peak = _peak(lambda: npz.read(path))
    assert returned == 4 * 4 << 20
    # bfloat16 is decoded tensor by tensor: its stored bytes live next to the float32 copy.
    decoding = tensors["t0"].nbytes if stored == "bfloat16" else 0
    assert peak <= returned + decoding + (6 << 20), (peak, returned)

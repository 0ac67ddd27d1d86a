"""Writers of hostile and half-precision checkpoint files, independent of keras_vit's readers.

`zip_bomb` writes a real deflate bomb: a few MB on disk that a reader trusting the zip would
inflate to the 8 GiB its `.npy` header promises. `raw_safetensors` writes the safetensors layout
byte by byte (8-byte length, JSON header, data) so that its header can lie.
"""

import io
import json
import struct
import zipfile
import zlib

import ml_dtypes
import numpy as np
from numpy.lib import format as npy_format

GiB = 1 << 30
_MiB = 1 << 20


def npy_bytes(shape, dtype="<f4"):
    """An .npy header (version 1.0) declaring `shape` and `dtype`, without data."""
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue()


def zip_bomb(path, name="embedding/kernel", gib=8):
    """An .npz whose one member inflates to an .npy of `gib` GiB of float32 zeros.

    The deflate stream repeats one 1 MiB block of zeros (each block starts afresh after a full
    flush, so the blocks are identical); the sizes and the CRC in the zip are the true ones.
    """
    header = npy_bytes((gib * GiB // 4,))
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(header) + c.flush(zlib.Z_FULL_FLUSH)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(bytes(_MiB)) + c.flush(zlib.Z_FULL_FLUSH)
    blocks = gib * GiB // _MiB
    data = head + block * blocks + b"\x03\x00"  # b"\x03\x00": an empty final block ends the stream
    crc = _crc32_zeros(zlib.crc32(header), blocks)
    _write_zip64(path, name + ".npy", data, len(header) + gib * GiB, crc)
    return path


def _crc32_zeros(crc, mib):
    """zlib.crc32 of `mib` (a power of two) MiB of zeros, continuing from `crc`, in milliseconds.

    Extending a CRC over k zero bytes is an affine map of the 32-bit state over GF(2),
    f(v) = M v ^ f(0); squaring it k times doubles k each time, where hashing 8 GiB takes seconds.
    """
    zeros = bytes(_MiB)
    c0 = zlib.crc32(zeros, 0)
    cols = [zlib.crc32(zeros, 1 << i) ^ c0 for i in range(32)]  # M's columns for k = 1 MiB

    def f(v):
        return c0 ^ _xor([cols[i] for i in range(32) if v >> i & 1])

    for _ in range(mib.bit_length() - 1):
        c0, cols = f(f(0)), [f(f(1 << i)) ^ f(f(0)) for i in range(32)]
    return f(crc)


def _xor(values):
    out = 0
    for v in values:
        out ^= v
    return out


def _write_zip64(path, name, data, size, crc):
    """A one-member zip (method deflate) whose sizes sit in a ZIP64 extra field."""
    name = name.encode()
    extra = struct.pack("<HHQQ", 1, 16, size, len(data))  # ZIP64: uncompressed, compressed size
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                        len(name), len(extra)) + name + extra
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 8, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                          len(name), len(extra), 0, 0, 0, 0, 0) + name + extra
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(local) + len(data), 0)
    with open(path, "wb") as f:
        f.write(local + data + central + end)


def lying_npz(path, name="embedding/kernel", gib=8):
    """An .npz whose member's .npy header promises `gib` GiB of float32 but holds 1 KiB of it."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(name + ".npy", npy_bytes((gib * GiB // 4,)) + bytes(1024))
    return path


def save_npz(path, tensors, dtype):
    """np.savez of `tensors` cast to `dtype`; "bfloat16" is stored as void `V2`, as big_vision does."""
    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    np.savez(path, **{k: np.asarray(v).astype(dtype) for k, v in tensors.items()})
    return path


def raw_safetensors(path, entries, data, metadata=None, header_len=None):
    """A .safetensors file with `entries` ({name: {dtype, shape, data_offsets}}) as its header,
    followed by `data`; `header_len` overrides the length field (to lie about it)."""
    header = dict(entries)
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)
    return path


def save_safetensors(path, tensors, dtype, metadata=None):
    """`tensors` as a .safetensors file of `dtype` ("float32", "float16" or "bfloat16")."""
    code = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[dtype]
    cast = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    entries, chunks, at = {}, [], 0
    for name, value in sorted(tensors.items()):
        raw = np.ascontiguousarray(np.asarray(value).astype(cast)).tobytes()
        entries[name] = {"dtype": code, "shape": list(np.shape(value)), "data_offsets": [at, at + len(raw)]}
        chunks.append(raw)
        at += len(raw)
    return raw_safetensors(path, entries, b"".join(chunks), metadata)


def rounded(tensors, dtype):
    """float32 copies of `tensors` holding the values that `dtype` can represent."""
    cast = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    return {k: np.asarray(v).astype(cast).astype(np.float32) for k, v in tensors.items()}

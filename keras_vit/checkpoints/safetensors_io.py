"""Reading and writing `.safetensors` files as numpy arrays, with clear errors.

safetensors is an 8-byte little-endian header length, a JSON header of names, dtypes, shapes and
byte offsets, then the raw bytes: loading it runs no code, unlike a pickled `.pth` / `.bin`.

The reader is written by hand rather than with `safetensors.numpy.load_file`: that function
allocates every tensor the file names before a caller can compare shapes with the model, and
numpy has no bfloat16, so its numpy reader refuses "BF16" (reading it took torch). Here the
header is parsed with strict bounds and every entry is checked (dtype, shape x dtype size =
byte span, spans that tile the data section exactly, nothing past the end of the file) before a
byte of tensor data is read; bfloat16 is decoded with ml_dtypes. Writing uses safetensors.
"""

import json
import math
import os

import numpy as np
import safetensors.numpy

from keras_vit.checkpoints import arrays

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "V2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
# Real headers are well under 1 MiB (a ViT-g has ~600 tensors); the safetensors library allows
# 100 MB, which is more JSON than a reader should parse for a file it does not trust.
MAX_HEADER = 16 << 20


def headers(path):
    """{name: (shape, dtype)} from the header alone, every entry checked (see the module doc)."""
    entries, _, _ = _parse(path)
    return {k: (shape, dtype) for k, (shape, dtype, _, _) in entries.items()}


def read(path, expected=None):
    """Returns ({name: array}, metadata dict) from a `.safetensors` file.

    Floats keep their stored dtype, except bfloat16, which becomes float32 (exact).

    Args:
        path: the file.
        expected: optional {name: shape}. When given, the file must hold exactly these names and
            shapes, checked from the header, so nothing larger than the model is allocated.
    """
    entries, metadata, start = _parse(path)
    if expected is not None:
        from keras_vit.checkpoints.common import check_tensors  # common imports the models

        check_tensors({k: v[0] for k, v in entries.items()}, expected, str(path))
    tensors = {}
    with open(path, "rb") as f:
        for name, (shape, dtype, begin, end) in entries.items():
            out = np.empty(shape, dtype)
            f.seek(start + begin)
            if f.readinto(out.reshape(-1).view(np.uint8)) != end - begin:
                raise ValueError(f"{path} ends inside {name!r}; is it truncated?")
            tensors[name] = arrays.decoded(out)
    return tensors, metadata


def _parse(path):
    """({name: (shape, dtype, begin, end)}, metadata, data start) after every header check."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(MAX_HEADER, size - 8):
            raise ValueError(f"{path} is not a readable .safetensors file: its header length {n} does not fit in "
                             f"{size} bytes (at most {MAX_HEADER}); is it truncated or not a checkpoint?")
        raw = f.read(n)
    try:
        header = json.loads(raw, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{path} is not a readable .safetensors file: its header is not JSON ({e}); "
                         "is it truncated or not a checkpoint?") from e
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a readable .safetensors file: its header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: __metadata__ must map strings to strings")
    entries = {name: _entry(path, name, e, size) for name, e in header.items()}
    _check_tiling(path, entries, size - 8 - n)
    return entries, metadata, 8 + n


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate names {sorted({k for k in keys if keys.count(k) > 1})[:5]}")
    return dict(pairs)


def _entry(path, name, e, size):
    """(shape, dtype, begin, end) of one header entry, checked for types and consistent size."""
    span = e.get("data_offsets") if isinstance(e, dict) and set(e) == {"dtype", "shape", "data_offsets"} else None
    if not (isinstance(span, list) and len(span) == 2 and all(type(d) is int for d in span)):
        raise ValueError(f"{path}: the header entry of {name!r} is malformed ({str(e)[:200]}); "
                         "it needs exactly dtype, shape and data_offsets [begin, end]")
    if e["dtype"] not in _DTYPES:
        raise ValueError(f"{path}: {name!r} has dtype {str(e['dtype'])[:50]!r}; readable dtypes are {sorted(_DTYPES)}")
    dtype = arrays.checked_dtype(_DTYPES[e["dtype"]], f"{path}: {name!r}")
    shape = arrays.checked_shape(e["shape"], size, f"{path}: {name!r}")
    begin, end = span
    if not 0 <= begin <= end or end - begin != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{path}: {name!r} has shape {tuple(shape)} {e['dtype']} ({math.prod(shape) * dtype.itemsize} "
                         f"bytes) but data_offsets {span}; the file is corrupt or hostile")
    return tuple(shape), dtype, begin, end


def _check_tiling(path, entries, data_size):
    """The tensors' byte spans must cover the data section exactly once: no overlap, no gap,
    nothing past the end of the file (the safetensors format's own rule)."""
    at = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: kv[1][2:]):
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else f"leaves a gap of {begin - at} bytes"
            raise ValueError(f"{path}: {name!r} at data_offsets [{begin}, {end}] {what}; the file is corrupt or hostile")
        at = end
    if at != data_size:
        raise ValueError(f"{path}: the header's tensors end at byte {at} of the data section, which holds {data_size} "
                         "bytes; is the file truncated (or not a checkpoint)?")


def write(path, tensors, metadata):
    """Writes {name: array} with string metadata."""
    safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata)

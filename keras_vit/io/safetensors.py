"""Reading and writing `.safetensors` files (an 8-byte header length, a JSON header of names,
dtypes, shapes and byte offsets, then the raw bytes) as numpy arrays, with clear errors.

The reader is written by hand: `safetensors.numpy.load_file` allocates every tensor the file names
before a caller can compare shapes with the model, and refuses "BF16" (numpy has no bfloat16).
Here the header is parsed with strict bounds and every entry checked (dtype, shape x dtype size =
byte span, spans that tile the data section exactly, nothing past the end of the file) before a
byte of data is read; bfloat16 is decoded with ml_dtypes. Writing uses safetensors.
"""

import json
import math
import os

import numpy as np
import safetensors.numpy

from keras_vit.io import arrays

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "V2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
# Real headers are well under 1 MiB (a ViT-g has ~600 tensors); the safetensors library allows
# 100 MB, which is more JSON than a reader should parse for a file it does not trust.
MAX_HEADER = 16 << 20


def headers(path):
    """({name: shape}, metadata) from the header alone, every entry checked (see the module doc)."""
    entries, metadata, _ = _parse(path)
    return {name: entry[0] for name, entry in entries.items()}, metadata


def read(path, names=None):
    """{name: array} of the tensors `names` (default: all); the others' bytes are never read.

    Floats keep their stored dtype, except bfloat16, which becomes float32 (exact).
    """
    entries, _, start = _parse(path)
    if set(names or ()) - set(entries):
        raise ValueError(f"{path} has no {sorted(set(names) - set(entries))}")
    tensors = {}
    with open(path, "rb") as f:
        for name in names or entries:
            shape, dtype, begin, end = entries[name]
            out = np.empty(shape, dtype)
            f.seek(start + begin)
            if f.readinto(out.reshape(-1).view(np.uint8)) != end - begin:
                raise ValueError(f"{path} ends inside {name!r}; is it truncated?")
            tensors[name] = arrays.decoded(out)
    return tensors


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
            raise ValueError(f"{path}: {name!r} at data_offsets [{begin}, {end}] {what}; "
                             "the file is corrupt or hostile")
        at = end
    if at != data_size:
        raise ValueError(f"{path}: the header's tensors end at byte {at} of the data section, which holds {data_size} "
                         "bytes; is the file truncated (or not a checkpoint)?")


def write(path, tensors, metadata):
    """Writes {name: array} with string metadata."""
    safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata)

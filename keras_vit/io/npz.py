"""Reading `.npz` checkpoints (a zip of `.npy` files) with every header checked before any data.

Written by hand, not with `np.load`, which allocates the array a member's `.npy` header declares
before it reads a byte of data (a small file that promises 8 GiB takes 8 GiB) and inflates a
deflated member (a zip bomb) in full before anything is compared. Here the `.npy` headers (parsed
by numpy's own header readers) and the zip's sizes of all members are checked first, against each
other and the file's size; the members the caller names are then streamed in chunks into arrays of
exactly the checked size. Nothing is unpickled; bfloat16 (`V2`) is decoded with ml_dtypes.
"""

import math
import os
import zipfile

import numpy as np
from numpy.lib import format as npy_format

from keras_vit.io import arrays

# Float weights deflate by less than 1.5x; 8x leaves room for zero-filled tensors (fresh heads),
# while a zip bomb inflates ~1000x.
MAX_INFLATION = 8
_SLACK = 16 << 20  # bytes: tiny files of zeros stay loadable
_MAX_HEADER = 10_000  # bytes of an .npy header dict, numpy's own default bound
_CHUNK = 1 << 20
# What zipfile and numpy's header parser raise on damaged, encrypted or unsupported members.
_READ_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, SyntaxError, TypeError, RuntimeError,
                NotImplementedError)


def headers(path):
    """({name: shape}, {}) from the `.npy` headers, reading no array data (an `.npz` has no
    metadata, hence the empty dict, as `keras_vit.io.safetensors.headers` returns).

    Raises ValueError for a file that is not a zip of `.npy` members, a member whose header
    disagrees with its size in the zip, a dtype that is not numeric, or members that declare more
    than `MAX_INFLATION` times the file's size (a likely zip bomb).
    """
    with _open_zip(path) as zf:
        found, _ = _headers(zf, path)
    return {name: header[0] for name, header in found.items()}, {}


def read(path, names=None):
    """{name: array} of the members `names` (default: all), after the checks of `headers`; floats
    in their stored dtype, bfloat16 (`V2`) as float32. Members not named are never inflated."""
    with _open_zip(path) as zf:
        found, members = _headers(zf, path)
        if set(names or ()) - set(found):
            raise ValueError(f"{path} has no {sorted(set(names) - set(found))}")
        return {name: _read_member(zf, members[name], found[name], path) for name in names or found}


def _open_zip(path):
    try:
        return zipfile.ZipFile(path)
    except _READ_ERRORS as e:
        raise ValueError(f"{path} is not a readable .npz archive ({type(e).__name__}: {e}); "
                         "is it truncated or not a checkpoint?") from e


def _headers(zf, path):
    """({name: (shape, dtype, fortran_order)}, {name: ZipInfo}) after every size check."""
    found, members, total = {}, {}, 0
    for info in zf.infolist():
        if not info.filename.endswith(".npy"):
            raise ValueError(f"{path} holds {info.filename!r}, which is not an .npy array; "
                             "a checkpoint holds only arrays")
        name = info.filename[: -len(".npy")]
        if name in found:
            raise ValueError(f"{path} holds {name!r} twice")
        shape, dtype, fortran, offset = _member_header(zf, info, path)
        nbytes = math.prod(shape) * dtype.itemsize
        if info.file_size != offset + nbytes:
            raise ValueError(f"{path}: {name!r} declares shape {shape} {dtype} ({nbytes} bytes) but its zip entry "
                             f"holds {info.file_size - offset} bytes of data; the file is corrupt or hostile")
        found[name], members[name], total = (shape, dtype, fortran), info, total + info.file_size
    budget = MAX_INFLATION * os.path.getsize(path) + _SLACK
    if total > budget:
        raise ValueError(f"{path} declares {total / 2**30:.2f} GiB of arrays in a file of "
                         f"{os.path.getsize(path):,} bytes, "
                         f"more than {MAX_INFLATION}x its size; refusing a likely zip bomb")
    return found, members


def _member_header(zf, info, path):
    """(shape, dtype, fortran_order, data offset) of one member, from its first bytes only."""
    name = info.filename[: -len(".npy")]
    try:
        with zf.open(info) as f:
            version = npy_format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npy_format.read_array_header_1_0(f, max_header_size=_MAX_HEADER)
            elif version == (2, 0):
                shape, fortran, dtype = npy_format.read_array_header_2_0(f, max_header_size=_MAX_HEADER)
            else:
                raise ValueError(f".npy format version {version} (only 1.0 and 2.0 hold plain numeric arrays)")
            offset = f.tell()
    except _READ_ERRORS as e:
        raise ValueError(f"{path}: the header of {name!r} is not a readable .npy header ({type(e).__name__}: {e}); "
                         "is the file truncated or not a checkpoint?") from e
    where = f"{path}: {name!r}"
    return arrays.checked_shape(shape, info.file_size, where), arrays.checked_dtype(dtype, where), bool(fortran), offset


def _read_member(zf, info, header, path):
    """The array of one member, streamed in chunks into an array of the checked size."""
    shape, dtype, fortran = header
    out = np.empty(shape[::-1] if fortran else shape, dtype)
    buf = out.reshape(-1).view(np.uint8)
    try:
        with zf.open(info) as f:
            f.seek(info.file_size - buf.size)  # past the .npy header (stored and deflated alike)
            done = 0
            while done < buf.size:
                chunk = f.read(min(_CHUNK, buf.size - done))
                if not chunk:
                    raise EOFError(f"{buf.size - done} bytes of {info.filename!r} are missing")
                buf[done: done + len(chunk)] = np.frombuffer(chunk, np.uint8)
                done += len(chunk)
            f.read(1)  # reaching the end makes zipfile check the CRC
    except _READ_ERRORS as e:
        raise ValueError(f"{path}: the data of {info.filename!r} cannot be read ({type(e).__name__}: {e}); "
                         "is the file truncated?") from e
    return arrays.decoded(out.T if fortran else out)

"""The arrays that checkpoint readers accept (dtypes, shapes), and how stored bytes become numpy
arrays.

Weights are floats: float16, float32 and float64 keep their dtype; bfloat16, which numpy lacks,
is stored as safetensors "BF16" or, by big_vision and Flax, as the 2-byte void dtype `V2` of an
`.npy`, and is returned as float32 (exact: bfloat16 is the top half of a float32), so that every
numpy and scipy routine downstream works on it. Integer and bool arrays (step counters in
optimizer states) are accepted and returned as stored. Anything else (objects, strings,
structured or complex dtypes) is refused: nothing is unpickled.
"""

import ml_dtypes
import numpy as np

_KINDS = "fiub"  # float, signed and unsigned integer, bool


def checked_shape(shape, limit, where):
    """`shape` as a tuple of ints if each dimension is a non-negative int of at most `limit`
    (the bytes that hold the array, a bound even for arrays with a zero dimension)."""
    if not isinstance(shape, (list, tuple)) or not all(type(d) is int and 0 <= d <= max(limit, 1) for d in shape):
        raise ValueError(f"{where} declares shape {str(shape)[:200]}, which is not a list of non-negative ints "
                         f"that fit in the {limit} bytes holding it; the file is corrupt or hostile")
    return tuple(shape)


def checked_dtype(dtype, where):
    """`dtype` if a checkpoint may hold it, else a ValueError naming it and `where` it was found."""
    dtype = np.dtype(dtype)
    if dtype.kind in _KINDS and dtype.fields is None and dtype.subdtype is None:
        return dtype
    if dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None:
        return dtype  # bfloat16, as big_vision writes it
    raise ValueError(f"{where} has dtype {dtype.str!r}; checkpoints hold float, integer or bool arrays "
                     "(and bfloat16 as 2-byte void), never objects, strings or records")


def decoded(array):
    """`array` in native byte order, with bfloat16 (`V2`) decoded to float32."""
    if array.dtype.kind == "V":
        return array.view(ml_dtypes.bfloat16).astype(np.float32)
    if not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    return array


"""The arrays that checkpoint readers accept, how stored bytes become numpy arrays, and the strict
checks of what a file holds (`check_tensors`, `check_finite`).

float16, float32 and float64 keep their dtype; bfloat16 (safetensors "BF16", or the 2-byte void
`V2` that big_vision and Flax write into an `.npy`) becomes float32, exactly, which numpy and scipy
work on. Integer and bool arrays (step counters) are returned as stored. Objects, strings,
structured and complex dtypes are refused: nothing is unpickled.
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



def check_tensors(found, expected, source):
    """Raises one ValueError naming every missing, unexpected and mis-shaped tensor of `found`
    against `expected` (both {name: shape}); `source` names the file."""
    problems = [f"missing {k} {tuple(s)}" for k, s in expected.items() if k not in found]
    problems += [f"unexpected {k} {tuple(s)}" for k, s in found.items() if k not in expected]
    problems += [f"wrong shape {k}: {tuple(found[k])}, expected {tuple(s)}"
                 for k, s in expected.items() if k in found and tuple(found[k]) != tuple(s)]
    if problems:
        raise ValueError(f"{source} does not match a ViT layout; nothing was loaded:\n  " + "\n  ".join(problems))


def check_finite(tensors):
    """Raises one ValueError naming every tensor that holds NaN or Inf (a broken or tampered
    file: the model would only ever output NaN)."""
    # min and max propagate NaN and reach +-Inf, and unlike np.isfinite allocate nothing.
    bad = [f"{k} ({int(np.isnan(v).sum())} NaN, {int(np.isinf(v).sum())} Inf)" for k, v in tensors.items()
           if v.dtype.kind == "f" and v.size and not (np.isfinite(v.min()) and np.isfinite(v.max()))]
    if bad:
        raise ValueError("the checkpoint has non-finite weights; nothing was loaded:\n  " + "\n  ".join(bad)
                         + "\npass allow_nonfinite=True to load it anyway")

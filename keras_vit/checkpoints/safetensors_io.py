"""Reading and writing `.safetensors` files as numpy arrays, with clear errors.

safetensors is a flat header of names, dtypes and offsets followed by raw bytes: loading it runs
no code, unlike a pickled `.pth` / `.bin`.
"""

import numpy as np
import safetensors
import safetensors.numpy


def read(path):
    """Returns ({name: float array}, metadata dict) from a `.safetensors` file."""
    try:
        with safetensors.safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
            names = list(f.keys())
        tensors = _load(path, names)
    except (safetensors.SafetensorError, OSError, ValueError, TypeError) as e:
        raise ValueError(f"{path} is not a readable .safetensors file ({type(e).__name__}: {e}); "
                         "is it truncated or not a checkpoint?") from e
    return tensors, metadata


def _load(path, names):
    try:
        return safetensors.numpy.load_file(str(path))
    except (TypeError, ValueError) as e:
        # numpy has no bfloat16; torch (an optional dependency) reads it and upcasts.
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ValueError(f"{path} stores a dtype numpy cannot read ({e}); install torch to read it") from e
        with safetensors.safe_open(str(path), framework="pt") as f:
            return {n: f.get_tensor(n).float().numpy() for n in names}


def write(path, tensors, metadata):
    """Writes {name: array} with string metadata."""
    safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata)

"""NaFlex patch sequences: an image as the sequence of its P x P patches at its own aspect ratio,
scaled to a token budget and padded to it (NaViT, Dehghani et al., 2023; FlexiViT; SigLIP 2), in
the form of timm's `NaFlexVit`: a dict of

- "patches" (B, L, P * P * C): each patch's pixels, normalized as the model expects, flattened
  row, column, channel (timm's `patchify_image(channels_last=True)`); zeros for padding;
- "patch_coord" (B, L, 2) int: each patch's (row, column) on its image's patch grid; zeros for padding;
- "patch_valid" (B, L) bool: True for an image's patches, False for the padding after them.

A `ViT` takes this dict as well as images: the padding is masked in attention and pooling, and
each image gets the position embedding of its own grid. `patch_sequences` (NumPy, for serving)
and `patch_sequence` (TensorFlow, for a tf.data map) build it from images; both resize with the
same antialiased bicubic filter (Pillow's; `resample_matrix(..., "bicubic")`).

Shapes: B batch, L sequence length (the budget `max_seq_len`), P patch size, C channels,
(h, w) an image's patch grid, n = h * w its patches.
"""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.resample import resample_matrix

KEYS = ("patches", "patch_coord", "patch_valid")


def is_patch_sequence(inputs):
    """Whether a model input is the dict form (rather than images)."""
    return isinstance(inputs, dict)


def check_budget(max_seq_len):
    """Raises a ValueError unless `max_seq_len` is a token budget of at least one patch."""
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, (int, np.integer)) or max_seq_len < 1:
        raise ValueError(f"max_seq_len={max_seq_len!r} is smaller than one patch; the token budget is a number "
                         "of patches, an int >= 1")
    return int(max_seq_len)


def budget_grid(height, width, patch_size, max_seq_len):
    """(h, w): the patch grid of an image of `height` x `width` pixels scaled by the largest factor r
    whose grid (ceil(r H / P), ceil(r W / P)) holds at most `max_seq_len` patches, as timm's
    `get_image_size_for_seq` (which searches r by bisection). The grid changes only where r H / P or
    r W / P is an integer k, so the best r is one of k P / H and k P / W, k = 1 .. max_seq_len:
    all are tried at once, in integers."""
    budget = check_budget(max_seq_len)
    if height < 1 or width < 1:
        raise ValueError(f"an image of {height} x {width} pixels has no patch; it needs at least one pixel")
    k = np.arange(1, budget + 1, dtype=np.int64)
    # r = k / H: grid (k, ceil(W k / H)); r = k / W: grid (ceil(H k / W), k).
    rows = np.concatenate([k, -(-height * k // width)])
    cols = np.concatenate([-(-width * k // height), k])
    scale = np.concatenate([k * width, k * height])  # r * H * W, to compare the two families in integers
    fits = rows * cols <= budget
    best = np.argmax(np.where(fits, scale, -1))
    return int(rows[best]), int(cols[best])


def resize_to_budget(image, patch_size, max_seq_len):
    """An image (H, W, C) in [0, 255] -> (h P, w P, C) float32 at its `budget_grid`, resized with the
    antialiased bicubic filter and clipped to [0, 255] as an 8-bit resize would be."""
    image = np.asarray(image, np.float32)
    h, w = budget_grid(image.shape[0], image.shape[1], patch_size, max_seq_len)
    rows = resample_matrix(image.shape[0], h * patch_size, "bicubic").astype(np.float32)  # (h P, H)
    cols = resample_matrix(image.shape[1], w * patch_size, "bicubic").astype(np.float32)  # (w P, W)
    out = np.einsum("iy,yxc,jx->ijc", rows, image, cols)  # (H, W, C) -> (h P, w P, C)
    return np.clip(out, 0.0, 255.0)


def patchify(image, patch_size):
    """(h P, w P, C) -> patches (n, P * P * C), row by row, and their coordinates (n, 2)."""
    (hp, wp, c), p = image.shape, patch_size
    h, w = hp // p, wp // p
    patches = image.reshape(h, p, w, p, c).transpose(0, 2, 1, 3, 4).reshape(h * w, p * p * c)  # (h, w, P, P, C)
    coord = np.stack(np.meshgrid(np.arange(h), np.arange(w), indexing="ij"), axis=-1).reshape(-1, 2)
    return patches, coord.astype(np.int32)


def patch_sequences(images, patch_size, max_seq_len, mean=0.5, std=0.5, normalize=True):
    """Images of any sizes -> the dict of a batch of patch sequences (see the module doc), in NumPy.

    Args:
        images: a list of arrays (H, W, C) with pixels in [0, 255], each its own size.
        patch_size: P.
        max_seq_len: L, the token budget: each image is scaled to the largest size within it that
            keeps its aspect ratio (`budget_grid`), and its sequence padded to L.
        mean: the model's `image_mean`, on pixels in [0, 1] (`ViT.normalize`).
        std: the model's `image_std`, likewise.
        normalize: False leaves the patches as resized pixels in [0, 255] (float32), the input of
            an exported artifact (`keras_vit.export`), which normalizes them itself.
    """
    budget = check_budget(max_seq_len)
    return pack([resize_to_budget(image, patch_size, budget) for image in images], patch_size, budget, mean, std,
                normalize)


def pack(images, patch_size, max_seq_len, mean=0.5, std=0.5, normalize=True):
    """`patch_sequences` of images already at their grid, each (h P, w P, C) in [0, 255] as
    `resize_to_budget` gives them: cut into patches, normalized, padded to `max_seq_len`."""
    budget = check_budget(max_seq_len)
    out = {k: [] for k in KEYS}
    for pixels in images:
        (hp, wp), p = pixels.shape[:2], patch_size
        if hp % p or wp % p or (hp // p) * (wp // p) > budget:
            raise ValueError(f"an image of {hp} x {wp} pixels is not a grid of {p} px patches within "
                             f"max_seq_len={budget}; resize it with resize_to_budget first")
        if normalize:
            pixels = (pixels / 255.0 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        patches, coord = patchify(np.asarray(pixels, np.float32), patch_size)
        n = len(patches)
        out["patches"].append(np.pad(patches, [(0, budget - n), (0, 0)]))
        out["patch_coord"].append(np.pad(coord, [(0, budget - n), (0, 0)]))
        out["patch_valid"].append(np.arange(budget) < n)
    return {k: np.stack(v) for k, v in out.items()}


def patch_sequence(image, patch_size, max_seq_len, mean=0.5, std=0.5):
    """One image (H, W, C) in [0, 255], a TensorFlow tensor of any size -> its patch sequence padded
    to `max_seq_len`, a dict of tensors (L, P * P * C), (L, 2), (L,), for a `tf.data` map; the
    same values as `patch_sequences` (the grid from `budget_grid`, TensorFlow's antialiased bicubic
    resize, which is the same filter)."""
    import tensorflow as tf

    budget, p = check_budget(max_seq_len), patch_size
    c = image.shape[-1]
    shape = tf.shape(image)
    grid = tf.numpy_function(lambda hh, ww: np.asarray(budget_grid(int(hh), int(ww), p, budget), np.int32),
                             [shape[0], shape[1]], tf.int32, stateful=False)
    h, w = grid[0], grid[1]
    pixels = tf.image.resize(tf.cast(image, tf.float32), tf.stack([h * p, w * p]), method="bicubic", antialias=True)
    mean, std = tf.constant(mean, tf.float32), tf.constant(std, tf.float32)
    pixels = (tf.clip_by_value(pixels, 0.0, 255.0) / 255.0 - mean) / std
    patches = tf.transpose(tf.reshape(pixels, tf.stack([h, p, w, p, c])), (0, 2, 1, 3, 4))  # -> (h, w, P, P, C)
    patches = tf.reshape(patches, (-1, p * p * c))  # (n, P P C)
    rows, cols = tf.meshgrid(tf.range(h), tf.range(w), indexing="ij")
    coord = tf.reshape(tf.stack([rows, cols], axis=-1), (-1, 2))
    n = h * w
    out = {"patches": tf.pad(patches, [[0, budget - n], [0, 0]]),
           "patch_coord": tf.pad(coord, [[0, budget - n], [0, 0]]),
           "patch_valid": tf.range(budget) < n}
    for key, tail in zip(KEYS, ((p * p * c,), (2,), ())):
        out[key] = tf.ensure_shape(out[key], (budget, *tail))
    return out


def check_shapes(inputs, patch_size, num_channels):
    """Raises a ValueError, in one line, unless `inputs` is the dict of patch sequences that a model
    of `patch_size` and `num_channels` takes; returns its three tensors."""
    if set(inputs) != set(KEYS):
        raise ValueError(f"patch sequences are a dict with the keys {KEYS}; got the keys {sorted(inputs)}")
    patches, coord, valid = (inputs[k] for k in KEYS)
    width = patch_size * patch_size * num_channels
    shapes = {k: tuple(inputs[k].shape) for k in KEYS}
    if len(shapes["patches"]) != 3 or shapes["patches"][-1] not in (None, width):
        raise ValueError(f"patches have shape {shapes['patches']}, but this model takes (B, L, {width}): "
                         f"P * P * C = {patch_size} * {patch_size} * {num_channels} values per patch")
    if len(shapes["patch_coord"]) != 3 or shapes["patch_coord"][-1] not in (None, 2):
        raise ValueError(f"patch_coord has shape {shapes['patch_coord']}; it is (B, L, 2), each patch's (row, column)")
    if len(shapes["patch_valid"]) != 2:
        raise ValueError(f"patch_valid has shape {shapes['patch_valid']}; it is (B, L), True for each real patch")
    for axis, name in ((0, "B"), (1, "L")):
        if len({s[axis] for s in shapes.values() if s[axis] is not None}) > 1:
            raise ValueError(f"patches, patch_coord and patch_valid disagree on {name}: shapes {shapes}")
    return patches, coord, valid


def check_values(coord, valid):
    """Raises a ValueError, in one line, for an image without a valid token, or whose valid tokens'
    coordinates are not the cells of one grid: the valid tokens of an image are the patches of
    its (h, w) grid, one each, so its coordinates run over 0 .. h - 1 and 0 .. w - 1 (NumPy
    arrays (B, L, 2) and (B, L))."""
    valid = np.asarray(valid).astype(bool)
    coord = np.asarray(coord)
    for b, (c, v) in enumerate(zip(coord, valid)):
        if not v.any():
            raise ValueError(f"patch_valid of image {b} has no valid token; every image needs at least one patch")
        if c[v].min() < 0:
            raise ValueError(f"patch_coord of image {b} holds {int(c[v].min())}; coordinates are (row, column) "
                             "on the image's patch grid, from 0")
        (h, w), n = c[v].max(axis=0) + 1, int(v.sum())
        if h * w != n or len(np.unique(c[v][:, 0] * w + c[v][:, 1])) != n:
            raise ValueError(f"patch_coord of image {b} reaches row {h - 1}, column {w - 1}, a {h} x {w} grid of "
                             f"{h * w} patches, but the image has {n} valid tokens; an image's valid tokens are the "
                             "patches of its grid, one each")


def concrete(x):
    """`x` as a NumPy array when its values are known (an eager call), else None (inside a traced
    or compiled function, or a symbolic Keras tensor), where values cannot be checked."""
    if isinstance(x, np.ndarray):
        return x
    from keras.src.backend.common import symbolic_scope  # private: keras_vit.upstream

    if isinstance(x, keras.KerasTensor) or symbolic_scope.in_symbolic_scope():  # shapes inferred on placeholders
        return None
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        if isinstance(x, jax.core.Tracer):
            return None
    elif backend == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly() or tf.is_symbolic_tensor(x):
            return None
    elif backend == "torch":
        import torch

        if torch.compiler.is_compiling():
            return None
    return np.asarray(ops.convert_to_numpy(x))


def grids(coord, valid):
    """(B, 2) int32: each image's patch grid (h, w), one more than its valid tokens' largest
    coordinates."""
    coord = ops.where(ops.expand_dims(ops.cast(valid, "bool"), -1), ops.cast(coord, "int32"), 0)
    return ops.max(coord, axis=1) + 1  # (B, L, 2) -> (B, 2)


def token_mask(valid, num_prefix_tokens):
    """(B, R + L) bool: the prefix tokens and the valid patches, from `patch_valid` (B, L)."""
    valid = ops.cast(valid, "bool")
    if not num_prefix_tokens:
        return valid
    prefix = ops.repeat(ops.ones_like(valid[:, :1]), num_prefix_tokens, axis=1)  # (B, R)
    return ops.concatenate([prefix, valid], axis=1)


def token_grids(values, patch_coord, patch_valid):
    """Per-token values of a batch of patch sequences (B, L, ...) -> a list of B NumPy arrays
    (h_b, w_b, ...), each on its own image's patch grid (the explanations' maps of patch
    sequences)."""
    values, coord, valid = (np.asarray(ops.convert_to_numpy(v)) for v in (values, patch_coord, patch_valid))
    out = []
    for v, c, m in zip(values, coord, valid.astype(bool)):
        h, w = c[m].max(axis=0) + 1
        grid = np.zeros((h, w, *v.shape[1:]), v.dtype)
        grid[c[m, 0], c[m, 1]] = v[m]
        out.append(grid)
    return out

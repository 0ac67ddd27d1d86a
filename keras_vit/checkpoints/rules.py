"""A checkpoint format as a table of rules, and the one interpreter of those tables.

A format is a list of `Rule(model, file, layout)`: a pattern over a built `ViT`'s variable paths,
the name in the file (None: not stored, as a sin-cos table), and the array's layout there.
Placeholders: `{i}` a number (`{i-1}` in `file`: one lower), `{n:fc1|fc2}` one of the words,
`{w:gamma=weight}` a word the file spells otherwise. One of `model` that `file` lacks joins the
variables it tells apart, in the order listed: concatenated (timm's fused qkv) or, with
`stack=True`, stacked on a new first axis (big_vision's scan-stacked blocks). The model is the
only description of the structure: `keras_vit.models.variable_shapes` builds it without memory
and keys its variables by path ("encoder/norm/gamma"); `plan` places each by the first rule that
matches, and reading and writing walk that plan in the two directions.

Shapes: C channels, D width, K heads, Dh = D / K, N patches, R prefix rows (class and registers).
"""

import functools
import json
import math
import re
from collections import namedtuple

import numpy as np

from keras_vit.layers import ResNetStem
from keras_vit.models.resize import weights


# How a variable's array is laid out in a file: `to_file(x)`, and its inverse `to_model(y, shape)`
# given the variable's shape. Both return numpy views where the layout allows.
Layout = namedtuple("Layout", "to_file to_model")


def reshape(shape_of):
    """The same values under the shape `shape_of(variable shape)`: (K, Dh) <-> (K * Dh,),
    GroupNorm (C,) <-> (1, 1, 1, C), a position table (1, N, D) <-> (N, D)."""
    return Layout(lambda x: x.reshape(shape_of(x.shape)), lambda y, s: y.reshape(s))


def linear_layout(inputs=1):
    """A Dense or EinsumDense kernel with `inputs` input axes <-> a PyTorch Linear weight (out, in):
    (D, K, Dh) <-> (K * Dh, D) with inputs=1, (K, Dh, D) <-> (D, K * Dh) with inputs=2."""
    return Layout(lambda x: x.reshape(math.prod(x.shape[:inputs]), -1).T, lambda y, s: y.T.reshape(s))


def positions(stored, prefix):
    """The position table (1, R + N, D) <-> one that keeps only its first `stored` of R prefix rows:
    big_vision and timm's no_embed_class give the class token no position, DINOv2 none to its
    registers. The rows not stored are zero, which adds nothing."""
    return Layout(lambda x: np.concatenate([x[:, :stored], x[:, prefix:]], axis=1),
                  lambda y, s: np.concatenate([y[:, :stored], np.zeros((1, prefix - stored, s[2]), y.dtype),
                                               y[:, stored:]], axis=1))


COPY, FLAT, LINEAR = reshape(tuple), reshape(lambda s: (-1,)), linear_layout()
# (kh, kw, C, D) <-> (D, C, kh, kw)
CONV = Layout(lambda x: x.transpose(3, 2, 0, 1), lambda y, s: y.transpose(2, 3, 1, 0))


def file_shape(layout, shape):
    """The shape in the file of a variable of `shape`: its layout applied to a zero-stride array,
    which takes no memory."""
    return layout.to_file(np.broadcast_to(np.float32(0), shape)).shape


# A norm's scale and offset, as Flax and PyTorch name them.
FLAX_NORM, TORCH_NORM = "{w:gamma=scale|beta=bias}", "{w:gamma=weight|beta=bias}"
_PLACEHOLDER = re.compile(r"\{(\w+)(?::([^}]*))?\}")  # {i}, {n:fc1|fc2}, {w:gamma=weight|beta=bias}
_FILE_PLACEHOLDER = re.compile(r"\{(\w+?)([+-]\d+)?\}")  # {i}, {i-1}


@functools.lru_cache(maxsize=None)
def _compile(pattern):
    """(regex, {placeholder: {word: word in the file}}) of a model pattern; numbers have {}."""
    words = {}

    def group(m):
        options = [o.partition("=") for o in m.group(2).split("|")] if m.group(2) else []
        words[m.group(1)] = {a: b or a for a, _, b in options}
        return f"(?P<{m.group(1)}>{'|'.join(a for a, _, _ in options) or '[0-9]+'})"

    return re.compile(_PLACEHOLDER.sub(group, pattern)), words


class Rule(namedtuple("Rule", "model file layout stack", defaults=(COPY, False))):
    """One line of a format's table; see the module doc."""

    def match(self, path):
        """(file name, order among the variables it joins) if `path` matches, else None."""
        regex, words = _compile(self.model)
        found = regex.fullmatch(path)
        if found is None or self.file is None:
            return None if found is None else (None, ())

        def fill(m):
            value = found[m.group(1)]
            return str(int(value) + int(m.group(2))) if m.group(2) else words[m.group(1)].get(value, value)

        named = {m.group(1) for m in _FILE_PLACEHOLDER.finditer(self.file)}
        order = tuple(list(words[k]).index(found[k]) if words[k] else int(found[k]) for k in words if k not in named)
        return _FILE_PLACEHOLDER.sub(fill, self.file), order


def plan(rules, shapes, what="this format"):
    """{file name: (rule, [(path, shape), ...])}: each variable of `shapes` ({path: shape}) placed by
    the first rule that matches it; the variables a tensor joins come in their order."""
    placed, unplaced = {}, []
    for path, shape in shapes.items():
        hit = next(((rule, m) for rule in rules for m in [rule.match(path)] if m), None)
        if hit is None:
            unplaced.append(path)
            continue
        rule, (name, order) = hit
        if rule.file is None:
            continue  # not stored: a sin-cos table is computed
        placed.setdefault(name, (rule, []))[1].append((order, path, shape))
    if unplaced:
        raise ValueError(f"{what} cannot hold the model's weights {unplaced}")
    return {name: (rule, [(p, s) for _, p, s in sorted(parts)]) for name, (rule, parts) in placed.items()}


def expected(plan):
    """{file name: shape} of the tensors that `plan` reads or writes."""
    out = {}
    for name, (rule, parts) in plan.items():
        shapes = [file_shape(rule.layout, s) for _, s in parts]
        # Stacked: (L, ...). Concatenated ([q; k; v], or one tensor alone): on the first axis.
        out[name] = (len(shapes), *shapes[0]) if rule.stack else (sum(s[0] for s in shapes), *shapes[0][1:])
    return out


def to_model(plan, tensors):
    """{path: array} of the model from the file's `tensors` ({file name: array})."""
    out = {}
    for name, (rule, parts) in plan.items():
        ends = np.cumsum([file_shape(rule.layout, s)[0] for _, s in parts])[:-1]
        pieces = list(tensors[name]) if rule.stack else np.split(tensors[name], ends)  # (L, ...) or (3D, ...)
        out.update({path: rule.layout.to_model(piece, s) for (path, s), piece in zip(parts, pieces)})
    return out


def to_file(plan, values):
    """{file name: array} from the model's `values` ({path: array}); the inverse of `to_model`."""
    out = {}
    for name, (rule, parts) in plan.items():
        pieces = [rule.layout.to_file(values[path]) for path, _ in parts]
        out[name] = np.stack(pieces) if rule.stack else pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return out


def tensors(table, model, what="this format", values=None):
    """{file name: float32 array} of `model`'s weights (or of `values`, {path: array} of its
    variables) laid out by the rules `table`."""
    values = weights(model) if values is None else values
    placed = plan(table, {k: v.shape for k, v in values.items()}, what)
    return {k: np.asarray(v, "float32") for k, v in to_file(placed, values).items()}


def linear(model, file, inputs=1):
    """The rules of a Dense `model` stored as a PyTorch Linear `file` (".weight" and ".bias")."""
    return [Rule(model + "/kernel", file + ".weight", linear_layout(inputs)),
            Rule(model + "/bias", file + ".bias", FLAT)]


# What a format makes of a file: the model's `ViT` arguments, the rules of its tensors,
# `scope(name)`, whether a name of the file belongs to that model (None: all do), and the
# `image_size` the model takes when not that of the file's position table, to which the table is
# resampled (None: the same; keras-hub's DINOv2 states both).
Source = namedtuple("Source", "config rules scope image_size", defaults=(None, None))


def cell(patch_size, stem_layers=None):
    """The side in pixels of one token: the patch size, times a hybrid's ResNet stride."""
    return patch_size * (1 if stem_layers is None else ResNetStem(stem_layers).stride)


def size_grid(size, cell):
    """The (h, w) token grid of the input size `size` (an int, (H, W) or None)."""
    if size is None:
        return None
    size = (size, size) if isinstance(size, int) else tuple(size)
    return (size[0] // cell, size[1] // cell)


def table_grid(rows, grid=None):
    """The (h, w) grid of a position table of `rows` patch rows: `grid` when known (it must
    fit), else the square one. A table alone does not say the shape of a non-square grid."""
    if grid is not None:
        if grid[0] * grid[1] != rows:
            raise ValueError(f"the checkpoint's position table has {rows} patch rows, not grid {tuple(grid)}")
        return tuple(grid)
    side = math.isqrt(rows)
    if side * side != rows:
        raise ValueError(f"the checkpoint's position table has {rows} patch rows, which is not a square grid; "
                         "pass source_image_size=(H, W), the resolution it was trained at")
    return (side, side)


def count(names, pattern):
    """How many different numbers `pattern`'s group takes over `names` (layers in a file)."""
    return len({m[1] for m in map(re.compile(pattern).match, names) if m})


def stem_layers(names, pattern, first=1):
    """Units per stage of a hybrid's ResNet, from the names matching `pattern` (groups: stage and
    unit, counted from `first`); None without a stem."""
    units = {}
    for m in filter(None, map(re.compile(pattern).match, names)):
        units[int(m[1])] = max(units.get(int(m[1]), 0), int(m[2]) + 1 - first)
    return tuple(units[s] for s in sorted(units)) or None


# The key under which `save_checkpoint` stores the model's `get_config()` (timm metadata, config.json).
SAVED = "keras_vit"


def saved_config(value):
    """The `ViT` arguments that `save_checkpoint` stored, as JSON text or its dict (lists back to
    tuples); {} for None."""
    value = json.loads(value) if isinstance(value, str) else value or {}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}


def with_saved(model, value, keys=("hidden_dim", "num_layers", "num_classes", "patch_size")):
    """`model`, the arguments read from a file's tensors and configs, updated with those that
    `save_checkpoint` stored (`value`, see `saved_config`); the stored ones are dropped when they
    disagree with the tensors on one of `keys`: the weights changed after keras_vit wrote the file."""
    saved = saved_config(value)
    if any(saved.get(k, model[k]) != model[k] for k in keys):
        return model
    return {**model, **saved}


def refuse(config, cannot_hold, writer):
    """Raises one ValueError naming each argument of `config` that `writer` cannot hold;
    `cannot_hold` is {argument: (the one value it can hold, or a frozenset of those, why)}."""
    bad = [f"{k}={config[k]!r} ({why})" for k, (ok, why) in cannot_hold.items()
           if config[k] not in (ok if isinstance(ok, frozenset) else (ok,))]
    if bad:
        raise ValueError(f"the {writer} writer does not support {'; '.join(bad)}")

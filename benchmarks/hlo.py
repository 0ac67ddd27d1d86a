"""What an XLA operation is, from a module's HLO text: its kind, dtype and the Keras layer of its `op_name`.

`parse_hlo` reads the text that XLA dumps (`--xla_dump_to` with `--xla_dump_hlo_as_text`) or that
`jax.jit(f).lower(...).compile().as_text()` returns. `kind` says what an operation computes (a
product and the library that runs it, a reduce, elementwise, transpose/copy, convert), and
`describe` where it is in the model: "bwd block_1/fc2: dot_general" from the `op_name` metadata
that JAX writes from Keras' name scopes (fwd: forward, bwd: backward).
"""

import collections
import re

# Opcodes that only move or relabel data.
MOVES = {"parameter", "bitcast", "reshape", "transpose", "copy", "broadcast", "slice", "concatenate", "pad",
         "dynamic-slice", "dynamic-update-slice", "tuple", "get-tuple-element", "constant", "iota"}
LIBRARIES = {"__ynn_fusion": "YNNPACK", "__xnn_fusion": "XNNPACK", "__onednn_fusion": "oneDNN"}

_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^=]*?\)|\S+) ([a-z][\w\-]*)\((.*)$")


def parse_hlo(text):
    """{instruction name: dict(opcode, dtype, operands, calls, fusion, op_name, computation)} of an HLO
    module's text, and under the key None: {computation name: [its instruction names]}."""
    out, computations, current = {}, {}, None
    for line in text.splitlines():
        head = _COMPUTATION.match(line)
        if head and " = " not in line.split("(")[0]:
            current = head.group(1)
            computations[current] = []
            continue
        m = _INSTRUCTION.match(line)
        if not m or current is None:
            continue
        name, shape, opcode, rest = m.groups()
        args = rest.split(")")[0]
        calls = re.search(r"calls=%([\w.\-]+)", rest)
        library = re.search(r'"kind":"(__\w+)"', rest)
        op_name = re.search(r'op_name="([^"]*)"', rest)
        out[name] = dict(opcode=opcode, dtype=re.match(r"\(?(\w+)", shape).group(1),
                         operands=re.findall(r"%([\w.\-]+)", args), calls=calls and calls.group(1),
                         fusion=library.group(1) if library else (re.search(r"kind=(k\w+)", rest) or [None, None])[1],
                         op_name=op_name and op_name.group(1).split(";")[0], computation=current)
        computations[current].append(name)
    out[None] = computations
    return out


def dot_dtypes(hlo):
    """Counter of the first operand's dtype over the module's dots and convolutions."""
    return collections.Counter(hlo[h["operands"][0]]["dtype"] for n, h in hlo.items()
                               if n and h["opcode"] in ("dot", "convolution") and h["operands"][0] in hlo)


def _inside(hlo, name):
    """The instructions that op `name` runs: itself, or those of its fused computation, recursively."""
    calls = hlo[name]["calls"]
    if not calls:
        return [name]
    return [n for inner in hlo[None].get(calls, []) for n in _inside(hlo, inner)]


def kind(hlo, name):
    """What the op computes: "dot f32 (YNNPACK)", "dot bf16 (in kLoop fusion)", "reduce", "elementwise",
    "transpose/copy" or "convert"; a fusion with converts in it says "+ convert"."""
    inner = _inside(hlo, name)
    opcodes = {hlo[n]["opcode"] for n in inner}
    dots = [n for n in inner if hlo[n]["opcode"] in ("dot", "convolution")]
    if dots:
        operand = hlo[dots[0]]["operands"][0]
        dtype = hlo[operand]["dtype"] if operand in hlo else hlo[dots[0]]["dtype"]
        fusion = hlo[name]["fusion"]
        where = LIBRARIES.get(fusion) or (f"in {fusion} fusion" if fusion else "Eigen")
        return f"{hlo[dots[0]]['opcode']} {dtype} ({where})"
    if opcodes & {"reduce", "reduce-window"}:
        base = "reduce"
    elif opcodes <= MOVES:
        base = "transpose/copy"
    elif opcodes <= MOVES | {"convert"}:
        return "convert"
    else:
        base = "elementwise"
    return base + (" + convert" if "convert" in opcodes else "")


def _phase_and_path(op_name):
    """("bwd", "block_1/fc2", "dot_general") from "jit(train_step)/transpose(jvp(encoder))/block_1/fc2/dot_general"."""
    parts = op_name.split("/")
    if re.match(r"^p?jit\(", parts[0]) and len(parts) > 1:
        parts = parts[1:]
    phase = "bwd" if "transpose(" in op_name else "fwd" if "jvp(" in op_name else ""
    clean = []
    for part in parts:
        while (m := re.match(r"^(?:transpose|jvp|vmap|p?jit|checkpoint|remat)\((.*)\)$", part)):
            part = m.group(1)
        if part and part != "encoder":
            clean.append(part)
    return phase, "/".join(clean[:-1]), clean[-1] if clean else ""


def describe(hlo, name):
    """Where op `name` is in the model: its phase, the Keras layer path of its root (or of most of its
    instructions) and its primitives, e.g. "bwd block_1/norm2: mul, reduce_sum, sub"."""
    named = [hlo[n]["op_name"] for n in [name, *_inside(hlo, name)] if hlo[n]["op_name"]]
    if not named:
        return "(no op_name: made by XLA)"
    parsed = [_phase_and_path(o) for o in named]
    phase, path, _ = parsed[0] if hlo[name]["op_name"] else collections.Counter(
        (p, q, "") for p, q, _ in parsed).most_common(1)[0][0]
    prims = [p for p, _ in collections.Counter(prim for _, _, prim in parsed[1:] or parsed).most_common(4)]
    return f"{phase} {path}: {', '.join(prims)}".strip()

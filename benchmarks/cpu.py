"""The CPU a benchmark ran on, from `lscpu`: its model name and flags (AMX, AVX-512 BF16 decide
which serving precisions are fast), so that every recorded figure names its machine; and how a
benchmark hands over its JSON record and its tables in the docs."""

import json
import subprocess

# The flags that decide which kernels the runtimes pick on x86.
KEY_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")


def cpu_info():
    """{"model": lscpu's model name, "cores": CPUs, "flags": every flag, "key_flags": those of KEY_FLAGS}."""
    fields = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = fields.get("Flags", "").split()
    return {"model": fields.get("Model name"), "cores": fields.get("CPU(s)"), "flags": flags,
            "key_flags": [f for f in KEY_FLAGS if f in flags]}


def emit(result, out=None):
    """Prints `result` as one line of JSON, and writes that line to `out` when given."""
    text = json.dumps(result)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def replace_block(path, begin, end, block):
    """Replaces the text from the marker `begin` to the marker `end` of the page `path` with `block`
    (which starts with `begin` and ends with `end`)."""
    with open(path) as f:
        text = f.read()
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"{path} must hold {begin} and {end} once each")
    head, rest = text.split(begin)
    with open(path, "w") as f:
        f.write(head + block + rest.split(end)[1])

"""The integrity of an Orbax checkpoint's files: a checksum on every chunk, and which file of a
step holds which array, so that a restore error can name it.

Orbax writes a step's arrays into an OCDBT database (tensorstore's key-value store): each process
appends the chunks of its shards to data files under `pytree/ocdbt.process_N/d/`, and a B-tree
index (its nodes in `pytree/d/`) maps each chunk key, e.g.
"trainable_variables.vit.encoder.block_0.fc1.kernel/c/0/1", to a byte range of one data file.
Tensorstore reports a missing or damaged data file only by the chunk it could not read; walking
the index with `tensorstore.ocdbt.dump` finds the file. `check` runs before a restore reads any
array, so a missing or cut-short file is named before anything is assigned.
"""

import functools
import os
import re

# The exit status of `training.export_checkpoint` refusing a model too big for this host's memory
# (2: a bad argument or checkpoint); here, so that training.checkpointing need not import the CLI.
EXPORT_TOO_BIG = 3
# "...in "KEY" in OCDBT database at local file "...": tensorstore's phrase for a chunk it failed to read.
_CHUNK_IN_ERROR = re.compile(r'"([^"]+)" in OCDBT database')


class CheckpointError(ValueError):
    """An Orbax checkpoint that cannot be restored whole: missing, torn, damaged or not this model's."""


def add_chunk_checksums():
    """Makes Orbax store a CRC-32C checksum with every chunk it writes from now on in this process
    (zarr v3's crc32c codec, after zstd), so that tensorstore verifies each chunk as it reads it.

    Why by hand: Orbax writes chunks with zstd and no checksum, and OCDBT checks only its own
    index, so bytes damaged inside a chunk restore silently as wrong values (in
    tests/training/test_orbax_checkpoints.py a kernel entry came back as 2.5e38). Orbax has no option for the
    chunk codecs, so this wraps the function of Orbax's that builds them; it raises if that
    function is gone (a newer Orbax) rather than writing checkpoints without checksums. The
    checkpoints stay standard zarr v3: any reader applies the codecs their metadata lists."""
    from orbax.checkpoint._src.serialization import tensorstore_utils  # private: keras_vit.upstream

    build = tensorstore_utils.build_zarr_shard_and_chunk_metadata
    if getattr(build, "adds_crc32c", False):
        return

    @functools.wraps(build)  # its signature stays Orbax's, which keras_vit.upstream checks
    def build_with_crc32c(**kwargs):
        metadata = build(**kwargs)
        if kwargs.get("use_zarr3"):  # [{"name": "sharding_indexed", "configuration": {"codecs": [...]}}]
            metadata["codecs"][0]["configuration"]["codecs"].append({"name": "crc32c"})
        return metadata

    build_with_crc32c.adds_crc32c = True
    tensorstore_utils.build_zarr_shard_and_chunk_metadata = build_with_crc32c


def chunk_files(pytree_dir):
    """{chunk key or "index node LOCATION": (data file path, offset, length)} of a local OCDBT
    database: every chunk stored outside the index, and the index nodes themselves."""
    import tensorstore as ts

    store = ts.KvStore.open({"driver": "file", "path": pytree_dir.rstrip("/") + "/"}).result()
    versions = ts.ocdbt.dump(store).result()["versions"]
    pending = [versions[-1]["root"]["location"]] if versions and "location" in versions[-1]["root"] else []
    files = {}
    while pending:
        node = pending.pop()
        files[f"index node {node}"] = _reference(pytree_dir, node)
        for entry in ts.ocdbt.dump(store, node).result().get("entries", []):
            if "indirect_value" in entry:
                files[entry["key"].decode()] = _reference(pytree_dir, entry["indirect_value"])
            # Interior nodes point to their children by "btreenode::" locations.
            pending += [v for v in entry.values() if isinstance(v, str) and v.startswith("btreenode::")]
    return files


def _reference(pytree_dir, location):
    """'value:ocdbt.process_0/:d/NAME:OFFSET:LENGTH' or 'btreenode::d/NAME:OFFSET:LENGTH' ->
    (the data file's path, OFFSET, LENGTH)."""
    head, offset, length = location.rsplit(":", 2)
    _, prefix, name = head.split(":", 2)
    return os.path.join(pytree_dir, prefix, name), int(offset), int(length)


def check(pytree_dir):
    """Raises CheckpointError naming the first data file that is missing or shorter than the
    index says, with an array it holds."""
    for key, (path, offset, length) in sorted(chunk_files(pytree_dir).items(), key=lambda item: item[1]):
        needed = offset + length
        if not os.path.exists(path):
            raise CheckpointError(f"{path} is missing; it holds {_array_of(key)}. Nothing was restored")
        size = os.path.getsize(path)
        if size < needed:
            raise CheckpointError(f"{path} is cut short ({size} bytes; its index needs {needed}); it holds "
                                  f"{_array_of(key)}. Nothing was restored")


def file_of_error(pytree_dir, message):
    """The data file holding the chunk that a tensorstore error message names, or None."""
    match = _CHUNK_IN_ERROR.search(message)
    if match is None:
        return None
    try:
        return chunk_files(pytree_dir).get(match.group(1), (None,))[0]
    except Exception:  # an index too damaged to walk: the caller keeps tensorstore's message
        return None


def _array_of(key):
    """"trainable_variables.vit.fc1.kernel/c/0/1" -> "trainable_variables/vit/fc1/kernel"."""
    if key.startswith("index node"):
        return "part of the index of every array"
    return "part of " + key.split("/", 1)[0].replace(".", "/")

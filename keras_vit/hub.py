"""Pretrained weights by handle: `hf://org/repo[@revision]`, `gs://bucket/object`, `https://...`
and the names of `keras_vit.list_pretrained()`, fetched once into a cache and checked.

- `hf://` files go through `huggingface_hub`: its cache (HF_HOME, HF_HUB_CACHE), resumed downloads,
  HF_ENDPOINT for mirrors, HF_TOKEN for gated repos and HF_HUB_OFFLINE.
- `gs://` objects of Google's public buckets are fetched anonymously over HTTPS from the public
  endpoint, or from STORAGE_EMULATOR_HOST when it is set (the convention of GCS emulators and
  mirrors); these and `https://` files go through `keras.utils.get_file` into
  KERAS_HOME/keras_vit/ (default ~/.keras/keras_vit/).
- HF_HUB_OFFLINE=1 keeps every handle off the network: cached files load, anything else is an error.

Nothing half-downloaded is ever used: huggingface_hub and this module download to a temporary
name and rename once complete, and every fresh file is checked (the Hub's sha256, or the archive's
own structure) before it is read. A file that fails the check is deleted, and the error says so.
"""

import dataclasses
import hashlib
import os
import pathlib
import re
import socket
import urllib.parse
import zipfile

GCS_ENDPOINT = "https://storage.googleapis.com"
URL_TIMEOUT = 30  # seconds a gs:// or https:// download may wait for data before giving up
HF_TIMEOUT = 10  # seconds the Hub may take to answer a file's metadata request
WEIGHT_SUFFIXES = (".npz", ".safetensors")

_HF_REPO = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_REVISION = re.compile(r"[\w.-]+(/[\w.-]+)*")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,221}")


class DownloadError(ConnectionError):
    """A handle's file could not be fetched: no network, offline with nothing cached, a download cut
    short, or a downloaded file that failed its check. The message names the handle, the URL tried,
    and how to fetch the file by hand."""


@dataclasses.dataclass(frozen=True)
class Handle:
    """A parsed handle. `kind` is "hf", "gs" or "url"; `location` is "org/repo", "bucket/object" or
    the URL; `revision` is the Hub branch, tag or commit (None: the default branch)."""

    kind: str
    location: str
    revision: str = None

    def __str__(self):
        prefix = {"hf": "hf://", "gs": "gs://", "url": ""}[self.kind]
        return prefix + self.location + (f"@{self.revision}" if self.revision else "")


def is_handle(source):
    """True for strings that start with hf://, gs://, https:// or http://."""
    return isinstance(source, str) and source.startswith(("hf://", "gs://", "https://", "http://"))


def parse(handle):
    """The `Handle` that `handle` names; a ValueError says what is wrong with a malformed one."""
    if handle.startswith("hf://"):
        repo, _, revision = handle[len("hf://"):].partition("@")
        if not _HF_REPO.fullmatch(repo):
            raise ValueError(f"{handle!r}: the repo must be 'org/name' (hf://org/name[@revision]); to pick a file "
                             "of the repo pass filename=...")
        if revision and not _REVISION.fullmatch(revision):
            raise ValueError(f"{handle!r}: {revision!r} is not a valid revision (a branch, tag or commit hash)")
        return Handle("hf", repo, revision or None)
    if handle.startswith("gs://"):
        bucket, _, name = handle[len("gs://"):].partition("/")
        if not _BUCKET.fullmatch(bucket) or not name or ".." in name.split("/"):
            raise ValueError(f"{handle!r} is not gs://bucket/path/to/object")
        return Handle("gs", f"{bucket}/{name}")
    if handle.startswith(("https://", "http://")):
        parts = urllib.parse.urlsplit(handle)
        if not parts.netloc or not pathlib.PurePosixPath(parts.path).name:
            raise ValueError(f"{handle!r} is not a URL of a file")
        return Handle("url", handle)
    raise ValueError(f"{handle!r} is not a handle; handles start with hf://, gs://, https:// or http://")


def fetch(handle, filename=None):
    """The local path of `handle`'s checkpoint, downloaded first unless it is cached.

    Returns a folder for Hub repos holding a timm or transformers model (config.json and
    model.safetensors side by side, as `load_checkpoint` reads them), else the file.

    Args:
        handle: a string or `Handle`.
        filename: with hf:// only, the file of the repo to load (e.g. one of several `.npz`).
    """
    h = parse(handle) if isinstance(handle, str) else handle
    if filename is not None and h.kind != "hf":
        raise ValueError(f"filename={filename!r} chooses a file of a Hub repo; {h} names one file already")
    if h.kind == "hf":
        from keras_vit import hub_hf  # huggingface_hub is imported only when a Hub handle is used

        return hub_hf.fetch(h, filename)
    url = gcs_url(h.location) if h.kind == "gs" else h.location
    return fetch_url(url, str(h))


def gcs_url(location):
    """The anonymous download URL of gs://`location`, on STORAGE_EMULATOR_HOST when set."""
    host = os.environ.get("STORAGE_EMULATOR_HOST") or GCS_ENDPOINT
    if "://" not in host:
        host = "http://" + host  # emulators are usually given as host:port
    return f"{host.rstrip('/')}/{urllib.parse.quote(location)}"


def offline():
    """HF_HUB_OFFLINE, read when called (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def keras_home():
    """KERAS_HOME, or ~/.keras: where `keras.utils.get_file` keeps its cache."""
    return pathlib.Path(os.environ.get("KERAS_HOME") or pathlib.Path.home() / ".keras")


def fetch_url(url, what):
    """Downloads `url` once into KERAS_HOME/keras_vit/<hash of url>/<its file name>."""
    import keras

    name = pathlib.PurePosixPath(urllib.parse.urlsplit(url).path).name
    if not name.endswith(WEIGHT_SUFFIXES):
        raise ValueError(f"{what}: {name!r} is not a checkpoint file keras_vit reads ({', '.join(WEIGHT_SUFFIXES)}); "
                         "pickled PyTorch files are never loaded")
    subdir = os.path.join("keras_vit", hashlib.sha256(url.encode()).hexdigest()[:16])
    final = keras_home() / subdir / name
    if final.is_file():
        return final  # only complete, checked files ever get this name
    if offline():
        raise DownloadError(f"HF_HUB_OFFLINE is set and {what} is not in the cache ({final}); "
                            f"unset it, or download {url} by hand and pass the file's path")
    final.parent.mkdir(parents=True, exist_ok=True)  # get_file falls back to /tmp/.keras for a missing KERAS_HOME
    part = f"{name}.{os.getpid()}.part"
    # urllib, under get_file, waits forever on a silent server unless a socket timeout is set.
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(URL_TIMEOUT)
    try:
        got = pathlib.Path(keras.utils.get_file(fname=part, origin=url, cache_dir=str(keras_home()),
                                                cache_subdir=subdir))
    except Exception as e:  # get_file raises bare Exceptions for HTTP and URL errors
        raise DownloadError(f"could not download {what} from {url} ({type(e).__name__}: {e}); nothing was kept. "
                            f"Check the network, or download the file by hand (`curl -fLO {url}`) and pass "
                            "its path") from e
    finally:
        socket.setdefaulttimeout(previous)
    try:
        check_complete(got)
    except ValueError as e:
        got.unlink(missing_ok=True)
        raise DownloadError(f"the file downloaded for {what} from {url} is damaged ({e}); it was deleted, "
                            "so the next call downloads it again") from e
    final = got.with_name(name)  # get_file may have used /tmp/.keras when KERAS_HOME is read-only
    os.replace(got, final)
    return final


def check_complete(path):
    """Checks that a downloaded checkpoint is whole, reading its structure only: a `.npz` is a zip
    whose members all pass their CRC; a `.safetensors` file is as long as its header says.
    Raises ValueError naming the problem."""
    path = pathlib.Path(path)
    if path.name.endswith(".npz") or ".npz." in path.name:
        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise ValueError(f"not a complete zip archive: {e}") from e
        if bad is not None:
            raise ValueError(f"member {bad!r} fails its CRC check")
        return
    from keras_vit.checkpoints import safetensors_io  # the checkpoints package imports this module

    safetensors_io.headers(path)  # the header's spans must tile the rest of the file exactly

"""`hf://` handles: files of a Hugging Face Hub repo, through `huggingface_hub`.

A repo with a `config.json` holds the format that `keras_vit.checkpoints.formats.detect` finds from
it (a timm or a transformers model): its weights file and, if present, the side files the format
reads (`preprocessor_config.json`) are fetched. A repo without one holds Google `.npz` files: the
only one, or the one that `filename=` names.
The files land in huggingface_hub's cache; a repo's files share one snapshot folder there, which is
what `keras_vit.load` reads.
"""

import hashlib
import os
import pathlib
import re
import socket
import urllib.parse

import huggingface_hub
from huggingface_hub import errors

from keras_vit.checkpoints import formats
from keras_vit.hub.handles import HF_TIMEOUT, DownloadError, offline

_NOT_FOUND = (errors.EntryNotFoundError, errors.OfflineModeIsEnabled)


def fetch(h, filename=None):
    """The local snapshot folder (or file) of the Hub handle `h`; see `keras_vit.hub.fetch`."""
    # Without a connection, read the cache at once: huggingface_hub retries a refused connection
    # with backoff for about 20 s before it falls back to the cache.
    local = offline() or not reachable(_endpoint())
    if filename is not None:
        if not filename.endswith(formats.FILE_SUFFIXES):
            raise ValueError(f"filename={filename!r}: keras_vit reads {', '.join(formats.FILE_SUFFIXES)} files "
                             "(pickled PyTorch files are never loaded)")
        path = download(h, filename, local)
        if filename.endswith(".safetensors"):
            download(h, "config.json", local, required=False)  # a timm repo's config sits beside its weights
        return path
    config = download(h, "config.json", local, required=False)
    if config is not None:
        fmt, weights, _ = formats.detect(config.parent)
        download(h, weights.name, local, missing=f"{h} is a {fmt.name} repo without {weights.name}; keras_vit "
                 "never loads pickled PyTorch weights (pytorch_model.bin). Convert them to safetensors, or give the "
                 f"URL of another file, {file_url(h, 'FILE')} (in Python, filename='FILE')")
        for name in fmt.side_files:
            download(h, name, local, required=False)
        return config.parent
    return download(h, _only_npz(h, local), local)


def download(h, name, local, required=True, missing=None):
    """Path of file `name` of repo `h` in the cache, downloaded and checked if not there yet (unless
    `local`: then from the cache only). None when `required` is False and the repo (or, when
    `local`, the cache) has no such file."""
    endpoint = _endpoint()
    url = huggingface_hub.hf_hub_url(h.location, name, revision=h.revision, endpoint=endpoint)
    try:
        path = huggingface_hub.hf_hub_download(h.location, name, revision=h.revision, endpoint=endpoint,
                                               local_files_only=local, etag_timeout=HF_TIMEOUT)
    except errors.GatedRepoError as e:
        raise DownloadError(f"{h} is gated: accept its terms on the Hub, then set HF_TOKEN to a token of yours") from e
    except errors.RepositoryNotFoundError as e:
        raise ValueError(f"{h}: no repo {h.location!r} at {endpoint or 'the Hub'} "
                         "(or it is private: set HF_TOKEN)") from e
    except errors.RevisionNotFoundError as e:
        raise ValueError(f"{h}: repo {h.location!r} has no revision {h.revision!r}") from e
    except _NOT_FOUND as e:
        remote_missing = isinstance(e, errors.EntryNotFoundError) and not isinstance(e, errors.LocalEntryNotFoundError)
        if not required and (remote_missing or local):
            return None
        if remote_missing:
            raise ValueError(missing or f"{h}: repo {h.location!r} has no file {name!r}") from e
        raise _unreachable(h, url, e) from e
    except (OSError, huggingface_hub.errors.HfHubHTTPError) as e:
        raise _unreachable(h, url, e) from e
    check_blob(path, f"{h} {name}")
    return pathlib.Path(path)


def _endpoint():
    """HF_ENDPOINT, read now (huggingface_hub reads it once, at import); None for the Hub itself."""
    return os.environ.get("HF_ENDPOINT") or None


def reachable(endpoint, timeout=5.0):
    """Whether a TCP connection to the endpoint's host opens within `timeout` seconds. Behind a
    proxy (HTTPS_PROXY and the like) the answer is left to huggingface_hub: True."""
    if any(os.environ.get(v)
           for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")):
        return True
    parts = urllib.parse.urlsplit(endpoint or huggingface_hub.constants.ENDPOINT)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _unreachable(h, url, e):
    """The error for a file that could not be fetched and is not cached."""
    if offline():
        return DownloadError(f"HF_HUB_OFFLINE is set and {h} is not in the cache "
                             f"({huggingface_hub.constants.HF_HUB_CACHE}); "
                             "unset HF_HUB_OFFLINE to download it")
    if isinstance(e, errors.LocalEntryNotFoundError):
        reason = "no connection"  # `fetch` found the endpoint unreachable and read the cache only
    else:
        reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return DownloadError(
        f"could not download {h} from {url} ({reason}) and nothing is cached. Check the network or HF_ENDPOINT, "
        f"or download the repo by hand (`hf download {h.location} --local-dir DIR`, or each file from its page) "
        "and pass the folder or file path instead of the handle"
    )


def _only_npz(h, local):
    """The repo's one `.npz` file; several need filename=."""
    try:
        if local:
            folder = huggingface_hub.snapshot_download(h.location, revision=h.revision, local_files_only=True)
            names = [p.name for p in pathlib.Path(folder).glob("*.npz")]
        else:
            names = huggingface_hub.HfApi(endpoint=_endpoint()).list_repo_files(h.location, revision=h.revision)
    except errors.RepositoryNotFoundError as e:
        raise ValueError(f"{h}: no repo {h.location!r} (or it is private: set HF_TOKEN)") from e
    except (OSError, errors.HfHubHTTPError) as e:
        raise _unreachable(h, f"{_endpoint() or huggingface_hub.constants.ENDPOINT}/{h.location}", e) from e
    npz = sorted(n for n in names if n.endswith(".npz"))
    if len(npz) == 1:
        return npz[0]
    if not npz:
        raise ValueError(f"{h} has no config.json and no .npz file, so it holds no checkpoint keras_vit reads "
                         f"(files: {sorted(names)[:10]})")
    raise ValueError(f"{h} holds {len(npz)} .npz files, {npz}; give the URL of one, such as {file_url(h, npz[0])} "
                     f"(in Python, filename={npz[0]!r})")


def file_url(h, name):
    """The URL of file `name` of the Hub handle `h`, which the CLIs take as a checkpoint (https://...)."""
    endpoint = _endpoint() or huggingface_hub.constants.ENDPOINT
    return f"{endpoint.rstrip('/')}/{h.location}/resolve/{h.revision or 'main'}/{name}"


def check_blob(path, what):
    """Compares a cached file with the hash the Hub gave for it: its ETag, which names the blob, is
    the sha256 of large (LFS) files and the git blob hash of small ones. A file that differs is
    deleted. huggingface_hub checks only the size."""
    blob = pathlib.Path(os.path.realpath(path))
    etag = blob.name
    if re.fullmatch(r"[0-9a-f]{64}", etag):
        digest = hashlib.sha256()
    elif re.fullmatch(r"[0-9a-f]{40}", etag):
        digest = hashlib.sha1(b"blob %d\0" % blob.stat().st_size)  # git's object header
    else:
        return  # a cache without symlinks keeps copies, which are not named by their hash
    with open(blob, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    if digest.hexdigest() != etag:
        blob.unlink(missing_ok=True)
        pathlib.Path(path).unlink(missing_ok=True)
        raise DownloadError(f"{what}: the downloaded file does not match the Hub's hash {etag}; it was deleted, "
                            "so the next call downloads it again")

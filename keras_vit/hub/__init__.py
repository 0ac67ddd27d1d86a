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

Modules: `handles` (parsing, `DownloadError`), `urls` (gs:// and https://), `hf` (hf://, which asks
`keras_vit.checkpoints.formats.detect` what a repo holds); this module dispatches (`fetch`) and
turns a path, handle or catalog name into a local path (`locate`).
"""

import pathlib

from keras_vit import catalog
from keras_vit.hub import urls
from keras_vit.hub.handles import DownloadError, Handle, is_handle, offline, parse
from keras_vit.hub.urls import check_complete, gcs_url, keras_home


def fetch(handle, filename=None):
    """The local path of `handle`'s checkpoint, downloaded first unless it is cached.

    Returns a folder for Hub repos holding a timm or transformers model (config.json and
    model.safetensors side by side, as `keras_vit.load` reads them), else the file.

    Args:
        handle: a string or `Handle`.
        filename: with hf:// only, the file of the repo to load (e.g. one of several `.npz`).
    """
    h = parse(handle) if isinstance(handle, str) else handle
    if filename is not None and h.kind != "hf":
        raise ValueError(f"filename={filename!r} chooses a file of a Hub repo; {h} names one file already")
    if h.kind == "hf":
        from keras_vit.hub import hf  # huggingface_hub is imported only when a Hub handle is used

        return hf.fetch(h, filename)
    url = gcs_url(h.location) if h.kind == "gs" else h.location
    return urls.fetch_url(url, str(h))


def locate(source, filename=None):
    """The local path that `source` (a path, a handle or a catalog name) stands for."""
    if is_handle(source):
        return pathlib.Path(fetch(source, filename))
    if filename is not None:
        raise ValueError(f"filename={filename!r} picks a file of an hf:// repo; {source} is not an hf:// handle")
    path = pathlib.Path(source)
    if path.exists():
        return path
    entry = catalog.lookup(str(source))
    if entry is not None:
        return pathlib.Path(fetch(entry.handle))
    close = catalog.closest(str(source))
    hint = f"; did you mean {' or '.join(repr(n) for n in close)}?" if close else ""
    raise ValueError(f"cannot load {str(source)!r}: no such file or folder, not a handle (hf://, gs://, https://) "
                     f"and not a name of keras_vit.list_pretrained(){hint}")


__all__ = ["DownloadError", "Handle", "check_complete", "fetch", "gcs_url", "is_handle", "keras_home", "locate",
           "offline", "parse"]

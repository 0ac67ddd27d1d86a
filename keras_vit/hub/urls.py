"""`gs://` objects and `https://` files, through `keras.utils.get_file` into
KERAS_HOME/keras_vit/, checked for completeness before they are kept."""

import hashlib
import os
import pathlib
import socket
import urllib.parse
import zipfile

import keras

from keras_vit.checkpoints import formats
from keras_vit.hub.handles import URL_TIMEOUT, DownloadError, offline
from keras_vit.io import safetensors

GCS_ENDPOINT = "https://storage.googleapis.com"


def gcs_url(location):
    """The anonymous download URL of gs://`location`, on STORAGE_EMULATOR_HOST when set."""
    host = os.environ.get("STORAGE_EMULATOR_HOST") or GCS_ENDPOINT
    if "://" not in host:
        host = "http://" + host  # emulators are usually given as host:port
    return f"{host.rstrip('/')}/{urllib.parse.quote(location)}"


def keras_home():
    """KERAS_HOME, or ~/.keras: where `keras.utils.get_file` keeps its cache."""
    return pathlib.Path(os.environ.get("KERAS_HOME") or pathlib.Path.home() / ".keras")


def fetch_url(url, what):
    """Downloads `url` once into KERAS_HOME/keras_vit/<hash of url>/<its file name>."""
    name = pathlib.PurePosixPath(urllib.parse.urlsplit(url).path).name
    if not name.endswith(formats.FILE_SUFFIXES):
        raise ValueError(f"{what}: {name!r} is not a checkpoint file keras_vit reads "
                         f"({', '.join(formats.FILE_SUFFIXES)}); pickled PyTorch files are never loaded")
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
    safetensors.headers(path)  # the header's spans must tile the rest of the file exactly

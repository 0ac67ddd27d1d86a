"""Handles and what every fetcher shares: `Handle` and `parse`, `DownloadError`, the offline
switch."""

import dataclasses
import os
import pathlib
import re
import urllib.parse

URL_TIMEOUT = 30  # seconds a gs:// or https:// download may wait for data before giving up
HF_TIMEOUT = 10  # seconds the Hub may take to answer a file's metadata request

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
            raise ValueError(f"{handle!r}: the repo must be 'org/name' (hf://org/name[@revision]); to load one file "
                             "of a repo, give the file's URL, https://huggingface.co/ORG/NAME/resolve/main/FILE (in "
                             "Python, load_checkpoint('hf://ORG/NAME', filename='FILE') does the same)")
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


def offline():
    """HF_HUB_OFFLINE, read when called (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")



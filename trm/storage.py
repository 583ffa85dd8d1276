"""Storage URLs: one small API over GCS (`gs://bucket/prefix`), `file:///abs/path` and plain local paths.

Datasets, run directories, metrics and logs all go through here, so code never branches on where it writes.
On a TPU pod there is no shared filesystem: anything every host must see lives on GCS.

Emulator: when STORAGE_EMULATOR_HOST is set (read at each call), `gs://` goes to that endpoint with anonymous
credentials; otherwise gcsfs uses the machine's default credentials. Set GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
before gcsfs is first imported when using an emulator (see platform.md §4.4).

GCS requests have timeouts and a short, bounded retry (trm/gcs.py); GCS unreachable or refusing our credentials
is a `StorageUnavailable` error: one line naming the URL and what to do, never a long retry or a traceback.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from trm.errors import UserError

GCS_SCHEMES = ("gs", "gcs")


def _gcs_filesystem() -> AbstractFileSystem:
    from trm.gcs import BoundedGCSFileSystem

    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    # Listings are not cached: other hosts and processes change the bucket under us, and a stale listing would
    # make `stage` skip or `verify` pass on out-of-date metadata. fsspec still caches the instance itself, keyed
    # by these arguments, so an emulator on a new port gets its own instance.
    if emulator:
        if "://" not in emulator:
            emulator = f"http://{emulator}"
        return BoundedGCSFileSystem(token="anon", endpoint_url=emulator, use_listings_cache=False)
    return BoundedGCSFileSystem(use_listings_cache=False)


def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The filesystem holding `url` and the path to pass to it ("bucket/prefix" on GCS, absolute path locally)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return LocalFileSystem(auto_mkdir=True), os.path.abspath(os.path.expanduser(url))
    if scheme == "file":
        return LocalFileSystem(auto_mkdir=True), os.path.abspath(rest)
    if scheme in GCS_SCHEMES:
        bucket = rest.split("/", 1)[0]
        if not bucket:
            raise UserError(f"storage URL {url!r} has no bucket name: expected gs://BUCKET/PATH")
        return _gcs_filesystem(), rest.rstrip("/")
    raise UserError(
        f"unsupported storage URL {url!r}: use gs://BUCKET/PATH, file:///ABS/PATH or a local path"
    )


def join(url: str, *parts: str) -> str:
    """`url` extended by path components, e.g. join("gs://b/runs", "r1", "metrics.jsonl")."""
    pieces = [url.rstrip("/")] + [p.strip("/") for p in parts if p.strip("/")]
    return "/".join(pieces)


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.exists(path)


def read_bytes(url: str) -> bytes:
    fs, path = filesystem(url)
    return fs.cat_file(path)


def read_text(url: str) -> str:
    return read_bytes(url).decode("utf-8")


def write_bytes(url: str, data: bytes) -> None:
    """Write a whole file so that readers see either the old content or the new, never a partial file.

    GCS objects are replaced atomically by a single upload. Locally we write a temporary file beside the
    target and rename it over the target.
    """
    fs, path = filesystem(url)
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(url: str, text: str) -> None:
    write_bytes(url, text.encode("utf-8"))


def relative_path(root: str, path: str) -> str:
    """`path` (as returned by the filesystem of `root`) relative to `root`, with "/" separators."""
    return path[len(root) :].lstrip("/")


def list_files(url: str) -> list[str]:
    """Every file below `url`, as sorted relative paths ("train/inputs.npy"); empty when nothing is there."""
    fs, root = filesystem(url)
    if not fs.exists(root):
        return []
    return sorted(relative_path(root, p) for p in fs.find(root))


def list_dirs(url: str) -> list[str]:
    """Names of the folders directly below `url`, sorted; empty when nothing is there."""
    fs, root = filesystem(url)
    if not fs.exists(root):
        return []
    return sorted(
        relative_path(root, entry["name"])
        for entry in fs.ls(root, detail=True)
        if entry["type"] == "directory"
    )

"""Storage URLs: one small API over GCS (`gs://bucket/prefix`), `file:///abs/path` and plain local paths.

Datasets, run directories, metrics and logs all go through here, so code never branches on where it writes.
On a TPU pod there is no shared filesystem: anything every host must see lives on GCS.

Emulator: when STORAGE_EMULATOR_HOST is set (read at each call), `gs://` goes to that endpoint with anonymous
credentials; otherwise gcsfs uses Application Default Credentials, and their absence is an error (never
anonymous access). Set GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
before gcsfs is first imported when using an emulator.

Every URL is checked by `check_url`, which the workflow also runs on its settings at parse time. GCS requests
have timeouts and a short, bounded retry (trm/gcs.py); GCS unreachable or refusing our credentials is a
`StorageUnavailable` error: one line naming the URL and what to do, never a long retry or a traceback.

Every file the project writes goes through `write_bytes`/`write_text` (or `local_writer`, to stream a large one;
`write_errors` around a folder that is built, then renamed into place):
atomic, with the umask's permissions, never replacing a device or a pipe, and a destination that cannot be
written is one line naming it (rules in `local_writer`). Every JSON file it reads goes through `read_json` or
`read_json_lines`: one cut short or edited is a `DamagedFile`, one line naming it, where it stops parsing and
what to do.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from trm.errors import UserError, fix_for

GCS_SCHEMES = ("gs", "gcs")
URL_FORMS = "gs://BUCKET/PATH, file:///ABS/PATH or a local path"
# The placeholder of profiles/tpu-v4-64/study.yaml and of the docs.
PLACEHOLDER_BUCKETS = ("YOUR-BUCKET", "BUCKET")
# GCS bucket names: 3-63 characters (up to 222 with dots, 63 per dot-separated part) of lowercase letters,
# digits, "-", "_" and "."; first and last a letter or digit; not an IP address; no "goog" prefix.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
_IP_ADDRESS = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}")


def bucket_problem(name: str) -> str | None:
    """Why `name` is not a valid GCS bucket name, or None when it is."""
    parts = name.split(".")
    if (
        not _BUCKET.fullmatch(name)
        or any(not 1 <= len(part) <= 63 for part in parts)
        or ("." not in name and len(name) > 63)
    ):
        return (
            "a bucket name is 3-63 lowercase letters, digits, '-', '_' or '.' (up to 222 with dots), "
            "starting and ending with a letter or digit"
        )
    if _IP_ADDRESS.fullmatch(name) or name.startswith("goog") or "google" in name:
        return "a bucket name cannot be an IP address, start with 'goog' or contain 'google'"
    return None


class PlaceholderBucket(UserError):
    """A storage URL whose bucket is the docs' placeholder: refused before anything reaches storage (the workflow's
    dry run, which reaches none, only warns: trm/study/study.py)."""


def check_url(url: object, what: str = "storage URL") -> str:
    """`url` if it is a usable storage URL (gs://BUCKET[/PATH], file:///PATH or a local path), else a UserError
    naming `what` (the setting or argument) and the accepted forms. The one check for the CLI and the workflow."""
    if not isinstance(url, str) or not url.strip():
        raise UserError(f"{what} {url!r} is empty or not a string: expected {URL_FORMS}")
    if any(ord(char) < 32 or ord(char) == 127 for char in url):
        raise UserError(f"{what} {url!r} contains a control character (a newline?): expected {URL_FORMS}")
    scheme, sep, rest = url.partition("://")
    if not sep and url.startswith("-"):
        raise UserError(f"{what} {url!r} starts with '-', which commands read as an option: write ./{url}")
    if not sep or scheme == "file":
        return url
    if scheme not in GCS_SCHEMES:
        raise UserError(f"unsupported {what} {url!r}: use {URL_FORMS}")
    bucket = rest.split("/", 1)[0]
    if not bucket:
        raise UserError(f"{what} {url!r} has no bucket name: expected gs://BUCKET/PATH")
    if bucket in PLACEHOLDER_BUCKETS:
        raise PlaceholderBucket(
            f"{what} {url!r}: {bucket} is a placeholder; set your own bucket (docs/tpu.md, one-time set-up, "
            "steps 3 and 5), e.g. storage: gs://my-trm-bucket/trm-study in profiles/tpu-v4-64/study.yaml"
        )
    problem = bucket_problem(bucket)
    if problem:
        raise UserError(f"{what} {url!r}: {bucket!r} is not a valid GCS bucket name: {problem}")
    return url


def _gcs_filesystem() -> AbstractFileSystem:
    import google.auth.exceptions

    from trm.gcs import NO_CREDENTIALS, BoundedGCSFileSystem

    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    # Listings are not cached: other hosts and processes change the bucket under us, and a stale listing would
    # make `stage` skip or `verify` pass on out-of-date metadata. fsspec still caches the instance itself, keyed
    # by these arguments, so an emulator on a new port gets its own instance.
    if emulator:
        if "://" not in emulator:
            emulator = f"http://{emulator}"
        return BoundedGCSFileSystem(token="anon", endpoint_url=emulator, use_listings_cache=False)
    # Application Default Credentials, never anonymous: gcsfs's default falls back to anonymous access when
    # there are none, and the first write then fails with 401/403 far from the cause.
    try:
        return BoundedGCSFileSystem(token="google_default", use_listings_cache=False)
    except google.auth.exceptions.DefaultCredentialsError:
        raise UserError(NO_CREDENTIALS) from None


def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The filesystem holding `url` and the path to pass to it ("bucket/prefix" on GCS, absolute path locally)."""
    scheme, sep, rest = check_url(url).partition("://")
    if not sep:
        return LocalFileSystem(auto_mkdir=True), os.path.abspath(os.path.expanduser(url))
    if scheme == "file":
        return LocalFileSystem(auto_mkdir=True), os.path.abspath(rest)
    return _gcs_filesystem(), rest.rstrip("/")


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


class DamagedFile(UserError):
    """A file that does not parse: cut short by a crash or a full disk, or edited by hand. A reader that can do
    without it (a cache, work in progress) catches this and starts afresh."""


def _damaged(url: str, where: str, err: ValueError, remedy: str) -> DamagedFile:
    """One line: the file, where it stops parsing, and what to do."""
    if isinstance(err, json.JSONDecodeError):
        line = where or f" at line {err.lineno}"
        reason = f"not valid JSON{line} ({err.msg}, column {err.colno})"
    else:  # UnicodeDecodeError
        reason = f"not text{where} (byte {err.start} is not UTF-8)"
    return DamagedFile(f"{url}: damaged (cut short, or edited?): {reason}; {remedy}")


def read_json(
    url: str, missing: str, remedy: str = "delete it and run the command that writes it again"
) -> object:
    """The JSON value stored at `url`, the one way a JSON file is read: a UserError naming the file when it is
    absent ("URL: `missing`"), and a DamagedFile naming it and what to do (`remedy`) when it is not JSON."""
    if not exists(url):
        raise UserError(f"{url}: {missing}")
    try:
        return json.loads(read_text(url))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise _damaged(url, "", err, remedy) from None


def read_json_lines(url: str, missing: str, remedy: str) -> list:
    """The values of a JSON Lines file (one JSON value a line; blank lines skipped), as `read_json` reads one
    value: a damaged line is a DamagedFile naming the file, the line and `remedy`."""
    if not exists(url):
        raise UserError(f"{url}: {missing}")
    try:
        lines = read_text(url).splitlines()
    except UnicodeDecodeError as err:
        raise _damaged(url, "", err, remedy) from None
    values = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise _damaged(url, f" at line {number}", err, remedy) from None
    return values


def write_bytes(url: str, data: bytes) -> None:
    """Write a whole file so that readers see either the old content or the new, never a partial file.

    GCS objects are replaced atomically by a single upload; local paths as `local_writer` writes them. A local
    destination that cannot be written (read-only, full, a folder) is a UserError naming it, and what was there
    before is unchanged.
    """
    _check_names_a_file(url)
    fs, path = filesystem(url)
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return
    with local_writer(path) as sink:
        sink.write(data)


def write_text(url: str, text: str) -> None:
    write_bytes(url, text.encode("utf-8"))


class _Sink:
    """The stream `local_writer` yields: `write(bytes)`, whose failure (a full disk) is a UserError naming the
    destination, so a caller's own errors (a download's) stay apart from the write's."""

    def __init__(self, stream: BinaryIO, shown: str, atomic: bool) -> None:
        self._stream = stream
        self._shown = shown
        self._atomic = atomic

    def write(self, data: bytes) -> int:
        with write_errors(self._shown, self._atomic):
            return self._stream.write(data)


@contextmanager
def local_writer(path: str | os.PathLike) -> Iterator[_Sink]:
    """A stream whose bytes become the local file `path` when the block ends without an error; the one way this
    project writes a local file (and `write_bytes` the one way to write a whole one).

    - A new path or a regular file (a link is followed: the file it names) is replaced atomically: the bytes go
      to a temporary file beside it, synced, then renamed over it. Missing folders are created. An error (ours
      or the block's) removes the temporary file and leaves the old content.
    - Anything else that exists and accepts writes (a terminal, a FIFO, /dev/null, /dev/stdout) and every path
      under /dev or /proc is written in place, as the shell's `>` would: a rename would replace the device or
      the pipe itself with a file. A folder or a block device is refused.
    - Permissions: a new file gets 0666 less the umask (0644 under the usual 022), like any other tool's; a
      replaced file keeps its own mode.
    - A destination that cannot be written (read-only, full, a folder, under a file) is a UserError: one line
      naming `path` and the reason.
    """
    shown = str(path)
    _check_names_a_file(shown)
    target = Path(os.path.abspath(os.path.expanduser(shown)))
    real = Path(os.path.realpath(target))
    with write_errors(shown, atomic=True):  # nothing was touched yet
        status = os.stat(real) if real.exists() else None
    if status is not None and stat.S_ISDIR(status.st_mode):
        raise UserError(f"cannot write {shown}: it is a folder; give the path of a file in it")
    if status is not None and stat.S_ISBLK(status.st_mode):
        raise UserError(f"cannot write {shown}: it is a block device (a disk); refusing to write over it")
    system = any(p.parts[1:2] in (("dev",), ("proc",)) for p in (target, real))
    if system or (status is not None and not stat.S_ISREG(status.st_mode)):
        yield from _write_in_place(target, shown)
    else:
        yield from _replace_atomically(real, status, shown)


def _write_in_place(target: Path, shown: str) -> Iterator[_Sink]:
    """Open the existing `target` for writing, never creating or renaming anything."""
    with write_errors(shown, atomic=False):
        stream = open(os.open(target, os.O_WRONLY | os.O_TRUNC), "wb")
    try:
        yield _Sink(stream, shown, atomic=False)
        with write_errors(shown, atomic=False):
            stream.close()
    finally:
        with suppress(OSError):  # a write already failed: that is the error to report
            stream.close()


def _replace_atomically(target: Path, status: os.stat_result | None, shown: str) -> Iterator[_Sink]:
    """Write a temporary file beside `target` and rename it over `target` (see `local_writer`)."""
    with write_errors(shown, atomic=True):
        target.parent.mkdir(parents=True, exist_ok=True)
        # os.open applies the umask to 0o666 (mkstemp would make the file 0600, unreadable to anyone else).
        tmp = target.with_name(f".{target.name}.tmp-{secrets.token_hex(6)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    stream = open(fd, "wb")
    try:
        with write_errors(shown, atomic=True):
            if status is not None:
                os.fchmod(fd, stat.S_IMODE(status.st_mode))
        yield _Sink(stream, shown, atomic=True)
        with write_errors(shown, atomic=True):
            stream.flush()
            os.fsync(fd)
            stream.close()
            os.replace(tmp, target)
    except BaseException:
        with suppress(OSError):  # a write already failed: that is the error to report
            stream.close()
        tmp.unlink(missing_ok=True)
        raise


def _check_names_a_file(url: str) -> None:
    """A UserError for a destination ending in "/": it names a folder (the path would lose the slash and
    become a file of that name)."""
    if url.endswith("/"):
        raise UserError(
            f"cannot write {url}: it ends with '/', so it names a folder; give the path of a file"
        )


@contextmanager
def write_errors(shown: str, atomic: bool = True) -> Iterator[None]:
    """Turn the system's refusal to write (an OSError) inside into the one-line UserError naming `shown`. For
    writers that build a whole folder and rename it into place (`trm build-dataset`); `atomic`: the old
    content is still there after a failure."""
    try:
        yield
    except OSError as err:
        raise _cannot_write(shown, err, atomic) from None


def _cannot_write(shown: str, err: OSError, atomic: bool) -> UserError:
    """One line naming the destination, the system's reason and what to do (and, for an atomic write, that
    the old content is still there)."""
    reason = err.strerror or str(err)
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        failed = Path(os.path.abspath(err.filename or shown))  # the folder that could not be made
        blocker = next(
            (p for p in [*reversed(failed.parents), failed] if p.exists() and not p.is_dir()), None
        )
        reason = f"{blocker} is a file, not a folder" if blocker else reason
        hint = "choose another path"
    else:
        hint = fix_for(err) or "check the path"
    kept = " (what was there is unchanged)" if atomic else ""
    return UserError(f"cannot write {shown}: {reason}; {hint}{kept}")


def relative_path(root: str, path: str) -> str:
    """`path` (as returned by the filesystem of `root`) relative to `root`, with "/" separators."""
    return path[len(root) :].lstrip("/")


def list_files(url: str) -> list[str]:
    """Every file below `url`, as sorted relative paths ("train/inputs.npy"); empty when nothing is there."""
    fs, root = filesystem(url)
    if not fs.exists(root):
        return []
    return sorted(relative_path(root, p) for p in fs.find(root))


def remove(url: str) -> None:
    """Delete the file or folder (with everything below it) at `url`; nothing there is fine."""
    fs, path = filesystem(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


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

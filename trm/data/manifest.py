"""MANIFEST.json: what a dataset contains, with sizes and checksums of every file.

One record travels with a dataset: `trm build-dataset` writes it into the dataset folder (the build record),
`trm stage` refuses a folder whose files no longer match it and copies it to storage unchanged, and training
hosts check their downloaded copy against it. A dataset directory on storage counts as staged only when its
manifest is present: `trm stage` writes it last.
Checksums are md5 and crc32c (hex) of the file bytes; GCS reports both for every object (base64 in `md5Hash`
and `crc32c`), so a staged copy on GCS can be checked from metadata without downloading it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import google_crc32c
from fsspec import AbstractFileSystem

from trm import storage
from trm.errors import UserError

MANIFEST_NAME = "MANIFEST.json"
# Written last into a completed local copy made by fetch_dataset; holds the manifest hash it was checked against.
FETCHED_MARKER = ".fetch-complete"
# Written by `trm stage` before it changes a destination and removed after the new manifest: the files it may
# have written there, so a rerun after an interruption knows what it may replace or delete.
STAGING_MARKER = ".staging.json"
# Written by Snakemake into a directory() output (the workflow's built datasets) after the build: not data.
SNAKEMAKE_TIMESTAMP = ".snakemake_timestamp"
FORMAT_VERSION = 1
CHUNK_BYTES = 4 * 2**20


@dataclass(frozen=True)
class FileEntry:
    """One file of a dataset: path relative to the dataset root ("/" separated), size and checksums."""

    path: str
    size: int
    md5: str
    crc32c: str

    def mismatch(self, other: FileEntry) -> str | None:
        """How `other` (a stored copy of this file) differs from it, or None when it is identical."""
        if other.size < self.size:
            return f"truncated: {other.size} bytes, expected {self.size}"
        if other.size != self.size:
            return f"wrong size: {other.size} bytes, expected {self.size}"
        if other.md5 != self.md5 or other.crc32c != self.crc32c:
            return f"altered: checksum md5 {other.md5} crc32c {other.crc32c}, expected md5 {self.md5} crc32c {self.crc32c}"
        return None


@dataclass(frozen=True)
class Manifest:
    entries: tuple[FileEntry, ...]  # sorted by path

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def hash(self) -> str:
        """sha256 of the canonical JSON of the sorted entries: identifies the dataset's exact content."""
        canonical = json.dumps([asdict(e) for e in self.entries], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def differences(self, found: Manifest) -> list[str]:
        """One line per file of `found` (a scan of a copy) that is missing, altered or not listed here."""
        actual = {e.path: e for e in found.entries}
        problems = []
        for entry in self.entries:
            copy = actual.pop(entry.path, None)
            problem = "missing" if copy is None else entry.mismatch(copy)
            if problem:
                problems.append(f"{entry.path}: {problem}")
        return problems + [f"{path}: not in {MANIFEST_NAME}" for path in sorted(actual)]

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "format_version": FORMAT_VERSION,
                    "num_files": len(self.entries),
                    "total_bytes": self.total_bytes,
                    "entries_sha256": self.hash,
                    "files": [asdict(e) for e in self.entries],
                },
                indent=1,
            )
            + "\n"
        )

    @classmethod
    def from_json(cls, text: str, source: str) -> Manifest:
        """Parse a manifest, checking its version, fields and own hash; `source` names it in error messages."""
        try:
            doc = json.loads(text)
            version = doc["format_version"]
            if version != FORMAT_VERSION:
                raise UserError(
                    f"{source}: format_version {version!r} is not supported (expected {FORMAT_VERSION})"
                )
            manifest = cls(
                tuple(
                    sorted(
                        (
                            FileEntry(str(f["path"]), int(f["size"]), str(f["md5"]), str(f["crc32c"]))
                            for f in doc["files"]
                        ),
                        key=lambda e: e.path,
                    )
                )
            )
            recorded_hash = doc["entries_sha256"]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise UserError(f"{source}: not a valid dataset manifest ({type(err).__name__}: {err})") from err
        if manifest.hash != recorded_hash:
            raise UserError(f"{source}: entries_sha256 does not match the listed files (manifest altered)")
        return manifest


def gcs_digest_to_hex(value: str) -> str:
    """GCS metadata holds checksums as base64 of the raw digest; the manifest uses hex."""
    return base64.b64decode(value).hex()


def hash_stream(path: str, f: BinaryIO, sink: BinaryIO | None = None) -> FileEntry:
    """Size and checksums of everything read from `f`, copying the bytes to `sink` on the way if given."""
    md5, crc, size = hashlib.md5(), google_crc32c.Checksum(), 0
    while chunk := f.read(CHUNK_BYTES):
        md5.update(chunk)
        crc.update(chunk)
        size += len(chunk)
        if sink is not None:
            sink.write(chunk)
    return FileEntry(path, size, md5.hexdigest(), crc.digest().hex())


def scan_local(root: Path) -> Manifest:
    """Manifest of every file below the local directory `root`.

    A manifest, the fetch and staging markers and Snakemake's timestamp at the top are left out, so a fetched
    copy, or a dataset the workflow built, can be staged again as it is.
    """
    entries = []
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = file.relative_to(root).as_posix()
        if rel in (MANIFEST_NAME, FETCHED_MARKER, STAGING_MARKER, SNAKEMAKE_TIMESTAMP):
            continue
        with open(file, "rb") as f:
            entries.append(hash_stream(rel, f))
    return Manifest(tuple(entries))


def write_build_record(root: Path) -> Manifest:
    """Record the files of the dataset folder `root`, just built, in `root`/MANIFEST.json."""
    record = scan_local(root)
    (root / MANIFEST_NAME).write_text(record.to_json())
    return record


def unrecorded_paths(root: Path, record: Manifest) -> list[str]:
    """Every file, folder or link below the local folder `root` that its build record `record` does not account
    for (the record itself and Snakemake's timestamp aside): what replacing `root` would destroy of someone else's."""
    ours = {MANIFEST_NAME, SNAKEMAKE_TIMESTAMP}
    for entry in record.entries:
        parts = entry.path.split("/")
        ours |= {"/".join(parts[: i + 1]) for i in range(len(parts))}
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        # A link is never ours, even to a listed file: its target is someone's.
        if rel not in ours or path.is_symlink():
            found.append(rel)
    return found


def read_build_record(root: Path) -> Manifest | None:
    """The build record of the local dataset folder `root`, or None when it has none (an older or hand-made one)."""
    path = root / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(
            f"{path}: not a readable dataset manifest ({err}); rebuild with trm build-dataset"
        ) from None
    try:
        return Manifest.from_json(text, str(path))
    except UserError as err:
        raise UserError(f"{err}; rebuild with trm build-dataset") from None


def list_stored(fs: AbstractFileSystem, root: str) -> dict[str, dict]:
    """Every file below `root` on `fs`: relative path -> the filesystem's info (size, GCS checksums, ...)."""
    if not fs.exists(root):
        return {}
    found = fs.find(root, detail=True)
    return {storage.relative_path(root, path): info for path, info in found.items()}


def stored_entry(
    fs: AbstractFileSystem, root: str, rel: str, info: dict, download: bool = False
) -> FileEntry:
    """Size and checksums of a stored file: from GCS object metadata when it has them, else by reading it."""
    if not download and info.get("md5Hash") and info.get("crc32c"):
        return FileEntry(
            rel, int(info["size"]), gcs_digest_to_hex(info["md5Hash"]), gcs_digest_to_hex(info["crc32c"])
        )
    with fs.open(f"{root}/{rel}", "rb") as f:
        return hash_stream(rel, f)


def read_manifest(url: str) -> Manifest:
    """The manifest of the dataset staged at `url`; UserError when there is none (not staged, or interrupted)."""
    manifest_url = storage.join(url, MANIFEST_NAME)
    try:
        text = storage.read_text(manifest_url)
    except FileNotFoundError:
        raise UserError(
            f"{manifest_url} not found: no dataset is staged at {url} (or staging was interrupted; rerun trm stage)"
        ) from None
    return Manifest.from_json(text, manifest_url)

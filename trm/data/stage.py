"""Stage a local dataset folder to storage (gs://BUCKET/PATH, file:///PATH or a local path) with a manifest.

Only what the build wrote is staged: the folder's MANIFEST.json, written by `trm build-dataset`, lists every
file with its size and checksums, and every file is checked against it before anything is uploaded. A file
that is altered, truncated, extended, missing or not listed is refused, named, and nothing is written: rebuild
the dataset with `trm build-dataset`. A folder without MANIFEST.json (built by an older trm, by the original
TRM builder or by hand) is refused too, unless --accept-unrecorded is given: its files are then staged as they
are found.

Every file is uploaded and its stored checksum compared with the build's record (a file that changed during
the upload is refused, and no manifest is written), files a previous staging wrote that are not in the source
are deleted, and the build's MANIFEST.json is written LAST: a destination without a manifest is not a staged
dataset. Any old manifest is removed before the first change, so an interrupted run leaves none; rerunning
completes it. Files already stored with the right size and checksums are skipped, so rerunning on unchanged
content transfers nothing.

Only files that trm stage wrote are ever replaced or deleted: those the destination's manifest lists, or, after
an interruption, its .staging.json (written before the first change). A destination holding any other file
(a folder that was never a staged dataset, or a file added to one) is refused, and nothing is written.

A destination already holding another dataset (another manifest hash; or an interrupted staging of another one,
which .staging.json names) is refused too unless --replace is given: runs trained on it are bound to it (their
run dir's data.json), and a dataset replaced under them would make their results and their resumption disagree.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fsspec.callbacks import Callback
from tqdm import tqdm

from trm import storage
from trm.data.manifest import (
    MANIFEST_NAME,
    STAGING_MARKER,
    FileEntry,
    Manifest,
    list_stored,
    read_build_record,
    scan_local,
    stored_entry,
)
from trm.errors import UserError


class _BarCallback(Callback):
    """Forwards fsspec's per-file transfer progress to one shared tqdm bar (bytes)."""

    def __init__(self, bar: tqdm):
        super().__init__()
        self.bar = bar
        self.shown = 0

    def call(self, *args, **kwargs) -> None:
        self.bar.update(self.value - self.shown)
        self.shown = self.value


def stage_dataset(src: str | Path, dest: str, accept_unrecorded: bool = False, replace: bool = False) -> dict:
    """Stage the local folder `src` at the storage URL `dest`; returns counts for the summary line.

    `src` must match its build record (MANIFEST.json); without one it is refused unless `accept_unrecorded`. A
    `dest` holding another dataset is refused unless `replace`.
    """
    start = time.perf_counter()
    src = Path(src)
    manifest = _checked_source(src, accept_unrecorded)

    fs, root = storage.filesystem(dest)
    manifest_path = f"{root}/{MANIFEST_NAME}"
    bucket = root.split("/", 1)[0]
    if "gs" in fs.protocol and not fs.exists(bucket):
        raise UserError(
            f"bucket gs://{bucket} of {dest} does not exist (or is not accessible); create it first"
        )
    stored = list_stored(fs, root)
    old_manifest = stored.pop(MANIFEST_NAME, None)
    marker = stored.pop(STAGING_MARKER, None)
    owned, staged_hash = _owned_files(fs, root, dest, old_manifest is not None, marker is not None)
    _refuse_foreign_files(dest, sorted(set(stored) - owned), old_manifest is not None)
    if staged_hash not in (None, manifest.hash) and not replace:
        raise UserError(
            f"{dest} holds another dataset (manifest {staged_hash[:16]}, not {src}'s {manifest.hash[:16]}); runs "
            "trained on it are bound to it: stage to a new destination, or pass --replace to replace it"
        )

    to_upload = [
        e
        for e in manifest.entries
        if e.path not in stored or e.mismatch(stored_entry(fs, root, e.path, stored[e.path]))
    ]
    to_delete = sorted(set(stored) - {e.path for e in manifest.entries})
    manifest_current = (
        old_manifest is not None
        and not to_upload
        and not to_delete
        and fs.cat_file(manifest_path).decode() == manifest.to_json()
    )
    if manifest_current:
        # Interrupted after writing the manifest: only the marker is left to remove.
        if marker is not None:
            fs.rm_file(f"{root}/{STAGING_MARKER}")
        return _summary(manifest, [], [], manifest_written=False, seconds=time.perf_counter() - start)

    # From here on the destination changes: first record every file this run or an earlier one may have written
    # there, then make the destination unmistakably "not staged".
    ours = sorted(owned | {e.path for e in manifest.entries})
    marker_record = {"files": ours, "manifest_sha256": manifest.hash}
    storage.write_text(storage.join(dest, STAGING_MARKER), json.dumps(marker_record, indent=1) + "\n")
    if old_manifest is not None:
        fs.rm_file(manifest_path)
    with tqdm(
        total=sum(e.size for e in to_upload), unit="B", unit_scale=True, desc=f"staging {dest}", disable=None
    ) as bar:
        for entry in to_upload:
            _upload(fs, src, root, entry, bar)
    for rel in to_delete:
        fs.rm_file(f"{root}/{rel}")
    storage.write_text(storage.join(dest, MANIFEST_NAME), manifest.to_json())
    fs.rm_file(f"{root}/{STAGING_MARKER}")
    return _summary(
        manifest, to_upload, to_delete, manifest_written=True, seconds=time.perf_counter() - start
    )


def _checked_source(src: Path, accept_unrecorded: bool) -> Manifest:
    """The manifest to stage `src` with: its build record, once every file is checked against it.

    UserError naming the first differing file (and how many more differ), or the missing record.
    """
    if not src.is_dir():
        raise UserError(f"source dataset folder {src} does not exist or is not a directory")
    found = scan_local(src)
    if not found.entries:
        raise UserError(f"source dataset folder {src} contains no files")
    record = read_build_record(src)
    if record is None:
        if accept_unrecorded:
            return found
        raise UserError(
            f"{src / MANIFEST_NAME} not found: {src} has no build record (built by an older trm or by hand), so "
            "trm stage cannot tell whether its files are the ones the build wrote; rebuild with trm build-dataset, "
            "or pass --accept-unrecorded to stage the files as they are"
        )
    problems = record.differences(found)
    if problems:
        more = f" (and {len(problems) - 1} more files differ)" if len(problems) > 1 else ""
        raise UserError(
            f"{src}/{problems[0]}{more}: the dataset no longer matches its build record {src / MANIFEST_NAME}; "
            "nothing was staged: rebuild with trm build-dataset"
        )
    return record


def _owned_files(
    fs, root: str, dest: str, has_manifest: bool, has_marker: bool
) -> tuple[set[str], str | None]:
    """The files of `dest` that trm stage wrote (listed by its manifest or by an interrupted run's marker), and the
    manifest hash of the dataset there, if any: its manifest's, or the one an interrupted run was staging."""
    owned: set[str] = set()
    staged_hash = None
    if has_manifest:
        url = storage.join(dest, MANIFEST_NAME)
        try:
            previous = Manifest.from_json(fs.cat_file(f"{root}/{MANIFEST_NAME}").decode(), url)
            owned |= {e.path for e in previous.entries}
            staged_hash = previous.hash
        except (UserError, UnicodeDecodeError) as err:
            raise UserError(
                f"{err}; trm stage cannot tell which files of {dest} it wrote: stage to a new destination, or "
                f"delete {dest} yourself first"
            ) from None
    if has_marker:
        url = storage.join(dest, STAGING_MARKER)
        try:
            record = json.loads(fs.cat_file(f"{root}/{STAGING_MARKER}"))
            owned |= {str(path) for path in record["files"]}
            # An older trm's marker does not say which dataset it was staging.
            if staged_hash is None and record.get("manifest_sha256") is not None:
                staged_hash = str(record["manifest_sha256"])
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise UserError(
                f"{url}: not a valid staging marker ({type(err).__name__}: {err}); stage to a new destination, or "
                f"delete {dest} yourself first"
            ) from None
    return owned, staged_hash


def _refuse_foreign_files(dest: str, foreign: list[str], has_manifest: bool) -> None:
    """Refuse to stage into `dest` while it holds files trm stage did not write (it would replace or delete them)."""
    if not foreign:
        return
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    what = (
        f"{dest} holds {len(foreign)} files its MANIFEST.json does not list ({shown})"
        if has_manifest
        else f"{dest} is not empty and is not a dataset staged by trm stage (no {MANIFEST_NAME}): "
        f"it holds {len(foreign)} files ({shown})"
    )
    raise UserError(
        f"{what}; trm stage only replaces or deletes files it wrote. Stage to an empty or new destination, "
        "or move those files away first"
    )


def _upload(fs, src: Path, root: str, entry: FileEntry, bar: tqdm) -> None:
    """Upload one file and confirm that the stored copy has the checksums of the build's record."""
    remote = f"{root}/{entry.path}"
    callback = _BarCallback(bar)
    fs.put_file(str(src / entry.path), remote, callback=callback)
    bar.update(entry.size - callback.shown)  # the local filesystem reports no progress
    problem = entry.mismatch(stored_entry(fs, root, entry.path, fs.info(remote)))
    if problem:
        raise UserError(
            f"{src / entry.path} changed while staging it (stored copy {problem}); no manifest was written: "
            "rebuild with trm build-dataset, then rerun trm stage"
        )


def _summary(
    manifest: Manifest, uploaded: list[FileEntry], deleted: list[str], manifest_written: bool, seconds: float
) -> dict:
    return {
        "manifest_written": manifest_written,
        "files": len(manifest.entries),
        "bytes": manifest.total_bytes,
        "uploaded_files": len(uploaded),
        "uploaded_bytes": sum(e.size for e in uploaded),
        "skipped_files": len(manifest.entries) - len(uploaded),
        "deleted_files": len(deleted),
        "manifest_hash": manifest.hash,
        "seconds": seconds,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="local dataset folder (e.g. data/sudoku-extreme-1k-aug-1000)")
    parser.add_argument("dest", help="destination URL: gs://BUCKET/PATH, file:///ABS/PATH or a local path")
    parser.add_argument(
        "--accept-unrecorded",
        action="store_true",
        help="stage a folder without a build record (MANIFEST.json) as its files are now",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="replace another dataset staged at dest (runs trained on it will refuse to resume on this one)",
    )


def main(args: argparse.Namespace) -> int:
    storage.check_url(args.dest)
    s = stage_dataset(args.src, args.dest, accept_unrecorded=args.accept_unrecorded, replace=args.replace)
    if not s["manifest_written"]:
        print(
            f"{args.dest}: already up to date, nothing transferred ({s['files']} files, {s['bytes']:,} bytes)"
        )
    else:
        print(
            f"staged {args.src} -> {args.dest}: {s['uploaded_files']} files uploaded ({s['uploaded_bytes']:,} bytes), "
            f"{s['skipped_files']} already present, {s['deleted_files']} stale files deleted, "
            f"{s['seconds']:.1f} s; manifest {s['manifest_hash'][:16]}"
        )
    return 0

"""Check a staged dataset (gs://BUCKET/PATH, file:///PATH or a local path) against its MANIFEST.json.

Every file listed must exist with the recorded size and checksums; files not listed are reported too. On GCS
the checksums come from object metadata (no download) unless --download is given, which re-hashes the bytes.
Exit code 0 when the dataset is intact, 2 with the list of problems otherwise.

This module also holds `fetch_dataset`, the reader training hosts use to copy a staged dataset to local disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

from trm import storage
from trm.data.manifest import (
    FETCHED_MARKER,
    MANIFEST_NAME,
    STAGING_MARKER,
    Manifest,
    hash_stream,
    list_stored,
    read_manifest,
    stored_entry,
)
from trm.errors import UserError

# Where hosts keep their local copies of staged datasets.
DATASET_CACHE = os.environ.get("TRM_CACHE_DIR", str(Path.home() / ".cache" / "trm" / "datasets"))


def find_problems(url: str, download: bool = False) -> tuple[Manifest, list[str]]:
    """The manifest at `url` and one line per missing, truncated, altered or unexpected file (empty if intact)."""
    manifest = read_manifest(url)
    fs, root = storage.filesystem(url)
    stored = list_stored(fs, root)
    stored.pop(MANIFEST_NAME, None)
    problems = []
    if stored.pop(STAGING_MARKER, None) is not None:
        problems.append(f"{STAGING_MARKER}: left by an interrupted trm stage; rerun trm stage")
    for entry in manifest.entries:
        info = stored.pop(entry.path, None)
        if info is None:
            problems.append(f"{entry.path}: missing")
            continue
        problem = entry.mismatch(stored_entry(fs, root, entry.path, info, download=download))
        if problem:
            problems.append(f"{entry.path}: {problem}")
    problems += [f"{rel}: unexpected file, not in the manifest" for rel in sorted(stored)]
    return manifest, problems


def verify_dataset(url: str, download: bool = False) -> Manifest:
    """The manifest of the dataset at `url` after checking every file; UserError listing all problems."""
    manifest, problems = find_problems(url, download)
    if problems:
        listing = "\n  ".join(problems)
        raise UserError(
            f"dataset at {url} does not match its manifest ({len(problems)} problems):\n  {listing}"
        )
    return manifest


def fetch_dataset(url: str, cache_dir: str | Path, manifest: Manifest | None = None) -> Path:
    """Local copy of the dataset staged at `url`, downloaded into `cache_dir` and checked against its manifest.

    The copy lives in `cache_dir/NAME-HASH` (HASH identifies the manifest's content), so a changed dataset gets a
    fresh copy and a completed copy is reused. Downloads go to a private temporary directory renamed into
    place, so concurrent processes never see or corrupt a partial copy. Raises UserError naming the file when
    the dataset has no manifest or a file is missing, truncated or altered. `manifest`: the one at `url`, if the
    caller has read it already (the copy is then of exactly that content).
    """
    manifest = manifest or read_manifest(url)
    cache_dir = Path(cache_dir)
    name = url.rstrip("/").rsplit("/", 1)[-1] or "dataset"
    target = cache_dir / f"{name}-{manifest.hash[:16]}"
    if _is_complete(target, manifest):
        return target
    _refuse_foreign(target, url)

    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix=f".{target.name}.tmp-"))
    try:
        _download(url, manifest, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            # The target exists: another process finished first (use its copy), or a damaged copy is in the
            # way (move it aside, then put ours in its place).
            if not _is_complete(target, manifest):
                _refuse_foreign(target, url)
                aside = tmp.with_name(tmp.name + "-damaged")
                os.rename(target, aside)
                os.rename(tmp, target)
                shutil.rmtree(aside)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _refuse_foreign(target: Path, url: str) -> None:
    """Only a copy this module made (damaged since) is ever replaced: refuse anything else in its place."""
    if target.is_symlink() or (target.exists() and not (target / FETCHED_MARKER).is_file()):
        raise UserError(
            f"{target} is in the way of the copy of {url} and is not a dataset copy trm fetched (no "
            f"{FETCHED_MARKER}): move it away, or choose another cache folder"
        )


def _is_complete(target: Path, manifest: Manifest) -> bool:
    """Whether `target` is a finished copy of `manifest` (marker and file sizes; the bytes were hashed on download)."""
    marker = target / FETCHED_MARKER
    if not marker.is_file() or marker.read_text().strip() != manifest.hash:
        return False
    return all(
        (target / e.path).is_file() and (target / e.path).stat().st_size == e.size for e in manifest.entries
    )


def _download(url: str, manifest: Manifest, tmp: Path) -> None:
    """Copy every manifest entry into `tmp`, hashing the bytes on the way; then write the manifest and marker."""
    fs, root = storage.filesystem(url)
    with tqdm(
        total=manifest.total_bytes, unit="B", unit_scale=True, desc=f"fetching {url}", disable=None
    ) as bar:
        for entry in manifest.entries:
            local = tmp / entry.path
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                with fs.open(f"{root}/{entry.path}", "rb") as src, open(local, "wb") as sink:
                    got = hash_stream(entry.path, src, sink)
            except FileNotFoundError:
                raise UserError(
                    f"{storage.join(url, entry.path)}: missing (listed in the manifest)"
                ) from None
            problem = entry.mismatch(got)
            if problem:
                raise UserError(
                    f"{storage.join(url, entry.path)}: {problem}; restage the dataset with trm stage (a folder "
                    "trm build-dataset wrote: rebuild it)"
                )
            bar.update(entry.size)
    (tmp / MANIFEST_NAME).write_text(manifest.to_json())
    (tmp / FETCHED_MARKER).write_text(manifest.hash + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dest", help="staged dataset URL: gs://BUCKET/PATH, file:///ABS/PATH or a local path")
    parser.add_argument(
        "--download",
        action="store_true",
        help="re-hash the stored bytes instead of trusting GCS object metadata",
    )


def main(args: argparse.Namespace) -> int:
    storage.check_url(args.dest)  # named as given, not as the manifest's URL
    manifest = verify_dataset(args.dest, download=args.download)
    how = "downloaded and re-hashed" if args.download else "checked"
    print(
        f"{args.dest}: intact, {len(manifest.entries)} files ({manifest.total_bytes:,} bytes) {how} "
        f"against manifest {manifest.hash[:16]}"
    )
    return 0

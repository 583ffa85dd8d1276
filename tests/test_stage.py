"""`trm stage`, `trm verify` and fetch_dataset, each on file:// and on a real GCS emulator (fake-gcs-server)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from trm import cli, storage
from trm.data import stage as stage_module
from trm.data.manifest import MANIFEST_NAME, STAGING_MARKER, Manifest, read_build_record, write_build_record
from trm.data.stage import stage_dataset
from trm.data.verify import fetch_dataset, find_problems, verify_dataset
from trm.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]


def make_dataset(root: Path, seed: int = 0) -> Path:
    """A small dataset-like folder: train/ and test/ arrays, a dataset.json and the build record."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", 64), ("test", 16)):
        (root / split).mkdir(parents=True, exist_ok=True)
        np.save(root / split / "inputs.npy", rng.integers(0, 10, (n, 81), dtype=np.uint8))
        np.save(root / split / "labels.npy", rng.integers(1, 10, (n, 81), dtype=np.uint8))
    (root / "dataset.json").write_text(json.dumps({"seq_len": 81, "vocab_size": 11, "seed": seed}))
    write_build_record(root)
    return root


def source_files(root: Path) -> dict[str, bytes]:
    """The dataset's files (its manifest left out) and their bytes."""
    files = (p for p in sorted(root.rglob("*")) if p.is_file() and p != root / MANIFEST_NAME)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in files}


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return make_dataset(tmp_path / "src")


@pytest.fixture
def dest(storage_root: str) -> str:
    return storage.join(storage_root, "datasets", "sudoku-small")


def run_cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def damage(url: str, fault: str) -> None:
    """Alter a stored file the way storage goes wrong: a flipped byte, a truncation or a deletion."""
    fs, path = storage.filesystem(url)
    data = fs.cat_file(path)
    if fault == "flip":
        i = len(data) // 2  # in the array data, past the .npy header
        fs.pipe_file(path, data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :])
    elif fault == "truncate":
        fs.pipe_file(path, data[: len(data) // 2])
    else:
        fs.rm_file(path)


def test_stage_writes_manifest_and_everything_checks(dataset: Path, dest: str, tmp_path: Path, capsys):
    code, out, _ = run_cli(["stage", str(dataset), dest], capsys)
    assert code == 0 and "5 files uploaded" in out

    files = source_files(dataset)
    manifest = json.loads(storage.read_text(storage.join(dest, MANIFEST_NAME)))
    assert manifest["format_version"] == 1
    assert manifest["num_files"] == len(files) == 5
    assert manifest["total_bytes"] == sum(len(b) for b in files.values())
    for entry in manifest["files"]:
        data = files[entry["path"]]
        assert entry["size"] == len(data)
        assert entry["md5"] == hashlib.md5(data).hexdigest()
        assert entry["crc32c"] == google_crc32c.Checksum(data).digest().hex()
    assert storage.list_files(dest) == sorted([*files, MANIFEST_NAME])
    assert storage.read_bytes(storage.join(dest, MANIFEST_NAME)) == (dataset / MANIFEST_NAME).read_bytes()

    code, out, _ = run_cli(["verify", dest], capsys)
    assert code == 0 and "intact, 5 files" in out
    local = fetch_dataset(dest, tmp_path / "cache")
    assert source_files(local).items() >= files.items()
    assert (local / MANIFEST_NAME).read_text() == storage.read_text(storage.join(dest, MANIFEST_NAME))
    assert stage_dataset(local, dest)["uploaded_files"] == 0, "a fetched copy stages as the same dataset"


def test_second_stage_transfers_nothing(dataset: Path, dest: str, capsys):
    stage_dataset(dataset, dest)
    manifest_before = storage.read_bytes(storage.join(dest, MANIFEST_NAME))
    code, out, _ = run_cli(["stage", str(dataset), dest], capsys)
    assert code == 0 and "already up to date, nothing transferred (5 files" in out
    summary = stage_dataset(dataset, dest)
    assert (
        summary["uploaded_files"] == 0 and summary["skipped_files"] == 5 and not summary["manifest_written"]
    )
    assert storage.read_bytes(storage.join(dest, MANIFEST_NAME)) == manifest_before


def test_restage_changed_content(dataset: Path, dest: str, tmp_path: Path):
    stage_dataset(dataset, dest)
    np.save(dataset / "test" / "inputs.npy", np.zeros((3, 81), np.uint8))  # changed
    (dataset / "train" / "labels.npy").unlink()  # removed: must disappear from storage
    (dataset / "extra.txt").write_text("new file")  # added
    write_build_record(dataset)  # as a rebuild would
    summary = stage_dataset(dataset, dest, replace=True)  # another dataset now: replaced only when asked
    assert (summary["uploaded_files"], summary["skipped_files"], summary["deleted_files"]) == (2, 3, 1)
    assert storage.list_files(dest) == sorted([*source_files(dataset), MANIFEST_NAME])
    verify_dataset(dest, download=True)
    assert source_files(fetch_dataset(dest, tmp_path / "cache")).items() >= source_files(dataset).items()


def test_interrupted_staging_leaves_no_manifest_and_rerun_completes(
    dataset: Path, dest: str, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
):
    stage_dataset(dataset, dest)
    # A restage interrupted after its first upload: the manifest is gone, one file is replaced, one added.
    np.save(dataset / "test" / "inputs.npy", np.zeros((3, 81), np.uint8))
    (dataset / "a-new-file.txt").write_text("added")
    write_build_record(dataset)
    uploads = []

    def interrupted(*args):
        if uploads:
            raise KeyboardInterrupt
        uploads.append(real_upload(*args))

    real_upload = stage_module._upload
    monkeypatch.setattr(stage_module, "_upload", interrupted)
    with pytest.raises(KeyboardInterrupt):
        stage_dataset(dataset, dest, replace=True)
    monkeypatch.undo()
    assert storage.exists(storage.join(dest, "a-new-file.txt"))

    code, _, err = run_cli(["verify", dest], capsys)
    assert code == 2 and f"{dest}/MANIFEST.json not found" in err and "rerun trm stage" in err
    with pytest.raises(UserError, match="MANIFEST.json not found"):
        fetch_dataset(dest, tmp_path / "cache")

    # The file the interrupted run added is its own: removing it from the source deletes it from storage.
    (dataset / "a-new-file.txt").unlink()
    write_build_record(dataset)
    summary = stage_dataset(dataset, dest, replace=True)  # not the dataset the interrupted run was staging
    assert summary["manifest_written"] and summary["uploaded_files"] == 1 and summary["deleted_files"] == 1
    assert run_cli(["verify", dest], capsys)[0] == 0
    assert storage.list_files(dest) == sorted([*source_files(dataset), MANIFEST_NAME])
    assert source_files(fetch_dataset(dest, tmp_path / "cache")).items() >= source_files(dataset).items()


def test_stage_interrupted_after_its_manifest_only_removes_its_marker(dataset: Path, dest: str, capsys):
    stage_dataset(dataset, dest)
    files = sorted(source_files(dataset))
    storage.write_text(storage.join(dest, STAGING_MARKER), json.dumps({"files": files}))
    code, _, err = run_cli(["verify", dest], capsys)
    assert code == 2 and ".staging.json: left by an interrupted trm stage; rerun trm stage" in err
    summary = stage_dataset(dataset, dest)
    assert not summary["manifest_written"] and summary["uploaded_files"] == 0
    assert run_cli(["verify", dest], capsys)[0] == 0 and not storage.exists(
        storage.join(dest, STAGING_MARKER)
    )


def test_stage_refuses_a_destination_holding_files_it_did_not_write(dataset: Path, dest: str, capsys):
    """The reproducer: a folder that was never a staged dataset is refused, named, and left as it was."""
    storage.write_text(storage.join(dest, "notes.txt"), "mine")
    storage.write_text(storage.join(dest, "sub", "keep.txt"), "mine too")
    code, out, err = run_cli(["stage", str(dataset), dest], capsys)
    assert code == 2 and not out
    assert f"{dest} is not empty and is not a dataset staged by trm stage (no MANIFEST.json)" in err
    assert "notes.txt, sub/keep.txt" in err and "Stage to an empty or new destination" in err
    assert len(err.strip().splitlines()) == 1
    assert storage.list_files(dest) == ["notes.txt", "sub/keep.txt"]  # nothing written, nothing deleted
    assert storage.read_text(storage.join(dest, "notes.txt")) == "mine"

    # A file added to a staged dataset is not deleted either: it is named, and the dataset left as it was.
    other = dest + "-staged"
    stage_dataset(dataset, other)
    manifest = storage.read_text(storage.join(other, MANIFEST_NAME))
    storage.write_text(storage.join(other, "test", "notes.txt"), "mine")
    (dataset / "dataset.json").write_text("{}")  # a change, so the restage would write
    write_build_record(dataset)
    code, _, err = run_cli(["stage", str(dataset), other], capsys)
    assert code == 2 and f"{other} holds 1 files its MANIFEST.json does not list (test/notes.txt)" in err
    assert storage.read_text(storage.join(other, MANIFEST_NAME)) == manifest
    assert storage.read_text(storage.join(other, "test", "notes.txt")) == "mine"


def test_stage_refuses_another_dataset_without_replace(dataset: Path, dest: str, tmp_path: Path, capsys):
    """The issue's case: staging a different dataset onto a URL that holds one replaced it silently, under the runs
    trained on it. Now it is refused in one line, and nothing at the destination changes; --replace replaces it."""
    stage_dataset(dataset, dest)
    before = {rel: storage.read_bytes(storage.join(dest, rel)) for rel in storage.list_files(dest)}
    other = make_dataset(tmp_path / "other", seed=1)
    old, new = Manifest.from_json((dataset / MANIFEST_NAME).read_text(), "a"), read_build_record(other)
    code, out, err = run_cli(["stage", str(other), dest], capsys)
    assert code == 2 and not out and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert (
        f"{dest} holds another dataset (manifest {old.hash[:16]}, not {other}'s {new.hash[:16]}); runs trained on "
        "it are bound to it: stage to a new destination, or pass --replace to replace it"
    ) in err
    assert {rel: storage.read_bytes(storage.join(dest, rel)) for rel in storage.list_files(dest)} == before

    # An interrupted staging of `other` (its marker names it, the old manifest is gone): staging the first dataset
    # there is a replacement too.
    storage.write_text(
        storage.join(dest, STAGING_MARKER),
        json.dumps({"files": sorted(set(before) - {MANIFEST_NAME}), "manifest_sha256": new.hash}),
    )
    fs, root = storage.filesystem(dest)
    fs.rm_file(f"{root}/{MANIFEST_NAME}")
    with pytest.raises(UserError, match=f"holds another dataset \\(manifest {new.hash[:16]}"):
        stage_dataset(dataset, dest)

    code, out, _ = run_cli(["stage", str(other), dest, "--replace"], capsys)
    assert code == 0 and f"manifest {new.hash[:16]}" in out
    assert verify_dataset(dest) == new
    assert stage_dataset(other, dest)["uploaded_files"] == 0  # the same dataset again: nothing to replace


def test_fetch_replaces_only_its_own_damaged_copy(dataset: Path, dest: str, tmp_path: Path, capsys):
    """A folder of someone else's where the cached copy goes is refused in one line and left as it is."""
    stage_dataset(dataset, dest)
    manifest = verify_dataset(dest)
    cache = tmp_path / "cache"
    target = cache / f"sudoku-small-{manifest.hash[:16]}"
    target.mkdir(parents=True)
    (target / "mine.txt").write_text("mine")
    with pytest.raises(
        UserError, match=f"{target} is in the way of the copy of .* not a dataset copy trm fetched"
    ):
        fetch_dataset(dest, cache)
    assert [p.name for p in target.iterdir()] == ["mine.txt"] and sorted(p.name for p in cache.iterdir()) == [
        target.name
    ]


def test_killed_stage_leaves_no_manifest_and_rerun_completes(tmp_path: Path, dest: str, capsys):
    """A real interruption: SIGKILL `trm stage` mid-upload, once the first changed file is stored."""
    src, shards = tmp_path / "big", 32
    (src / "train").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(shards):
        (src / "train" / f"shard{i:02d}.bin").write_bytes(rng.bytes(256 * 1024))
    write_build_record(src)
    stage_dataset(src, dest)
    for shard in (src / "train").iterdir():  # new content everywhere: every file must be re-uploaded
        shard.write_bytes(rng.bytes(256 * 1024))
    write_build_record(src)

    # Files are uploaded in sorted order; poll the first one until its new content has arrived.
    first_url = storage.join(dest, "train", "shard00.bin")
    first_md5 = hashlib.md5((src / "train" / "shard00.bin").read_bytes()).hexdigest()
    command = [sys.executable, "-m", "trm.cli", "stage", str(src), dest, "--replace"]
    proc = subprocess.Popen(command, cwd=REPO_ROOT)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if hashlib.md5(storage.read_bytes(first_url)).hexdigest() == first_md5:
                break
        except FileNotFoundError:
            pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "trm stage finished before it could be interrupted"

    assert not storage.exists(storage.join(dest, MANIFEST_NAME))
    code, _, err = run_cli(["verify", dest], capsys)
    assert code == 2 and "MANIFEST.json not found" in err
    with pytest.raises(UserError, match="MANIFEST.json not found"):
        fetch_dataset(dest, tmp_path / "cache")

    summary = stage_dataset(src, dest)  # completing the interrupted replacement needs no --replace again
    assert summary["manifest_written"] and 1 <= summary["uploaded_files"] < shards
    verify_dataset(dest, download=True)
    assert source_files(fetch_dataset(dest, tmp_path / "cache")).items() >= source_files(src).items()


@pytest.mark.parametrize(
    ("fault", "expected"), [("flip", "altered: checksum"), ("truncate", "truncated"), ("delete", "missing")]
)
def test_damaged_file_is_reported_and_refused(
    dataset: Path, dest: str, tmp_path: Path, capsys, fault, expected
):
    stage_dataset(dataset, dest)
    damage(storage.join(dest, "train", "labels.npy"), fault)

    for download in (False, True):
        _, problems = find_problems(dest, download=download)
        assert len(problems) == 1 and problems[0].startswith(f"train/labels.npy: {expected}")
    code, _, err = run_cli(["verify", dest], capsys)
    assert code == 2 and "1 problems" in err and f"train/labels.npy: {expected}" in err
    with pytest.raises(UserError, match=f"train/labels.npy: {expected}"):
        fetch_dataset(dest, tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir()), "a refused download must leave nothing in the cache"

    stage_dataset(dataset, dest)  # restaging repairs it
    assert run_cli(["verify", dest], capsys)[0] == 0


def test_verify_reports_unexpected_files_and_altered_manifest(dataset: Path, dest: str, capsys):
    stage_dataset(dataset, dest)
    storage.write_text(storage.join(dest, "test", "stray.npy"), "not staged")
    code, _, err = run_cli(["verify", dest], capsys)
    assert code == 2 and "test/stray.npy: unexpected file, not in the manifest" in err

    manifest_url = storage.join(dest, MANIFEST_NAME)
    manifest = json.loads(storage.read_text(manifest_url))
    manifest["files"][0]["size"] += 1
    storage.write_text(manifest_url, json.dumps(manifest))
    code, _, err = run_cli(["verify", dest], capsys)
    assert code == 2 and "MANIFEST.json: entries_sha256 does not match" in err


def test_fetch_reuses_cache_and_refetches_when_dataset_changes(dataset: Path, dest: str, tmp_path: Path):
    cache = tmp_path / "cache"
    stage_dataset(dataset, dest)
    first = fetch_dataset(dest, cache)

    # A completed cached copy is used without reading the data files again: delete them from storage to prove it.
    damage(storage.join(dest, "dataset.json"), "delete")
    assert fetch_dataset(dest, cache) == first

    # A damaged cached copy is not trusted: it is downloaded again (and here storage is damaged, so refused).
    (first / "train" / "inputs.npy").write_bytes(b"short")
    with pytest.raises(UserError, match="dataset.json: missing"):
        fetch_dataset(dest, cache)

    (dataset / "dataset.json").write_text('{"seq_len": 81, "changed": true}')
    write_build_record(dataset)
    stage_dataset(dataset, dest, replace=True)
    second = fetch_dataset(dest, cache)
    assert second != first and (second / "dataset.json").read_text() == '{"seq_len": 81, "changed": true}'
    assert source_files(second).items() >= source_files(dataset).items()
    assert sorted(p.name for p in cache.iterdir()) == sorted([first.name, second.name]), (
        "no temporary dirs left"
    )


def test_concurrent_fetches_share_one_complete_copy(dataset: Path, dest: str, tmp_path: Path):
    stage_dataset(dataset, dest)
    cache = tmp_path / "cache"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(fetch_dataset(dest, cache))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(set(results)) == 1
    assert [p.name for p in cache.iterdir()] == [results[0].name]
    assert source_files(results[0]).items() >= source_files(dataset).items()


def test_fetch_from_a_local_path_verifies_rather_than_trusts(dataset: Path, tmp_path: Path):
    staged = tmp_path / "staged"
    stage_dataset(dataset, str(staged))  # a plain path, no scheme
    data = bytearray((staged / "test" / "inputs.npy").read_bytes())
    data[-1] ^= 0xFF
    (staged / "test" / "inputs.npy").write_bytes(bytes(data))
    with pytest.raises(UserError, match="test/inputs.npy: altered"):
        fetch_dataset(str(staged), tmp_path / "cache")


def test_cli_exit_codes_for_bad_input(tmp_path: Path, gcs_emulator: str, capsys):
    code, _, err = run_cli(["stage", str(tmp_path / "absent"), str(tmp_path / "out")], capsys)
    assert code == 2 and "absent does not exist" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(["stage", str(tmp_path / "empty"), str(tmp_path / "out")], capsys)
    assert code == 2 and "contains no files" in err
    make_dataset(tmp_path / "src")
    code, _, err = run_cli(["stage", str(tmp_path / "src"), "gs://no-such-bucket/ds"], capsys)
    assert code == 2 and "bucket gs://no-such-bucket of gs://no-such-bucket/ds does not exist" in err
    code, _, err = run_cli(["stage", str(tmp_path / "src"), "s3://bucket/ds"], capsys)
    assert code == 2 and "unsupported storage URL 's3://bucket/ds'" in err
    code, _, err = run_cli(["verify", "gs://no-such-bucket/ds"], capsys)
    assert code == 2 and "gs://no-such-bucket/ds/MANIFEST.json not found" in err
    assert not os.path.exists(tmp_path / "out")

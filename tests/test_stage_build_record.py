"""`trm stage` stages only what `trm build-dataset` wrote: the build record (MANIFEST.json) is checked first.

Each damage is done to a real built dataset after its build, and `trm stage` is run as a user runs it (the
installed `trm`, a subprocess) to a file:// folder and to the GCS emulator.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trm import cli, storage
from trm.data import stage as stage_module
from trm.data.manifest import MANIFEST_NAME
from trm.data.stage import stage_dataset
from trm.data.verify import fetch_dataset
from trm.errors import UserError

TRM = Path(sys.executable).with_name("trm")  # the console script of this environment
BUILD_ARGS = ["--source", "generate:8", "--num-aug", "2", "--seed", "5"]


def trm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(TRM), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("built") / "ds"
    assert cli.main(["build-dataset", *BUILD_ARGS, "--output-dir", str(out)]) == 0
    return out


@pytest.fixture
def dataset(built: Path, tmp_path: Path) -> Path:
    """A fresh copy of the built dataset, for a test to damage."""
    return Path(shutil.copytree(built, tmp_path / "ds"))


@pytest.fixture
def dest(storage_root: str) -> str:
    return storage.join(storage_root, "datasets", "ds")


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # in the array data, past the .npy header
    path.write_bytes(bytes(data))


def damage(root: Path, fault: str) -> str:
    """Damage the dataset at `root` after its build; returns the damaged file's path relative to `root`."""
    if fault == "flipped byte":
        flip_byte(root / "train" / "all__inputs.npy")
        return "train/all__inputs.npy"
    if fault == "appended garbage":
        with open(root / "train" / "all__labels.npy", "ab") as f:
            f.write(b"garbage")
        return "train/all__labels.npy"
    if fault == "replaced file":  # another valid array of the same shape and size
        inputs = np.load(root / "test" / "all__inputs.npy")
        np.save(root / "test" / "all__inputs.npy", np.ones_like(inputs))
        return "test/all__inputs.npy"
    if fault == "missing file":
        (root / "test" / "all__labels.npy").unlink()
        return "test/all__labels.npy"
    (root / "train" / "notes.txt").write_text("added after the build")
    return "train/notes.txt"


FAULTS = {
    "flipped byte": "altered: checksum md5",
    "appended garbage": "wrong size",
    "replaced file": "altered: checksum md5",
    "missing file": "missing",
    "extra file": "not in MANIFEST.json",
}


def assert_nothing_usable(dest: str) -> None:
    """No manifest at `dest`: `trm verify` fails and no host can fetch it."""
    assert not storage.exists(storage.join(dest, MANIFEST_NAME))
    done = trm("verify", dest)
    assert done.returncode == 2 and f"{dest}/MANIFEST.json not found" in done.stderr, done.stderr


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_damaged_dataset_is_refused_and_nothing_is_staged(dataset: Path, dest: str, fault: str):
    path = damage(dataset, fault)
    done = trm("stage", str(dataset), dest)
    assert done.returncode == 2 and not done.stdout, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"trm stage: error: {dataset}/{path}: {FAULTS[fault]}"), done.stderr
    assert f"no longer matches its build record {dataset}/MANIFEST.json" in done.stderr
    assert done.stderr.rstrip().endswith("nothing was staged: rebuild with trm build-dataset")
    assert storage.list_files(dest) == []  # not even the staging marker: nothing was written
    assert_nothing_usable(dest)
    # dataset-info, on the same folder, agrees that it is not the dataset that was built.
    assert cli.main(["dataset-info", str(dataset)]) == (2 if fault == "missing file" else 1)


def test_intact_dataset_stages_with_its_build_record(dataset: Path, dest: str, tmp_path: Path):
    done = trm("stage", str(dataset), dest)
    assert done.returncode == 0 and "13 files uploaded" in done.stdout, done.stdout + done.stderr
    record = (dataset / MANIFEST_NAME).read_bytes()
    assert storage.read_bytes(storage.join(dest, MANIFEST_NAME)) == record, "the build record, byte for byte"
    done = trm("verify", dest)
    assert done.returncode == 0 and "intact, 13 files" in done.stdout, done.stdout + done.stderr

    copy = fetch_dataset(dest, tmp_path / "cache")
    assert (copy / MANIFEST_NAME).read_bytes() == record
    assert cli.main(["dataset-info", str(copy)]) == 0, "a host's copy checks against the same record"


@pytest.mark.slow
def test_refused_restage_leaves_the_staged_dataset_as_it_was(dataset: Path, dest: str):
    stage_dataset(dataset, dest)
    staged = {rel: storage.read_bytes(storage.join(dest, rel)) for rel in storage.list_files(dest)}
    damage(dataset, "flipped byte")
    done = trm("stage", str(dataset), dest)
    assert done.returncode == 2 and "rebuild with trm build-dataset" in done.stderr, done.stderr
    assert {rel: storage.read_bytes(storage.join(dest, rel)) for rel in storage.list_files(dest)} == staged
    assert trm("verify", dest).returncode == 0

    # What the message says to do: the rebuild is byte-identical, so the restage transfers nothing.
    assert cli.main(["build-dataset", *BUILD_ARGS, "--output-dir", str(dataset), "--force"]) == 0
    done = trm("stage", str(dataset), dest)
    assert done.returncode == 0 and "already up to date, nothing transferred" in done.stdout, done.stderr


def test_file_changed_during_upload_is_refused_before_the_manifest(
    dataset: Path, dest: str, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
):
    """The check passes, then a file changes before its upload: the stored object is compared with the record.

    The hook only chooses the moment (after the check, just before the first file's upload); the upload
    and the comparison are the real ones.
    """
    real_upload, changed = stage_module._upload, []

    def change_then_upload(fs, src, root, entry, bar):
        if not changed:
            flip_byte(src / entry.path)
            changed.append(entry.path)
        real_upload(fs, src, root, entry, bar)

    monkeypatch.setattr(stage_module, "_upload", change_then_upload)
    assert cli.main(["stage", str(dataset), dest]) == 2
    err = capsys.readouterr().err
    assert f"{dataset}/{changed[0]} changed while staging it (stored copy altered: checksum" in err
    assert "no manifest was written: rebuild with trm build-dataset" in err and len(err.splitlines()) == 1
    assert_nothing_usable(dest)
    with pytest.raises(UserError, match="MANIFEST.json not found"):
        fetch_dataset(dest, tmp_path / "cache")

    monkeypatch.undo()
    flip_byte(dataset / changed[0])  # back to the built bytes: the rerun completes the staging
    assert cli.main(["stage", str(dataset), dest]) == 0
    assert trm("verify", dest).returncode == 0


@pytest.mark.slow
def test_folder_without_build_record_needs_accept_unrecorded(dataset: Path, dest: str):
    (dataset / MANIFEST_NAME).unlink()  # as an older trm, the original builder or a hand-made folder
    done = trm("stage", str(dataset), dest)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"{dataset}/MANIFEST.json not found: {dataset} has no build record" in done.stderr
    assert "rebuild with trm build-dataset, or pass --accept-unrecorded" in done.stderr
    assert storage.list_files(dest) == []

    done = trm("stage", "--accept-unrecorded", str(dataset), dest)
    assert done.returncode == 0 and "13 files uploaded" in done.stdout, done.stdout + done.stderr
    assert trm("verify", dest).returncode == 0


def test_invalid_build_record_or_several_damaged_files(built: Path, tmp_path: Path, capsys):
    dest = f"file://{tmp_path / 'staged'}"
    several = Path(shutil.copytree(built, tmp_path / "several"))
    damage(several, "flipped byte")
    damage(several, "extra file")
    assert cli.main(["stage", str(several), dest]) == 2
    err = capsys.readouterr().err
    assert f"{several}/train/all__inputs.npy: altered" in err and "(and 1 more files differ)" in err

    record_path = tmp_path / "edited" / MANIFEST_NAME
    shutil.copytree(built, record_path.parent)
    record = json.loads(record_path.read_text())
    record["files"][0]["size"] += 1  # edited by hand: its own hash no longer matches
    record_path.write_text(json.dumps(record))
    assert cli.main(["stage", str(record_path.parent), dest]) == 2
    err = capsys.readouterr().err
    assert f"{record_path}: entries_sha256 does not match the listed files" in err
    assert err.rstrip().endswith("rebuild with trm build-dataset")
    record_path.write_bytes(b"\xff\xfe not json")
    assert cli.main(["stage", str(record_path.parent), dest]) == 2
    assert f"{record_path}: not a readable dataset manifest" in capsys.readouterr().err
    assert not (tmp_path / "staged").exists()

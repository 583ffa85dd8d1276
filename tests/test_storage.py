"""trm.storage on a local folder and on a real GCS emulator (fake-gcs-server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from trm import storage
from trm.errors import UserError


def test_filesystem_resolves_each_kind_of_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    fs, path = storage.filesystem("data/ds")
    assert isinstance(fs, LocalFileSystem) and path == str(tmp_path / "data" / "ds")
    fs, path = storage.filesystem(f"file://{tmp_path}/ds/")
    assert isinstance(fs, LocalFileSystem) and path == str(tmp_path / "ds")
    fs, path = storage.filesystem("gs://bucket/some/prefix/")
    assert "gs" in fs.protocol and path == "bucket/some/prefix"


@pytest.mark.parametrize("url", ["s3://bucket/x", "gs:///no-bucket"])
def test_filesystem_rejects_unusable_urls(url: str):
    with pytest.raises(UserError, match="gs://BUCKET/PATH"):
        storage.filesystem(url)


def test_join():
    assert storage.join("gs://b/runs/", "r1", "/metrics.jsonl") == "gs://b/runs/r1/metrics.jsonl"
    assert storage.join("/tmp/x", "a/b") == "/tmp/x/a/b"


def test_gcs_filesystem_follows_the_emulator_variable(gcs_emulator: str, monkeypatch: pytest.MonkeyPatch):
    fs, _ = storage.filesystem("gs://bucket/x")
    assert fs._location == gcs_emulator
    # Instances are cached per endpoint: the same one is returned while the variable is unchanged...
    assert storage.filesystem("gs://other/y")[0] is fs
    # ...and a new endpoint (read at each call) gets its own instance.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:1")
    assert storage.filesystem("gs://bucket/x")[0]._location == "http://127.0.0.1:1"


def test_write_read_exists_and_list(storage_root: str):
    url = storage.join(storage_root, "run", "logs", "train.log")
    assert not storage.exists(url)
    storage.write_text(url, "first\n")
    storage.write_text(url, "second\n")  # overwrite
    storage.write_bytes(storage.join(storage_root, "run", "metrics.bin"), b"\x00\x01\xff")
    assert storage.exists(url)
    assert storage.read_text(url) == "second\n"
    assert storage.read_bytes(storage.join(storage_root, "run", "metrics.bin")) == b"\x00\x01\xff"
    assert storage.list_files(storage.join(storage_root, "run")) == ["logs/train.log", "metrics.bin"]
    assert storage.list_files(storage.join(storage_root, "nothing-here")) == []


def test_list_files_does_not_include_sibling_prefixes(storage_root: str):
    storage.write_text(storage.join(storage_root, "ds", "a.txt"), "a")
    storage.write_text(storage.join(storage_root, "ds2", "b.txt"), "b")
    assert storage.list_files(storage.join(storage_root, "ds")) == ["a.txt"]


def test_local_write_leaves_no_temporary_files(tmp_path: Path):
    storage.write_bytes(str(tmp_path / "out" / "x.bin"), b"abc")
    storage.write_bytes(str(tmp_path / "out" / "x.bin"), b"abcd")
    assert os.listdir(tmp_path / "out") == ["x.bin"]
    assert (tmp_path / "out" / "x.bin").read_bytes() == b"abcd"


def test_read_of_missing_file_raises_file_not_found(storage_root: str):
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.join(storage_root, "absent.txt"))

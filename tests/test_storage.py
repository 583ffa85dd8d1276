"""trm.storage on a local folder and on a real GCS emulator (fake-gcs-server), its URL checks, and gs:// commands
failing fast with one clear line when GCS cannot be reached or refuses us (loopback servers only)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from trm import gcs, storage
from trm.errors import UserError


def test_filesystem_resolves_each_kind_of_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    fs, path = storage.filesystem("data/ds")
    assert isinstance(fs, LocalFileSystem) and path == str(tmp_path / "data" / "ds")
    fs, path = storage.filesystem(f"file://{tmp_path}/ds/")
    assert isinstance(fs, LocalFileSystem) and path == str(tmp_path / "ds")
    fs, path = storage.filesystem("gs://bucket/some/prefix/")
    assert "gs" in fs.protocol and path == "bucket/some/prefix"


@pytest.mark.parametrize("url", ["s3://bucket/x", "gs:///no-bucket", "http://example.com/x", "gs://", ""])
def test_filesystem_rejects_unusable_urls(url: str):
    with pytest.raises(UserError, match="gs://BUCKET/PATH"):
        storage.filesystem(url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("gs://YOUR-BUCKET/trm-study", "placeholder.*docs/tpu.md"),
        ("gs://BUCKET/trm-study", "placeholder"),
        ("gs://My_Bucket/x", "not a valid GCS bucket name"),
        ("gs://ab/x", "not a valid GCS bucket name"),
        ("gs://-bucket/x", "not a valid GCS bucket name"),
        (f"gs://{'a' * 64}/x", "not a valid GCS bucket name"),
        ("gs://192.168.1.1/x", "IP address"),
        ("gs://google-data/x", "google"),
        ("out/a\nb", "control character"),
        ("-n/study", "starts with '-'.*write ./-n/study"),
    ],
)
def test_check_url_names_what_is_wrong(url: str, expected: str):
    with pytest.raises(UserError, match=expected):
        storage.check_url(url, "storage")


@pytest.mark.parametrize(
    "url",
    ["gs://my-bucket", "gs://my_bucket.example.com/a b/c;d", "file:///tmp/x", "out/s;touch x;echo", "a b"],
)
def test_check_url_accepts_buckets_and_any_local_path(url: str):
    assert storage.check_url(url) == url


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


# --------------------------------------------------------------------------- GCS unreachable or refusing us


def _trm(args: list[str], endpoint: str, cwd: Path) -> tuple[int, str, float]:
    env = {**os.environ, "STORAGE_EMULATOR_HOST": endpoint}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "trm.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["closed port", "401", "403"])
def test_gcs_commands_fail_fast_with_one_clear_line(failure, closed_gcs_endpoint, refusing_gcs, tmp_path):
    endpoint = closed_gcs_endpoint if failure == "closed port" else refusing_gcs(int(failure))
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "dataset.json").write_text("{}")
    commands = [
        ["verify", "gs://trm-offline/ds"],
        ["status", "--storage", "gs://trm-offline/study"],
        ["stage", "--accept-unrecorded", str(tmp_path / "ds"), "gs://trm-offline/ds"],  # hand-made: no record
    ]
    for command in commands:
        code, output, seconds = _trm(command, endpoint, tmp_path)
        print(f"{failure}: trm {command[0]} exit {code} in {seconds:.1f} s: {output.strip()}")
        assert code == 2, output
        assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output
        assert output.startswith(f"trm {command[0]}: error: ") and "gs://trm-offline" in output
        assert "check network/credentials" in output and "gcloud auth application-default login" in output
        assert ("could not reach" if failure == "closed port" else f"HTTP {failure}") in output
        assert seconds < 15, f"took {seconds:.1f} s"


def test_a_server_that_never_answers_times_out(monkeypatch: pytest.MonkeyPatch):
    """Every request has a read timeout: a server that accepts and then says nothing cannot hang a command."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes each connection; nobody ever reads or answers
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setattr(gcs, "READ_TIMEOUT_S", 0.5)
        monkeypatch.setattr(gcs, "TRANSIENT_DELAYS_S", (0.1,))
        gcs.BoundedGCSFileSystem.clear_instance_cache()  # instances made with the real timeout
        started = time.monotonic()
        try:
            with pytest.raises(gcs.StorageUnavailable, match="gs://trm-silent/x.*after 2 attempts.*Timeout"):
                storage.read_bytes("gs://trm-silent/x")
        finally:
            gcs.BoundedGCSFileSystem.clear_instance_cache()
        assert time.monotonic() - started < 5

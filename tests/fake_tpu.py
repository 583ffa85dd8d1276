"""pytest plugin: the fake `gcloud` (tests/fake_gcloud/gcloud) for tests of the tpu-vm launcher and profile.

Fixtures: `cloud` (the fake first on PATH; returns its state folder) and `tpu_bucket` (a bucket on the GCS
emulator per test module). Helpers: the live processes of a fake slice's hosts, waiting for them to exit, and
the gcloud calls the fake received.

Slices are found by name in /proc (every host process carries FAKE_TPU_NODE=NAME): tests that may run at the
same time, in different pytest-xdist workers, must use different slice names.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from trm import storage

FAKE_GCLOUD = Path(__file__).resolve().parent / "fake_gcloud"


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake gcloud first on PATH (run by this venv's python3), 2 hosts per slice; returns its state folder."""
    state = tmp_path / "cloud"
    path = [str(FAKE_GCLOUD), str(Path(sys.executable).parent), os.environ["PATH"]]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.setenv("FAKE_GCLOUD_STATE", str(state))
    monkeypatch.setenv("FAKE_TPU_WORKERS", "2")
    return state


@pytest.fixture(scope="module")
def tpu_bucket(gcs_emulator: str) -> str:
    """A new bucket on the emulator, shared by the tests of one module: "gs://NAME"."""
    name = f"tpu-{os.getpid()}-{int(time.time() * 1000)}"
    fs, _ = storage.filesystem(f"gs://{name}")
    fs.mkdir(name)
    return f"gs://{name}"


def node_pids(name: str) -> list[int]:
    """Live processes of the fake slice's hosts (the fake marks them with FAKE_TPU_NODE)."""
    marker = f"FAKE_TPU_NODE={name}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                if (proc / "stat").read_text().split(") ")[1][0] != "Z":
                    pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def wait_until_exited(name: str, timeout: float = 60) -> None:
    """Trainers exit by themselves shortly after writing _SUCCESS (the launcher returns at _SUCCESS)."""
    deadline = time.time() + timeout
    while node_pids(name) and time.time() < deadline:
        time.sleep(0.5)
    assert node_pids(name) == []


def gcloud_calls(state: Path) -> list[list[str]]:
    """Every argv the fake received, in order."""
    path = state / "argv.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

"""pytest plugin: the fake `gcloud` (tests/fake_gcloud/gcloud) for tests of the tpu-vm launcher and profile.

Fixtures: `cloud` (the fake first on PATH; returns its state folder), `fake_pypi` (the local folder of wheels
the fake's hosts install from instead of PyPI: uv, repacked from this venv's uv) and `tpu_bucket` (a bucket on
the GCS emulator per test module). Helpers: the live processes of a fake slice's hosts, waiting for them to
exit, the gcloud calls the fake received, and stub wheels standing in for PyPI packages.

Slices are found by name in /proc (every host process carries FAKE_TPU_NODE=NAME): tests that may run at the
same time, in different pytest-xdist workers, must use different slice names.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from trm import storage

FAKE_GCLOUD = Path(__file__).resolve().parent / "fake_gcloud"


def write_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], tag: str = "py3-none-any",
                requires: tuple[str, ...] = (), extras: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """A wheel of `files` (archive path -> content) with its dist-info, as pip and uv install it."""
    dist = f"{name.replace('-', '_')}-{version}"
    lines = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}"]
    lines += [f"Provides-Extra: {extra}" for extra in extras] + [f"Requires-Dist: {r}" for r in requires]
    files = {
        **files,
        f"{dist}.dist-info/METADATA": ("\n".join(lines) + "\n").encode(),
        f"{dist}.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n".encode(),
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for path, data in files.items()
    ]
    files[f"{dist}.dist-info/RECORD"] = ("\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n").encode()
    wheel = folder / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
        for path, data in files.items():
            info = zipfile.ZipInfo(path)
            info.external_attr = (stat.S_IFREG | (0o755 if "/scripts/" in path else 0o644)) << 16
            archive.writestr(info, data)
    return wheel


@pytest.fixture(scope="session")
def fake_pypi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake hosts' PyPI: a folder with a uv wheel, repacked from this venv's installed uv (the same release
    config/config.yaml pins); tests add stub wheels."""
    folder = tmp_path_factory.mktemp("fake-pypi")
    uv = metadata.distribution("uv")
    files = {}
    for entry in uv.files:
        if (
            entry.name in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")
            or "__pycache__" in entry.parts
        ):
            continue
        source = Path(uv.locate_file(entry))
        if entry.parts[0] == "..":  # bin/uv, bin/uvx: a wheel's scripts
            files[f"uv-{uv.version}.data/scripts/{entry.name}"] = source.read_bytes()
        elif not str(entry).startswith(f"uv-{uv.version}.dist-info/"):
            files[str(entry)] = source.read_bytes()
    write_wheel(folder, "uv", uv.version, files, tag="py3-none-manylinux_2_17_x86_64")
    return folder


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pypi: Path) -> Path:
    """The fake gcloud first on PATH (run by this venv's python3), 2 hosts per slice, their PyPI `fake_pypi`;
    returns its state folder."""
    state = tmp_path / "cloud"
    path = [str(FAKE_GCLOUD), str(Path(sys.executable).parent), os.environ["PATH"]]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.setenv("FAKE_GCLOUD_STATE", str(state))
    monkeypatch.setenv("FAKE_TPU_WORKERS", "2")
    monkeypatch.setenv("FAKE_PYPI", str(fake_pypi))
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

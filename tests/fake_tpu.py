"""pytest plugin: the fake `gcloud` (tests/fake_gcloud/gcloud) for tests of the tpu-vm launcher and profile.

Fixtures: `cloud` (the fake first on PATH; returns its state folder), `fake_pypi` (the local folder of wheels
the fake's hosts install from instead of PyPI: uv, repacked from this venv's uv) and `tpu_bucket` (a bucket on
the GCS emulator per test module). Helpers: the same outside pytest (`cloud_env`, `make_fake_pypi`; for
benchmarks/soak_chaos.py), a test profile of the workflow on the fake (`tpu_test_profile`), the live processes
of a fake slice's hosts, waiting for them to exit, the gcloud calls the fake received, and stub wheels standing
in for PyPI packages.

Slices are found by name in /proc (every host process carries FAKE_TPU_NODE=NAME): tests that may run at the
same time, in different pytest-xdist workers, must use different slice names.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from trm import storage

REPO = Path(__file__).resolve().parents[1]
FAKE_GCLOUD = REPO / "tests" / "fake_gcloud"


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


def make_fake_pypi(folder: Path) -> Path:
    """`folder` as the fake hosts' PyPI: a uv wheel, repacked from this venv's installed uv (the same release
    config/config.yaml pins)."""
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


@pytest.fixture(scope="session")
def fake_pypi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake hosts' PyPI (`make_fake_pypi`); tests add stub wheels."""
    return make_fake_pypi(tmp_path_factory.mktemp("fake-pypi"))


def cloud_env(state: Path, pypi: Path, environ: dict[str, str]) -> dict[str, str]:
    """`environ` with the fake gcloud first on PATH (run by this venv's python3), 2 hosts per slice, state in
    `state`, PyPI `pypi`, and the hosts sharing `environ`'s XLA compilation cache (tests/conftest.py's)."""
    path = [str(FAKE_GCLOUD), str(Path(sys.executable).parent), environ["PATH"]]
    env = {
        **environ,
        "PATH": os.pathsep.join(path),
        "FAKE_GCLOUD_STATE": str(state),
        "FAKE_TPU_WORKERS": "2",
        "FAKE_PYPI": str(pypi),
    }
    if "JAX_COMPILATION_CACHE_DIR" in environ:
        env["FAKE_TPU_XLA_CACHE"] = environ["JAX_COMPILATION_CACHE_DIR"]
    return env


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pypi: Path) -> Path:
    """The fake gcloud first on PATH (run by this venv's python3), 2 hosts per slice, their PyPI `fake_pypi`;
    returns its state folder."""
    state = tmp_path / "cloud"
    for key, value in cloud_env(state, fake_pypi, dict(os.environ)).items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    return state


@pytest.fixture(scope="module")
def tpu_bucket(gcs_emulator: str) -> str:
    """A new bucket on the emulator, shared by the tests of one module: "gs://NAME"."""
    name = f"tpu-{os.getpid()}-{int(time.time() * 1000)}"
    fs, _ = storage.filesystem(f"gs://{name}")
    fs.mkdir(name)
    return f"gs://{name}"


def tpu_test_profile(
    root: Path,
    storage_url: str,
    slices: tuple[str, ...],
    lock_dir: Path,
    tpu: dict | None = None,
    **study: Any,
) -> Path:
    """ROOT/profiles/tpu-test: profiles/tpu-v4-64 with the same keys, on the fake cloud and the emulator: a pool
    of `slices` of 2 hosts x 2 devices (FAKE_TPU_DEVICES=2 in the environment), smoke scale, its storage
    `storage_url`, fast polls; `study` sets keys of its study.yaml and `tpu` keys of its launch.tpu."""
    profile = root / "profiles" / "tpu-test"
    shutil.copytree(REPO / "profiles" / "tpu-v4-64", profile)
    settings = yaml.safe_load((profile / "config.yaml").read_text())
    settings["resources"]["training_jobs"] = len(slices)  # one training job per slice of the pool
    (profile / "config.yaml").write_text(yaml.safe_dump(settings))
    values = yaml.safe_load((profile / "study.yaml").read_text())
    values.update(scale="smoke", storage=storage_url, **study)
    values["launch"].update(hosts=2, devices_per_host=2)
    values["launch"]["tpu"].update(
        slices=[*slices],
        project="trm-test-project",
        python=sys.executable,  # a local Python 3.11 with the dependencies for the stock-image hosts' venv
        install_dependencies=False,
        coordinator_port=0,
        lock_dir=str(lock_dir),
        poll_seconds=0.5,
        stop_grace_seconds=30,
        **(tpu or {}),
    )
    (profile / "study.yaml").write_text(yaml.safe_dump(values))
    return profile


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

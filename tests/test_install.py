"""The Makefile's install steps on a machine's interpreters, and the optional extras named where they are needed:
an unsupported Python is refused with one line, a failed install and a venv made by an unsupported Python leave
no .venv/ behind (the next `make` starts clean). Each test works on a copy of the Makefile and pyproject.toml in
its own folder, and no test reaches a package index."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON_310 = '#!/bin/sh\n[ "$1" = --version ] && { echo "Python 3.10.13"; exit 0; }\nexit 1\n'


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path)
    return tmp_path


def _make(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    # No package source at all: pip fails at once instead of downloading (PIP_CONFIG_FILE hides this machine's).
    environ = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", **env}
    environ.pop("PIP_FIND_LINKS", None)
    return subprocess.run(
        ["make", "-C", str(folder), *args], env=environ, capture_output=True, text=True, timeout=300
    )


def _fake_python(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PYTHON_310)
    path.chmod(0o755)
    return path


def test_an_unsupported_python_is_refused_with_one_line_and_no_venv(checkout: Path, tmp_path: Path):
    old = _fake_python(tmp_path / "bin" / "python3")
    done = _make(checkout, "install", f"PYTHON={old}")
    assert done.returncode != 0
    assert f"make: {old} is not Python 3.11-3.13 (Python 3.10.13)" in done.stderr, done.stderr
    assert "PYTHON=/path/to/python3.12" in done.stderr
    assert not (checkout / ".venv").exists()


def test_a_venv_left_by_an_unsupported_python_is_removed(checkout: Path):
    _fake_python(checkout / ".venv" / "bin" / "python")
    done = _make(checkout, "install", f"PYTHON={sys.executable}")
    assert done.returncode != 0
    assert "was made with Python 3.10.13, not 3.11-3.13: removed it; run make again" in done.stderr, (
        done.stderr
    )
    assert not (checkout / ".venv").exists()


@pytest.mark.slow
def test_a_failed_install_removes_the_venv_it_was_building(checkout: Path):
    done = _make(checkout, "install", f"PYTHON={sys.executable}")  # no package source: pip cannot install
    assert done.returncode != 0
    assert "make: install failed; .venv removed" in done.stderr, done.stdout + done.stderr
    assert not (checkout / ".venv").exists()


def test_make_picks_a_supported_interpreter_by_itself(checkout: Path):
    done = _make(checkout, "-n", "install")  # -n: print the commands only
    assert done.returncode == 0, done.stderr
    chosen = done.stdout.split(" -m venv ")[0].split()[-1]
    version = subprocess.run(
        [chosen, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    assert version.stdout.strip() in ("(3, 11)", "(3, 12)", "(3, 13)"), (chosen, version)


@pytest.mark.slow
def test_train_with_wandb_but_without_the_package_names_the_extra_before_any_work(tmp_path: Path):
    assert subprocess.run([sys.executable, "-c", "import wandb"], capture_output=True).returncode != 0
    trm = str(Path(sys.executable).with_name("trm"))
    done = subprocess.run(
        [trm, "train", "--wandb", "--config", str(tmp_path / "none.json"), "--data", str(tmp_path),
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(
        "--wandb needs the wandb package: pip install -e '.[wandb]' (or pip install 'trm-study[wandb]')"
    )
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()

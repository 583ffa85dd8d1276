"""Shared pytest fixtures."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["gcs_emulator", "fake_tpu"]  # GCS emulator and fake gcloud fixtures (tests/*.py)

# One persistent XLA compilation cache for the session, inherited by every subprocess (trainers, hosts): the
# tests compile the same tiny programs many times, and on 2 cores compiling is much of their time. Set before
# anything imports jax. A fresh folder per session, so no run depends on an earlier one.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="trm-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Skip LLVM's expensive optimisation passes: the tests' programs are tiny, so compiling costs more than running
# (a smoke training: 25 s -> 21 s, same accuracy). Every comparison in the suite runs under the same flags.
if "xla_llvm_disable_expensive_passes" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        f"{os.environ.get('XLA_FLAGS', '')} --xla_llvm_disable_expensive_passes=true".strip()
    )

# Test modules by decreasing run time, run first: with `pytest -n 2 --dist loadfile` (make test) each module goes
# to one worker, and starting with the longest ones lets the two workers finish at about the same time.
LONGEST_MODULES = [
    "test_multihost.py",
    "test_trainer.py",
    "test_tpu_profile.py",
    "test_tpu_vm.py",
    "test_workflow.py",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
# Real hard puzzles live beside the checkout (../shared/data/sudoku); they are not part of the project.
SUDOKU_DATA = REPO_ROOT.parent / "shared" / "data" / "sudoku"


@pytest.fixture(scope="session")
def sudoku_data() -> Path:
    """Folder of real Sudoku-Extreme style CSVs; skips the test where it is absent (a user's fresh clone)."""
    if not (SUDOKU_DATA / "magictour_top1465.csv.gz").exists():
        pytest.skip(f"real Sudoku puzzles not found at {SUDOKU_DATA}")
    return SUDOKU_DATA


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order otherwise kept

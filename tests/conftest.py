"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["gcs_emulator"]  # GCS emulator fixtures (tests/gcs_emulator.py)

REPO_ROOT = Path(__file__).resolve().parents[1]
# Real hard puzzles live beside the checkout (../shared/data/sudoku); they are not part of the project.
SUDOKU_DATA = REPO_ROOT.parent / "shared" / "data" / "sudoku"


@pytest.fixture(scope="session")
def sudoku_data() -> Path:
    """Folder of real Sudoku-Extreme style CSVs; skips the test where it is absent (a user's fresh clone)."""
    if not (SUDOKU_DATA / "magictour_top1465.csv.gz").exists():
        pytest.skip(f"real Sudoku puzzles not found at {SUDOKU_DATA}")
    return SUDOKU_DATA

"""Helpers of the tests that run the workflow: a copy of it to edit and run, and a dry run's cost estimates."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def copy_workflow(root: Path) -> Path:
    """`root` (created) holding a copy of the workflow and its config, to edit and run in isolation."""
    root.mkdir(parents=True)
    shutil.copy(REPO / "Snakefile", root)
    for folder in ("workflow", "config", "profiles"):
        shutil.copytree(REPO / folder, root / folder)
    return root


def estimates(output: str, part: str) -> dict[str, float]:
    """Per job of a dry run's output: the device-hours on its line labelled `part` (training or evaluation),
    one of the two lines after the job's "train EXP: estimated" line."""
    lines = output.splitlines()
    found = {}
    for i, line in enumerate(lines):
        if ": train " in line and ": estimated on" in line:
            (labelled,) = [x for x in lines[i + 1 : i + 3] if x.strip().startswith(f"{part}:")]
            found[line.split("train ")[1].split(":")[0]] = float(labelled.split(":")[1].split()[0])
    return found

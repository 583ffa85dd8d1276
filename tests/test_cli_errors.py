"""Bad input met on first steps gets one line naming the file and what to do: `trm` run as a user runs it (the
installed console script, a subprocess), exit code 2, no traceback, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from workflow_support import runs_table

from trm.config import EXPERIMENTS_DIR
from trm.study.groups import GROUPS_PATH

TRM = Path(sys.executable).with_name("trm")  # the console script of this environment


def refused(*args: str) -> str:
    """Run `trm ARGS`, check it fails as bad input in one line, and return that line."""
    done = subprocess.run([str(TRM), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.slow
def test_import_torch_names_a_file_that_is_no_checkpoint(tmp_path):
    import torch  # the test extra installs it

    out = tmp_path / "out"
    config = str(EXPERIMENTS_DIR / "exp01a.yaml")
    binary = tmp_path / "random.bin"
    binary.write_bytes(bytes(range(256)) * 40)
    text = tmp_path / "notes.txt"
    text.write_text("e" * 200 + "\n")
    for path in (binary, text):
        line = refused("import-torch", str(path), "--config", config, "--out", str(out))
        assert line == (
            f"trm import-torch: error: {path}: not a PyTorch checkpoint (torch.save writes a zip archive; "
            "this file is not one)"
        )
    # A real torch.save file holding more than tensors: torch's weights_only refusal comes down to its reason.
    objects = tmp_path / "objects.pt"
    torch.save({"weights": torch.zeros(2), "optimizer": torch.optim.SGD([torch.zeros(1)], lr=0.1)}, objects)
    line = refused("import-torch", str(objects), "--config", config, "--out", str(out))
    assert line.startswith(f"trm import-torch: error: {objects}: not a readable PyTorch checkpoint (")
    assert "torch.optim.sgd.SGD" in line and "weights_only" not in line
    assert line.endswith("expected the original trainer's torch.save'd state_dict")
    assert not out.exists()


def test_verdicts_names_a_cell_that_is_not_a_number(tmp_path):
    table = tmp_path / "table.csv"
    rows = {
        "id": ["exp07a", "exp07b", "exp07c"],
        "test_exact_accuracy": ["0.8", "0.7x", ""],
        "step_time_s": [1, 2, 3],
    }
    runs_table(pd.DataFrame(rows), "exp07").to_csv(table, index=False)
    out = tmp_path / "verdicts"
    line = refused(
        "verdicts",
        "--table",
        str(table),
        "--groups",
        str(GROUPS_PATH),
        "--scale",
        "paper",
        "--test-puzzles",
        "423168",
        "--output",
        str(out),
    )
    assert line == (
        f"trm verdicts: error: {table}: column test_exact_accuracy, row exp07b: '0.7x' is not a number "
        "(an empty cell means not measured; rewrite the table with `trm aggregate`)"
    )
    assert not out.exists()


def test_config_resolved_on_an_experiment_file_says_so_once(tmp_path):
    out = tmp_path / "config.json"
    path = EXPERIMENTS_DIR / "exp01a.yaml"
    line = refused("config", "exp01a", "--resolved", "--output", str(out))
    assert line.startswith(f"trm config: error: {path}: not a resolved config (missing 'data', ")
    assert line.count("'") == 6 and " more); " in line  # three keys named, the rest counted
    assert "`trm config FILE` without --resolved" in line
    assert not out.exists()

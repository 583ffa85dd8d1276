"""Bad input met on first steps gets one line naming the file and what to do: `trm` run as a user runs it (the
installed console script, a subprocess), exit code 2, no traceback, nothing written."""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from workflow_support import runs_table

from trm.cli import COMMANDS, _build_parser
from trm.cli import main as trm
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


def test_verdicts_refuses_a_negative_count_of_test_puzzles(tmp_path):
    line = refused(
        *("verdicts", "--table", str(tmp_path / "t.csv"), "--groups", str(GROUPS_PATH), "--scale", "smoke"),
        *("--test-puzzles", "-5", "--output", str(tmp_path / "v")),
    )
    assert line == (
        "trm verdicts: error: argument --test-puzzles: expected an integer >= 1, got '-5' (see trm verdicts --help)"
    )
    assert not (tmp_path / "v").exists()


def test_every_numeric_option_refuses_a_negative_count_nan_and_inf_in_one_line(capsys):
    """Every number a command takes is a count, a size, a seed or a duration: each option parses it with
    trm.errors.number, so that -5, nan and inf are refused in one line naming the option, before any work."""
    options = {}
    for name in COMMANDS:
        sub = next(a for a in _build_parser(name)._actions if isinstance(a, argparse._SubParsersAction))
        for action in sub.choices[name]._actions:
            assert action.type not in (int, float), (
                f"trm {name} {action.option_strings}: use trm.errors.number"
            )
            if getattr(action.type, "__qualname__", "").startswith("number."):
                options.setdefault(name, []).append(action.option_strings[0])
    assert len(options) >= 10 and "--test-puzzles" in options["verdicts"]
    for name, flags in options.items():
        for flag, value in itertools.product(flags, ("-5", "nan", "inf")):
            assert trm([name, flag, value]) == 2
            err = capsys.readouterr().err
            assert (
                err.startswith(f"trm {name}: error: argument {flag}: expected ") and err.count("\n") == 1
            ), err
            assert err.endswith(f", got '{value}' (see trm {name} --help)\n"), err


def test_the_systems_refusal_of_a_path_is_one_line_naming_it(tmp_path):
    """An OSError the user can fix (a folder given for a file, a full disk, a read-only place) is one line naming
    the path and what to do, wherever a command meets it (trm/cli.py)."""
    assert refused("config", str(tmp_path)) == (
        f"trm config: error: {tmp_path}: Is a directory; give the path of a file in it"
    )


def test_a_table_cut_short_is_refused_not_read_as_unmeasured_cells(tmp_path):
    table = tmp_path / "table.csv"
    rows = {"id": ["exp07a", "exp07b"], "test_exact_accuracy": [0.8, 0.7], "step_time_s": [1, 2]}
    text = runs_table(pd.DataFrame(rows), "exp07").to_csv(index=False)
    table.write_text(text[: len(text) - 20])  # the last row loses its last cells
    line = refused(
        *("verdicts", "--table", str(table), "--groups", str(GROUPS_PATH), "--scale", "smoke"),
        *("--test-puzzles", "16", "--output", str(tmp_path / "v")),
    )
    assert line == (
        f"trm verdicts: error: {table}: damaged (cut short, or edited?): its last line is incomplete; delete it "
        "and rerun snakemake (or `trm aggregate`), which writes it again"
    )

"""Boards other than 9x9 through the commands (`trm smoke-pool`, `trm build-dataset`, `trm dataset-info`; `trm
train` learns a 6x6 board in tests/test_trainer.py), and 9x9 outputs byte-identical to those of the code before
other boards existed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trm.cli import main as trm
from trm.data import format as fmt
from trm.data.board import Board
from trm.data.sudoku import consistent, read_csv, valid_solutions

# 9x9 pools and a build made by trm at 721911a, before other boards (tests/data/sudoku/README.md).
REFERENCE = Path(__file__).resolve().parent / "data" / "sudoku" / "reference_9x9"


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("pool_minimal", ["--train", "3", "--test", "1", "--seed", "0"]),
        ("pool_blanks30", ["--train", "3", "--test", "1", "--seed", "1", "--blanks", "30"]),
    ],
)
def test_9x9_pools_are_byte_identical_to_the_code_before_boards(tmp_path, name, flags):
    assert trm(["smoke-pool", *flags, "--output-dir", str(tmp_path)]) == 0
    for file in ("train.csv", "test.csv"):
        assert (tmp_path / file).read_bytes() == (REFERENCE / name / file).read_bytes(), file


def test_9x9_build_is_byte_identical_to_the_code_before_boards(tmp_path, sudoku_data):
    source = sudoku_data / "magictour_top1465_first400.csv.gz"
    args = ["--subsample-size", "6", "--test-subsample-size", "4", "--num-aug", "5", "--seed", "1"]
    assert trm(["build-dataset", "--source", str(source), *args, "--output-dir", str(tmp_path / "ds")]) == 0
    expected = REFERENCE / "dataset"
    files = sorted(p.relative_to(expected) for p in expected.rglob("*") if p.is_file())
    assert len(files) == 13
    for rel in files:
        built, made_before = tmp_path / "ds" / rel, expected / rel
        if rel.name == "dataset.json":  # the same, but for the trm version that wrote it
            before, now = json.loads(made_before.read_text()), json.loads(built.read_text())
            assert now.pop("builder").startswith("trm ") and before.pop("builder").startswith("trm ")
            assert now == before, rel
        else:
            assert built.read_bytes() == made_before.read_bytes(), rel


def _check_dataset(out: Path, board: Board, train_examples: int, test_examples: int) -> None:
    """Every split's shapes, tokens and metadata are of `board`, and every label a solved grid of it."""
    for split, examples in (("train", train_examples), ("test", test_examples)):
        data = fmt.load_split(out, split)
        assert data.inputs.shape == data.labels.shape == (examples, board.cells)
        assert (data.metadata["seq_len"], data.metadata["vocab_size"]) == (board.cells, board.n + 2)
        assert data.inputs.min() >= 1 and data.labels.min() >= 2 and data.labels.max() == board.n + 1
        labels, inputs = np.asarray(data.labels) - 1, np.asarray(data.inputs) - 1
        assert valid_solutions(labels).all() and consistent(inputs, labels).all()


def test_a_6x6_pool_builds_a_6x6_dataset(tmp_path, capsys):
    pool, out = tmp_path / "pool", tmp_path / "ds"
    flags = ["--train", "12", "--test", "4", "--seed", "3", "--blanks", "20", "--output-dir", str(pool)]
    assert trm(["smoke-pool", "--board", "6x6", *flags]) == 0
    puzzles = read_csv(pool / "train.csv")
    assert puzzles.board == Board.of_size(6) and ((puzzles.questions == 0).sum(axis=1) == 20).all()
    # The board is the CSV's (36 cells), declared or not: the same bytes.
    build = ["build-dataset", "--source", str(pool), "--num-aug", "3", "--seed", "5"]
    assert trm([*build, "--output-dir", str(out)]) == 0
    assert trm([*build, "--board", "6x6", "--output-dir", str(tmp_path / "declared")]) == 0
    for path in (p for p in out.rglob("*") if p.is_file()):
        assert path.read_bytes() == (tmp_path / "declared" / path.relative_to(out)).read_bytes()
    _check_dataset(out, Board.of_size(6), train_examples=12 * 4, test_examples=4)
    capsys.readouterr()
    assert trm(["dataset-info", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("board: 6x6, 2x3 boxes (seq_len 36, vocab 8)\n")
    assert "inputs               shape [48, 36]       dtype uint8" in printed


def test_generate_source_makes_puzzles_of_the_board(tmp_path, capsys):
    out = tmp_path / "ds"
    assert trm(["build-dataset", "--source", "generate:8", "--board", "4x4", "--num-aug", "2", "--output-dir", str(out)]) == 0  # fmt: skip
    _check_dataset(out, Board.of_size(4), train_examples=8 * 3, test_examples=2)
    assert "4x4 board (2x2 boxes), train 24 examples" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["smoke-pool", "--board", "7x7", "--train", "1", "--test", "1"], "a 7x7 board has no box shape: the boards are"),
        (["smoke-pool", "--board", "6x6", "--blanks", "29", "--train", "1", "--test", "1"], "--blanks must be 1 to 28 on a 6x6 board"),
        (["build-dataset", "--source", "generate:4", "--board", "5x5"], "a 5x5 board has no box shape"),
        (["build-dataset", "--source", "{pool}", "--board", "9x9"], "{pool}/train.csv, line 2: question has 16 characters, expected 81 (a 9x9 board, as declared)"),
        (["build-dataset", "--source", "{pool}/train.csv", "--test-source", "{nine}"], "{nine}: puzzles of a 9x9 board, but the train split's ({pool}/train.csv) are 4x4"),
    ],
)  # fmt: skip
def test_boards_that_do_not_fit_are_refused_in_one_line(tmp_path, capsys, command, message):
    pool, nine, out = tmp_path / "pool", tmp_path / "nine.csv", tmp_path / "out"
    assert (
        trm(["smoke-pool", "--board", "4x4", "--train", "3", "--test", "1", "--output-dir", str(pool)]) == 0
    )
    nine.write_bytes((REFERENCE / "pool_minimal" / "train.csv").read_bytes())
    capsys.readouterr()
    names = {"pool": pool, "nine": nine}
    assert trm([*(arg.format(**names) for arg in command), "--output-dir", str(out)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"trm {command[0]}: error: {message.format(**names)}")
    assert not out.exists()

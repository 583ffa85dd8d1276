"""Grid checks and CSV parsing details of trm.data.sudoku."""

from __future__ import annotations

import gzip

import numpy as np

from trm.data.generate import generate_puzzles
from trm.data.sudoku import MISSING_RATING, consistent, read_csv, valid_solutions


def test_valid_solutions_checks_rows_columns_and_boxes():
    solved = generate_puzzles(1, seed=1).answers
    latin = ((np.arange(9)[:, None] + np.arange(9)[None, :]) % 9 + 1).reshape(
        1, 81
    )  # rows, columns fine; boxes not
    rows_only = np.tile(np.arange(1, 10), 9).reshape(1, 81)  # every row 1..9; columns constant
    assert valid_solutions(np.concatenate([solved, latin, rows_only]).astype(np.uint8)).tolist() == [
        True,
        False,
        False,
    ]


def test_consistent_ignores_blanks_only():
    answer = generate_puzzles(1, seed=1).answers
    question = answer.copy()
    question[0, :40] = 0
    assert consistent(question, answer).all()
    question[0, 50] = question[0, 50] % 9 + 1
    assert not consistent(question, answer).any()


def test_read_csv_gz_any_column_order_and_blank_ratings(tmp_path):
    puzzles = generate_puzzles(2, seed=4)
    q = ["".join(str(v) if v else "." for v in row) for row in puzzles.questions]
    a = ["".join(map(str, row)) for row in puzzles.answers]
    text = f"answer,rating,question,source\n{a[0]},7,{q[0]},x\n\n{a[1]},,{q[1]},y\n"
    path = tmp_path / "p.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    read = read_csv(path)
    np.testing.assert_array_equal(read.questions, puzzles.questions)
    np.testing.assert_array_equal(read.answers, puzzles.answers)
    assert read.ratings.tolist() == [7, MISSING_RATING]

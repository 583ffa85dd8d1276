"""Grid checks and CSV parsing details of trm.data.sudoku."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from trm.data.board import SUDOKU, Board, parse_board
from trm.data.generate import generate_puzzles
from trm.data.sudoku import MISSING_RATING, Puzzles, consistent, read_csv, valid_solutions
from trm.errors import UserError


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


BOARDS = [Board.of_size(n) for n in (4, 6, 8, 9)]


@pytest.mark.parametrize(("n", "box"), [(4, "2x2"), (6, "2x3"), (8, "2x4"), (9, "3x3")])
def test_boards_and_their_box_shapes(n, box):
    board = parse_board(f"{n}x{n}")
    assert (board.n, board.box, board.cells, board.vocab_size) == (n, box, n * n, n + 2)
    assert Board.from_cells(n * n) == board and board.box_rows <= board.box_cols
    assert (str(board), SUDOKU) == (f"{n}x{n} board ({box} boxes)", Board(9, 3, 3))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("7x7", "a 7x7 board has no box shape: the boards are 4x4 (2x2 boxes), 6x6 (2x3 boxes), 8x8"),
        ("5x5", "a 5x5 board has no box shape"),
        ("3x3", "a 3x3 board has no box shape"),
        ("12x12", "a 12x12 board is not supported: its digits would not fit in one character"),
        ("6", "--board '6': expected NxN, e.g. 6x6"),
        ("6x4", "--board '6x4': expected NxN"),
        ("sixbysix", "--board 'sixbysix': expected NxN"),
    ],
)
def test_board_names_without_a_box_shape_are_refused(text, message):
    with pytest.raises(UserError) as caught:
        parse_board(text)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


@pytest.mark.parametrize("board", BOARDS, ids=lambda board: board.name)
def test_valid_solutions_checks_the_boxes_of_each_board(board):
    n = board.n
    solved = generate_puzzles(1, seed=1, board=board).answers
    latin = ((np.arange(n)[:, None] + np.arange(n)[None, :]) % n + 1).reshape(1, -1)  # rows, columns fine
    assert valid_solutions(np.concatenate([solved, latin]).astype(np.uint8)).tolist() == [True, False]
    # The boxes are r rows x c columns, not c x r: a 6x6 grid valid in 3x2 boxes is not a 2x3 one's solution.
    transposed = solved.reshape(n, n).T.reshape(1, -1)
    assert valid_solutions(transposed).tolist() == [board.box_rows == board.box_cols]


def _rows(puzzles: Puzzles) -> list[tuple[str, str]]:
    return [
        ("".join(str(v) if v else "." for v in q), "".join(map(str, a)))
        for q, a in zip(puzzles.questions, puzzles.answers, strict=True)
    ]


def _csv(path, rows: list[tuple[str, str]]):
    path.write_text("\n".join(["source,question,answer,rating", *(f"g,{q},{a},1" for q, a in rows)]) + "\n")
    return path


@pytest.mark.parametrize("board", BOARDS, ids=lambda board: board.name)
def test_read_csv_takes_the_board_of_the_first_puzzle_or_the_one_declared(tmp_path, board):
    puzzles = generate_puzzles(3, seed=4, board=board)
    path = _csv(tmp_path / "p.csv", _rows(puzzles))
    for read in (read_csv(path), read_csv(path, board)):
        assert read.board == board
        np.testing.assert_array_equal(read.questions, puzzles.questions)
        np.testing.assert_array_equal(read.answers, puzzles.answers)


SIX = _rows(generate_puzzles(2, seed=4, board=Board.of_size(6)))
NINE = _rows(generate_puzzles(1, seed=4))
BAD_BOARD_ROWS = {
    "a 9x9 row after a 6x6 one": (
        [SIX[0], NINE[0]],
        None,
        "line 3: question has 81 characters, expected 36 (a 6x6 board, the first puzzle's size)",
    ),
    "a question digit above 6": (
        [SIX[0], ("7" + SIX[1][0][1:], SIX[1][1])],
        None,
        "line 3: question has '7' at position 1; allowed: '.' or 1-6 (a 6x6 board, the first puzzle's size)",
    ),
    "an answer digit above 6": (
        [SIX[0], (SIX[1][0], "9" + SIX[1][1][1:])],
        None,
        "line 3: answer has '9' at position 1; allowed: 1-6 (a 6x6 board",
    ),
    "a 6x6 row on a declared 9x9 board": (
        SIX,
        SUDOKU,
        "line 2: question has 36 characters, expected 81 (a 9x9 board, as declared)",
    ),
    "a first row of no board's size": (
        [("." * 25, "1" * 25)],
        None,
        "line 2: question has 25 characters; 25 cells are no board's: the boards are 4x4 (2x2 boxes), 6x6",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BOARD_ROWS))
def test_read_csv_refuses_rows_of_another_board_in_one_line(tmp_path, case):
    rows, board, message = BAD_BOARD_ROWS[case]
    path = _csv(tmp_path / "p.csv", rows)
    with pytest.raises(UserError) as caught:
        read_csv(path, board)
    assert str(caught.value).startswith(f"{path}, {message}") and "\n" not in str(caught.value)

"""The vectorised Sudoku symmetries of each board against a literal per-example transcription of the original
builder's per-example draws."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trm.data.augment import (
    apply_augmentations,
    augment,
    col_permutations,
    draw_augmentations,
    group_rng,
    row_permutations,
)
from trm.data.board import SUDOKU, Board
from trm.data.generate import generate_puzzles
from trm.data.sudoku import consistent, valid_solutions

BOARDS = [Board.of_size(n) for n in (4, 6, 8, 9)]


@pytest.fixture(scope="module", params=BOARDS, ids=lambda board: board.name)
def board_puzzles(request):
    return request.param, generate_puzzles(4, seed=2, board=request.param)


def _reference(grid: np.ndarray, digit_map, transpose, row_perm, col_perm) -> np.ndarray:
    """One example, step by step as the spec words it: transpose, then new[i, j] = old[row_perm[i], col_perm[j]],
    then digits."""
    n = len(row_perm)
    board = grid.reshape(n, n)
    if transpose:
        board = board.T
    board = board[np.asarray(row_perm)][:, np.asarray(col_perm)]
    return np.asarray(digit_map)[board].reshape(n * n)


def test_vectorised_application_matches_reference(board_puzzles):
    board, puzzles = board_puzzles
    aug = draw_augmentations(np.random.default_rng(1), 60, board)
    group = np.arange(60) % 4
    new_q, new_a = apply_augmentations([puzzles.questions, puzzles.answers], group, aug)
    for m in range(60):
        draw = (aug.digit_map[m], aug.transpose[m], aug.row_perm[m], aug.col_perm[m])
        np.testing.assert_array_equal(new_q[m], _reference(puzzles.questions[group[m]], *draw))
        np.testing.assert_array_equal(new_a[m], _reference(puzzles.answers[group[m]], *draw))
    # Only square boxes transpose: a transposed 2x3 box is a 3x2 one.
    if board.box_rows == board.box_cols:
        assert aug.transpose.any() and not aug.transpose.all()
    else:
        assert not aug.transpose.any()


def _lines_stay_in_their_band(perm: np.ndarray, size: int) -> bool:
    """Each run of `size` new lines comes from one old band of `size` lines."""
    bands = perm.reshape(len(perm), -1, size) // size
    return bool((bands == bands[:, :, :1]).all())


@pytest.mark.parametrize("board", BOARDS, ids=lambda board: board.name)
def test_draws_follow_the_spec_distribution(board):
    aug = draw_augmentations(np.random.default_rng(0), 200_000, board)
    n, r, c = board.n, board.box_rows, board.box_cols
    assert (aug.digit_map[:, 0] == 0).all()
    assert (np.sort(aug.digit_map[:, 1:], axis=1) == np.arange(1, n + 1)).all()
    assert abs(aug.transpose.mean() - (0.5 if r == c else 0.0)) < 0.01
    # Rows shuffle within the n / r bands of r rows, columns within the n / c stacks of c columns.
    for perm, size, table in (
        (aug.row_perm, r, row_permutations(board)),
        (aug.col_perm, c, col_permutations(board)),
    ):
        assert (np.sort(perm, axis=1) == np.arange(n)).all()
        assert _lines_stay_in_their_band(perm, size)
        # Every band-and-line permutation occurs, about equally often.
        groups = n // size
        assert len(table) == math.factorial(groups) * math.factorial(size) ** groups
        counts = np.unique(perm.astype(np.int64) @ (10 ** np.arange(n)), return_counts=True)[1]
        assert len(counts) == len(table)
        assert counts.min() > 0.6 * counts.mean() and counts.max() < 1.4 * counts.mean()  # about 5 sigma
    assert len(row_permutations(SUDOKU)) == 1296


def test_augment_groups_keep_original_first_and_stay_valid(board_puzzles):
    board, puzzles = board_puzzles
    inputs, labels = augment(puzzles.questions, puzzles.answers, num_aug=50, seed=3)
    assert inputs.shape == labels.shape == (4 * 51, board.cells) and inputs.dtype == np.uint8
    np.testing.assert_array_equal(inputs[::51], puzzles.questions)
    np.testing.assert_array_equal(labels[::51], puzzles.answers)
    # Every augmentation is a solved grid of the same board (a transposed 2x3 box would break a 3x2 one).
    assert valid_solutions(labels).all() and consistent(inputs, labels).all()
    givens = (inputs > 0).sum(axis=1).reshape(4, 51)
    assert (givens == givens[:, :1]).all()
    # Augmentations differ from the original and from each other.
    assert len(np.unique(inputs, axis=0)) > 4 * 45


def test_group_streams_are_independent_of_the_number_of_groups(board_puzzles):
    _, puzzles = board_puzzles
    small = augment(puzzles.questions[:2], puzzles.answers[:2], num_aug=7, seed=9)
    large = augment(puzzles.questions, puzzles.answers, num_aug=7, seed=9)
    np.testing.assert_array_equal(small[0], large[0][: 2 * 8])
    assert not np.array_equal(group_rng(9, 0).random(4), group_rng(10, 0).random(4))

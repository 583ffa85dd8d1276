"""The vectorised Sudoku symmetries against a literal per-example transcription of the original builder's per-example draws."""

from __future__ import annotations

import numpy as np

from trm.data.augment import BAND_PERMUTATIONS, apply_augmentations, augment, draw_augmentations, group_rng
from trm.data.generate import generate_puzzles
from trm.data.sudoku import consistent, valid_solutions


def _reference(grid: np.ndarray, digit_map, transpose, row_perm, col_perm) -> np.ndarray:
    """One example, step by step as the spec words it: transpose, then new[i, j] = old[row_perm[i], col_perm[j]], then digits."""
    board = grid.reshape(9, 9)
    if transpose:
        board = board.T
    board = board[np.asarray(row_perm)][:, np.asarray(col_perm)]
    return np.asarray(digit_map)[board].reshape(81)


def test_vectorised_application_matches_reference():
    puzzles = generate_puzzles(3, seed=5)
    aug = draw_augmentations(np.random.default_rng(1), 60)
    group = np.arange(60) % 3
    new_q, new_a = apply_augmentations([puzzles.questions, puzzles.answers], group, aug)
    for m in range(60):
        draw = (aug.digit_map[m], aug.transpose[m], aug.row_perm[m], aug.col_perm[m])
        np.testing.assert_array_equal(new_q[m], _reference(puzzles.questions[group[m]], *draw))
        np.testing.assert_array_equal(new_a[m], _reference(puzzles.answers[group[m]], *draw))
    assert aug.transpose.any() and not aug.transpose.all()


def test_draws_follow_the_spec_distribution():
    aug = draw_augmentations(np.random.default_rng(0), 200_000)
    assert (aug.digit_map[:, 0] == 0).all()
    assert (np.sort(aug.digit_map[:, 1:], axis=1) == np.arange(1, 10)).all()
    assert abs(aug.transpose.mean() - 0.5) < 0.01
    for perm in (aug.row_perm, aug.col_perm):
        assert (np.sort(perm, axis=1) == np.arange(9)).all()
        # Each band (stack) of 3 new lines comes from one old band.
        assert (perm.reshape(-1, 3, 3) // 3 == (perm.reshape(-1, 3, 3) // 3)[:, :, :1]).all()
        # All 1296 band-and-line permutations occur, about equally often.
        counts = np.unique(perm.astype(np.int64) @ (10 ** np.arange(9)), return_counts=True)[1]
        assert len(counts) == len(BAND_PERMUTATIONS) == 1296
        assert counts.min() > 0.6 * counts.mean() and counts.max() < 1.4 * counts.mean()  # about 5 sigma


def test_augment_groups_keep_original_first_and_stay_valid():
    puzzles = generate_puzzles(4, seed=2)
    inputs, labels = augment(puzzles.questions, puzzles.answers, num_aug=50, seed=3)
    assert inputs.shape == labels.shape == (4 * 51, 81) and inputs.dtype == np.uint8
    np.testing.assert_array_equal(inputs[::51], puzzles.questions)
    np.testing.assert_array_equal(labels[::51], puzzles.answers)
    assert valid_solutions(labels).all() and consistent(inputs, labels).all()
    givens = (inputs > 0).sum(axis=1).reshape(4, 51)
    assert (givens == givens[:, :1]).all()
    # Augmentations differ from the original and from each other.
    assert len(np.unique(inputs, axis=0)) > 4 * 45


def test_group_streams_are_independent_of_the_number_of_groups():
    puzzles = generate_puzzles(4, seed=2)
    small = augment(puzzles.questions[:2], puzzles.answers[:2], num_aug=7, seed=9)
    large = augment(puzzles.questions, puzzles.answers, num_aug=7, seed=9)
    np.testing.assert_array_equal(small[0], large[0][: 2 * 8])
    assert not np.array_equal(group_rng(9, 0).random(4), group_rng(10, 0).random(4))

"""The offline generator and its solver: unique solutions, minimal puzzles, reproducible by seed."""

from __future__ import annotations

import numpy as np
import pytest

from trm.data.generate import count_solutions, generate_puzzles, solve
from trm.data.sudoku import consistent, valid_solutions


@pytest.fixture(scope="module")
def puzzles():
    return generate_puzzles(6, seed=11)


def test_generated_puzzles_have_one_solution_which_is_the_answer(puzzles):
    assert puzzles.questions.shape == puzzles.answers.shape == (6, 81)
    assert valid_solutions(puzzles.answers).all() and consistent(puzzles.questions, puzzles.answers).all()
    for question, answer in zip(puzzles.questions, puzzles.answers, strict=True):
        assert count_solutions(question, limit=2) == 1
        solution, _ = solve(question)
        np.testing.assert_array_equal(solution, answer)


def test_generated_puzzles_are_minimal(puzzles):
    question = puzzles.questions[0].copy()
    for cell in np.flatnonzero(question):
        reduced = question.copy()
        reduced[cell] = 0
        assert count_solutions(reduced, limit=2) == 2


def test_ratings_are_the_solver_backtracks(puzzles):
    assert (puzzles.ratings >= 0).all()
    assert [solve(q)[1] for q in puzzles.questions] == puzzles.ratings.tolist()


def test_generation_is_reproducible_by_seed(puzzles):
    again = generate_puzzles(6, seed=11)
    np.testing.assert_array_equal(again.questions, puzzles.questions)
    other = generate_puzzles(2, seed=12)
    assert not np.array_equal(other.questions, puzzles.questions[:2])
    assert len(np.unique(puzzles.questions, axis=0)) == 6


def test_solver_counts_known_cases():
    assert count_solutions([0] * 81, limit=2) == 2
    solved = generate_puzzles(1, seed=0).answers[0]
    assert count_solutions(solved) == 1
    broken = solved.copy()
    broken[0], broken[1] = broken[1], broken[0]
    assert count_solutions(broken) == 0
    # Two givens that clash in a row: no solution.
    clash = np.zeros(81, dtype=np.uint8)
    clash[0] = clash[5] = 4
    assert count_solutions(clash) == 0


def test_blanks_sets_the_difficulty_and_keeps_one_solution(puzzles):
    easy = generate_puzzles(6, seed=11, blanks=30)
    assert ((easy.questions == 0).sum(axis=1) == 30).all()
    np.testing.assert_array_equal(easy.answers, puzzles.answers)  # the same grids, fewer cells removed
    assert consistent(easy.questions, easy.answers).all()
    assert all(count_solutions(question, limit=2) == 1 for question in easy.questions)

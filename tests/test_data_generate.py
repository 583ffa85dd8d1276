"""The offline generator and its solver on every board: unique solutions, minimal puzzles, exact blank counts,
reproducible by seed."""

from __future__ import annotations

import numpy as np
import pytest

from trm.data import generate
from trm.data.board import Board
from trm.data.generate import count_solutions, generate_puzzles, solve
from trm.data.sudoku import consistent, valid_solutions
from trm.errors import UserError

BOARDS = [Board.of_size(n) for n in (4, 6, 8, 9)]


@pytest.fixture(scope="module", params=BOARDS, ids=lambda board: board.name)
def generated(request):
    return request.param, generate_puzzles(6, seed=11, board=request.param)


def test_generated_puzzles_have_one_solution_which_is_the_answer(generated):
    board, puzzles = generated
    assert puzzles.questions.shape == puzzles.answers.shape == (6, board.cells)
    assert puzzles.board == board
    assert valid_solutions(puzzles.answers).all() and consistent(puzzles.questions, puzzles.answers).all()
    assert puzzles.answers.min() == 1 and puzzles.answers.max() == board.n
    for question, answer in zip(puzzles.questions, puzzles.answers, strict=True):
        assert count_solutions(question, limit=2) == 1
        solution, _ = solve(question)
        np.testing.assert_array_equal(solution, answer)


def test_generated_puzzles_are_minimal(generated):
    _, puzzles = generated
    for question in puzzles.questions[:2]:
        for cell in np.flatnonzero(question):
            reduced = question.copy()
            reduced[cell] = 0
            assert count_solutions(reduced, limit=2) == 2


def test_ratings_are_the_solver_backtracks(generated):
    _, puzzles = generated
    assert (puzzles.ratings >= 0).all()
    assert [solve(q)[1] for q in puzzles.questions] == puzzles.ratings.tolist()


def test_generation_is_reproducible_by_seed(generated):
    board, puzzles = generated
    again = generate_puzzles(6, seed=11, board=board)
    np.testing.assert_array_equal(again.questions, puzzles.questions)
    other = generate_puzzles(2, seed=12, board=board)
    assert not np.array_equal(other.questions, puzzles.questions[:2])
    assert len(np.unique(puzzles.questions, axis=0)) == 6


@pytest.mark.parametrize("board", BOARDS, ids=lambda board: board.name)
def test_solver_counts_known_cases(board):
    assert count_solutions([0] * board.cells, limit=2) == 2
    solved = generate_puzzles(1, seed=0, board=board).answers[0]
    assert count_solutions(solved) == 1
    broken = solved.copy()
    broken[0], broken[1] = broken[1], broken[0]
    assert count_solutions(broken) == 0
    # Two givens that clash in a row: no solution.
    clash = np.zeros(board.cells, dtype=np.uint8)
    clash[0] = clash[board.n - 1] = 3
    assert count_solutions(clash) == 0


def test_a_4x4_board_has_288_solution_grids():
    assert count_solutions([0] * 16, limit=1000) == 288


def test_blanks_sets_the_difficulty_and_keeps_one_solution(generated):
    board, minimal = generated
    blanks = {4: 8, 6: 20, 8: 30, 9: 30}[board.n]
    easy = generate_puzzles(6, seed=11, blanks=blanks, board=board)
    assert ((easy.questions == 0).sum(axis=1) == blanks).all()
    np.testing.assert_array_equal(easy.answers, minimal.answers)  # the same grids, fewer cells removed
    assert consistent(easy.questions, easy.answers).all()
    assert all(count_solutions(question, limit=2) == 1 for question in easy.questions)


def test_blanks_beyond_a_minimal_puzzle_draws_other_grids():
    # About 3 in 4 minimal 6x6 puzzles have fewer than 27 blanks: asking for 27 discards grids until one gets there.
    board = Board.of_size(6)
    minimal = generate_puzzles(1, seed=0, board=board)
    assert (minimal.questions == 0).sum() < 27  # the seed's first grid is discarded
    hard = generate_puzzles(3, seed=0, blanks=27, board=board)
    assert ((hard.questions == 0).sum(axis=1) == 27).all()
    assert not (hard.answers == minimal.answers).all(axis=1).any()
    assert all(count_solutions(question, limit=2) == 1 for question in hard.questions)


@pytest.mark.parametrize(
    ("n", "blanks", "most"), [(4, 13, 12), (6, 29, 28), (8, 51, 50), (9, 65, 64), (9, 0, 64)]
)
def test_blanks_out_of_range_are_refused(n, blanks, most):
    with pytest.raises(UserError, match=rf"--blanks must be 1 to {most} on a {n}x{n} board.*got {blanks}"):
        generate_puzzles(1, seed=0, blanks=blanks, board=Board.of_size(n))


def test_blanks_that_grids_rarely_reach_are_refused(monkeypatch):
    monkeypatch.setattr(generate, "_MAX_SHORT_DRAWS", 3)  # the real limit, 1000 grids, takes a minute on 9x9
    with pytest.raises(UserError, match="--blanks 28: 3 6x6 grids in a row turned minimal with fewer blanks"):
        generate_puzzles(1, seed=0, blanks=28, board=Board.of_size(6))

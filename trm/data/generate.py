"""Offline Sudoku generator for any board (trm/data/board.py): minimal puzzles with a unique solution,
reproducible from a seed.

Each puzzle starts as a random full grid (randomised backtracking), then its clues are visited in a random order
and each one is removed if the puzzle still has exactly one solution. The result is minimal: no remaining clue
can be removed without losing uniqueness. Minimal puzzles made so have 55-59 blanks of 81 on 9x9, 43-47 of 64 on
8x8, 24-28 of 36 on 6x6 (26 most often) and 11-12 of 16 on 4x4 (measured over a few hundred). With `blanks`,
removal stops once that many cells are blank: an easier puzzle, still with one solution; a grid that turns
minimal with fewer blanks is discarded and another drawn, so every puzzle has exactly `blanks` blanks. Its rating
is the number of dead ends the solver below meets before it finds the solution (a backtrack count, like the
ratings in the shared test files).

The solver keeps one bitmask of used digits per row, column and box and always branches on the empty cell with
the fewest candidates. Removing a clue keeps the solution unique exactly when no other digit at that cell leads
to a solution, which is a cheaper search than counting solutions.

A 4x4 board has only 288 solution grids, so many of its distinct puzzles share a solution.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from tqdm import tqdm

from trm.data.board import SUDOKU, Board
from trm.data.sudoku import Puzzles
from trm.errors import UserError

# Grids drawn in a row that turn minimal with fewer than `blanks` blanks before the generator gives up: a blank
# count that 1 grid in 100 reaches (28 on 6x6) passes, while an unreachable one (64 on 9x9) is refused in a minute.
_MAX_SHORT_DRAWS = 1000


@cache
def _tables(board: Board) -> tuple:
    """The solver's lookup tables for `board`: unit of each cell, all-digits mask, popcounts, digit of each bit."""
    rows, cols, boxes = board.unit_of_cell
    popcount = [bin(m).count("1") for m in range(1 << (board.n + 1))]
    digit_of_bit = {1 << d: d for d in range(1, board.n + 1)}
    return rows, cols, boxes, board.all_digits, popcount, digit_of_bit


class _Solver:
    """Backtracking search over one grid (a list of ints, 0 = blank), mutated in place while searching."""

    def __init__(self, grid: list[int], board: Board):
        self.board = board
        self.tables = _tables(board)
        self.grid = list(grid)
        self.rows, self.cols, self.boxes = [0] * board.n, [0] * board.n, [0] * board.n
        self.empties = []
        self.valid = True
        for i, v in enumerate(self.grid):
            if v == 0:
                self.empties.append(i)
            elif not self.place(i, 1 << v):
                self.valid = False
        self.solutions = 0
        self.dead_ends = 0
        self.first_solution: list[int] | None = None

    def place(self, i: int, bit: int) -> bool:
        row, col, box = self.tables[:3]
        r, c, b = row[i], col[i], box[i]
        if (self.rows[r] | self.cols[c] | self.boxes[b]) & bit:
            return False
        self.rows[r] |= bit
        self.cols[c] |= bit
        self.boxes[b] |= bit
        return True

    def search(self, n: int, limit: int, value_order: list[list[int]] | None = None) -> None:
        """Count solutions of the first n cells of self.empties, stopping at `limit` solutions."""
        if n == 0:
            self.solutions += 1
            if self.first_solution is None:
                self.first_solution = list(self.grid)
            return
        rows, cols, boxes, empties = self.rows, self.cols, self.boxes, self.empties
        row, col, box, full, popcount, digit_of_bit = self.tables
        best_k, best_mask, best_count = 0, 0, self.board.n + 1
        for k in range(n):
            i = empties[k]
            mask = full & ~(rows[row[i]] | cols[col[i]] | boxes[box[i]])
            count = popcount[mask]
            if count < best_count:
                best_k, best_mask, best_count = k, mask, count
                if count <= 1:
                    break
        if best_count == 0:
            self.dead_ends += 1
            return
        # Move the chosen cell out of the first n - 1; deeper calls only reorder those, so no swap back.
        i = empties[best_k]
        empties[best_k], empties[n - 1] = empties[n - 1], i
        r, c, b = row[i], col[i], box[i]
        if value_order is None:
            bits = []
            mask = best_mask
            while mask:
                bit = mask & -mask
                bits.append(bit)
                mask ^= bit
        else:
            bits = [1 << d for d in value_order[i] if best_mask >> d & 1]
        for bit in bits:
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            self.grid[i] = digit_of_bit[bit]
            self.search(n - 1, limit, value_order)
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
            self.grid[i] = 0
            if self.solutions >= limit:
                break

    def run(self, limit: int, value_order: list[list[int]] | None = None) -> int:
        if self.valid:
            self.search(len(self.empties), limit, value_order)
        return self.solutions


def count_solutions(grid: list[int] | np.ndarray, limit: int = 2) -> int:
    """Number of solutions of a grid (n * n cells of its board, 0 = blank), counting no further than `limit`."""
    return _Solver([int(v) for v in grid], Board.from_cells(len(grid))).run(limit)


def solve(grid: list[int] | np.ndarray) -> tuple[list[int] | None, int]:
    """(first solution or None, dead ends met before it): the dead-end count is the puzzle's rating."""
    solver = _Solver([int(v) for v in grid], Board.from_cells(len(grid)))
    solver.run(limit=1)
    return solver.first_solution, solver.dead_ends


def _has_other_solution(puzzle: list[int], cell: int, value: int, board: Board) -> bool:
    """Whether the puzzle, with `cell` blank, has a solution whose digit at `cell` is not `value`."""
    for other in range(1, board.n + 1):
        if other == value:
            continue
        puzzle[cell] = other
        solver = _Solver(puzzle, board)
        found = solver.run(limit=1) > 0
        puzzle[cell] = 0
        if found:
            return True
    return False


def generate_one(
    rng: np.random.Generator, blanks: int | None = None, board: Board = SUDOKU
) -> tuple[list[int], list[int], int]:
    """One (question, answer, rating): a random full grid reduced to a minimal unique puzzle, or to one with
    `blanks` blank cells when that many can be removed (the same draws from `rng` either way)."""
    value_order = rng.permuted(np.tile(np.arange(1, board.n + 1), (board.cells, 1)), axis=1).tolist()
    removal_order = rng.permutation(board.cells).tolist()
    filler = _Solver([0] * board.cells, board)
    filler.run(limit=1, value_order=value_order)
    answer = filler.first_solution
    assert answer is not None  # an empty grid always has a solution
    puzzle = list(answer)
    removed = 0
    for cell in removal_order:
        if removed == blanks:
            break
        value = puzzle[cell]
        puzzle[cell] = 0
        if _has_other_solution(puzzle, cell, value, board):
            puzzle[cell] = value
        else:
            removed += 1
    _, rating = solve(puzzle)
    return puzzle, answer, rating


def check_blanks(blanks: int | None, board: Board) -> None:
    """UserError unless `blanks` (None: minimal puzzles) is a possible blank count for a puzzle of `board`."""
    if blanks is not None and not 1 <= blanks <= board.max_blanks:
        raise UserError(
            f"--blanks must be 1 to {board.max_blanks} on a {board.name} board (no puzzle with a unique solution "
            f"has more), got {blanks}"
        )


def generate_puzzles(count: int, seed: int, blanks: int | None = None, board: Board = SUDOKU) -> Puzzles:
    """`count` distinct puzzles of `board` with unique solutions (minimal, or with exactly `blanks` blanks), the
    same for the same seed. UserError when `blanks` is out of range, or when too many grids in a row turn minimal
    with fewer blanks (few puzzles of the board have that many)."""
    check_blanks(blanks, board)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x6E4])))
    seen: set[bytes] = set()
    questions, answers, ratings = [], [], []
    short = 0  # grids in a row that turned minimal before reaching `blanks`
    with tqdm(total=count, desc="generating puzzles", unit=" puzzles", mininterval=1.0) as bar:
        while len(questions) < count:
            question, answer, rating = generate_one(rng, blanks, board)
            if blanks is not None and question.count(0) < blanks:
                short += 1
                if short == _MAX_SHORT_DRAWS:
                    raise UserError(
                        f"--blanks {blanks}: {short} {board.name} grids in a row turned minimal with fewer blanks, "
                        f"so puzzles with {blanks} blanks are rare on this board; ask for fewer"
                    )
                continue
            short = 0
            key = bytes(question)
            if key in seen:
                continue
            seen.add(key)
            questions.append(question)
            answers.append(answer)
            ratings.append(rating)
            bar.update(1)
    return Puzzles(
        np.asarray(questions, dtype=np.uint8).reshape(-1, board.cells),
        np.asarray(answers, dtype=np.uint8).reshape(-1, board.cells),
        np.asarray(ratings, dtype=np.int64),
    )

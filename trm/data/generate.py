"""Offline Sudoku generator: minimal puzzles with a unique solution, reproducible from a seed.

Each puzzle starts as a random full grid (randomised backtracking), then its 81 clues are visited in a
random order and each one is removed if the puzzle still has exactly one solution. The result is
minimal: no remaining clue can be removed without losing uniqueness. With `blanks`, removal stops once that
many cells are blank: an easier puzzle (a minimal one has about 55-64 blanks), still with one solution. Its rating is the number of dead
ends the solver below meets before it finds the solution (a backtrack count, like the ratings in the
shared test files).

The solver keeps one bitmask of used digits per row, column and box and always branches on the empty
cell with the fewest candidates. Removing a clue keeps the solution unique exactly when no other digit
at that cell leads to a solution, which is a cheaper search than counting solutions.
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from trm.data.sudoku import Puzzles

_FULL = 0b1111111110  # candidate digits 1..9 as bits 1..9
_ROW = [i // 9 for i in range(81)]
_COL = [i % 9 for i in range(81)]
_BOX = [(i // 27) * 3 + (i % 9) // 3 for i in range(81)]
_POPCOUNT = [bin(m).count("1") for m in range(1 << 10)]
_DIGIT_OF_BIT = {1 << d: d for d in range(1, 10)}


class _Solver:
    """Backtracking search over one grid (a list of 81 ints, 0 = blank), mutated in place while searching."""

    def __init__(self, grid: list[int]):
        self.grid = list(grid)
        self.rows, self.cols, self.boxes = [0] * 9, [0] * 9, [0] * 9
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
        r, c, b = _ROW[i], _COL[i], _BOX[i]
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
        best_k, best_mask, best_count = 0, 0, 10
        for k in range(n):
            i = empties[k]
            mask = _FULL & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
            count = _POPCOUNT[mask]
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
        r, c, b = _ROW[i], _COL[i], _BOX[i]
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
            self.grid[i] = _DIGIT_OF_BIT[bit]
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
    """Number of solutions of a grid (81 cells, 0 = blank), counting no further than `limit`."""
    return _Solver([int(v) for v in grid]).run(limit)


def solve(grid: list[int] | np.ndarray) -> tuple[list[int] | None, int]:
    """(first solution or None, dead ends met before it): the dead-end count is the puzzle's rating."""
    solver = _Solver([int(v) for v in grid])
    solver.run(limit=1)
    return solver.first_solution, solver.dead_ends


def _has_other_solution(puzzle: list[int], cell: int, value: int) -> bool:
    """Whether the puzzle, with `cell` blank, has a solution whose digit at `cell` is not `value`."""
    for other in range(1, 10):
        if other == value:
            continue
        puzzle[cell] = other
        solver = _Solver(puzzle)
        found = solver.run(limit=1) > 0
        puzzle[cell] = 0
        if found:
            return True
    return False


def generate_one(rng: np.random.Generator, blanks: int | None = None) -> tuple[list[int], list[int], int]:
    """One (question, answer, rating): a random full grid reduced to a minimal unique puzzle, or to one with
    `blanks` blank cells when that many can be removed (the same draws from `rng` either way)."""
    value_order = rng.permuted(np.tile(np.arange(1, 10), (81, 1)), axis=1).tolist()
    removal_order = rng.permutation(81).tolist()
    filler = _Solver([0] * 81)
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
        if _has_other_solution(puzzle, cell, value):
            puzzle[cell] = value
        else:
            removed += 1
    _, rating = solve(puzzle)
    return puzzle, answer, rating


def generate_puzzles(count: int, seed: int, blanks: int | None = None) -> Puzzles:
    """`count` distinct puzzles with unique solutions (minimal, or with `blanks` blanks), the same for the same
    seed."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x6E4])))
    seen: set[bytes] = set()
    questions, answers, ratings = [], [], []
    with tqdm(total=count, desc="generating puzzles", unit=" puzzles", mininterval=1.0) as bar:
        while len(questions) < count:
            question, answer, rating = generate_one(rng, blanks)
            key = bytes(question)
            if key in seen:
                continue
            seen.add(key)
            questions.append(question)
            answers.append(answer)
            ratings.append(rating)
            bar.update(1)
    return Puzzles(
        np.asarray(questions, dtype=np.uint8).reshape(-1, 81),
        np.asarray(answers, dtype=np.uint8).reshape(-1, 81),
        np.asarray(ratings, dtype=np.int64),
    )

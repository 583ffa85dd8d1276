"""The Sudoku board: an n x n grid of r x c boxes, and the one spelling users give it (`--board 6x6`).

A board is n x n with n = r * c and r <= c: r is the largest divisor of n with r <= sqrt(n), so the boxes are
r rows by c columns and as square as n allows. The boards are 4x4 (2x2 boxes), 6x6 (2x3), 8x8 (2x4) and 9x9
(3x3, the paper's Sudoku-Extreme); a size whose only split is 1 x n (5, 7) has no box shape, and sizes above 9
would need digits beyond one character.

Cells are numbered row-major, 0..n*n-1. A grid holds 0 for a blank and 1..n for the digits; a dataset holds
tokens 0 = padding, 1 = blank, 2..n+1 = the digits, so its vocab_size is n + 2 and its seq_len n * n. A
dataset's board is therefore fixed by its seq_len (`Board.from_cells`), and dataset.json records nothing more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from trm.errors import UserError

# Fewest givens of any puzzle with a unique solution, by board size, from exhaustive searches (9x9: McGuire,
# Tugemann and Civario 2012; 8x8 with 2x4 boxes: 14, Sudoku Programmers forum 2011; 6x6: 8; 4x4: 4, OEIS A198297):
# a puzzle can have at most cells - this many blanks.
_MIN_CLUES = {4: 4, 6: 8, 8: 14, 9: 17}
SIZES = tuple(_MIN_CLUES)


@dataclass(frozen=True)
class Board:
    """An n x n Sudoku board with boxes of box_rows x box_cols cells (use `Board.of_size` or `parse_board`)."""

    n: int
    box_rows: int
    box_cols: int

    @staticmethod
    def of_size(n: int) -> Board:
        """The n x n board with its box shape; UserError when n has none."""
        if n > max(SIZES):
            raise UserError(
                f"a {n}x{n} board is not supported: its digits would not fit in one character; {_choices()}"
            )
        r = max((d for d in range(2, math.isqrt(n) + 1) if n % d == 0), default=1)
        if r == 1:
            raise UserError(f"a {n}x{n} board has no box shape: {_choices()}")
        return Board(n, r, n // r)

    @staticmethod
    def from_cells(cells: int) -> Board:
        """The board of a grid (or dataset seq_len) of `cells` cells; UserError when no board has that many."""
        n = math.isqrt(cells)
        if n * n != cells or n not in SIZES:
            raise UserError(f"{cells} cells are no board's: {_choices()}")
        return Board.of_size(n)

    @property
    def name(self) -> str:
        """The spelling `parse_board` reads: '6x6'."""
        return f"{self.n}x{self.n}"

    @property
    def box(self) -> str:
        """The box shape, rows x columns: '2x3'."""
        return f"{self.box_rows}x{self.box_cols}"

    def __str__(self) -> str:
        return f"{self.name} board ({self.box} boxes)"

    @property
    def cells(self) -> int:
        return self.n * self.n

    @property
    def vocab_size(self) -> int:
        """Dataset tokens: 0 padding, 1 blank, 2..n+1 the digits."""
        return self.n + 2

    @property
    def all_digits(self) -> int:
        """Bits 1..n set: the bitmask of a row, column or box holding every digit once."""
        return (1 << (self.n + 1)) - 2

    @property
    def max_blanks(self) -> int:
        """The most blank cells a puzzle with a unique solution can have on this board."""
        return self.cells - _MIN_CLUES[self.n]

    @cached_property
    def unit_of_cell(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(row, column, box) of every cell, as tuples indexed by cell; boxes numbered row-major."""
        rows = tuple(i // self.n for i in range(self.cells))
        cols = tuple(i % self.n for i in range(self.cells))
        stacks = self.n // self.box_cols  # boxes side by side
        boxes = tuple(
            (r // self.box_rows) * stacks + c // self.box_cols for r, c in zip(rows, cols, strict=True)
        )
        return rows, cols, boxes

    def boxes(self, grids: np.ndarray) -> np.ndarray:
        """[..., n, n] grids as [..., n boxes, n cells]: each box's cells in row-major order."""
        r, c, n = self.box_rows, self.box_cols, self.n
        lead = grids.shape[:-2]
        # [..., bands (n/r), rows in band (r), stacks (n/c), columns in stack (c)] -> bands, stacks, rows, columns.
        split = grids.reshape(*lead, n // r, r, n // c, c)
        k = len(lead)
        return split.transpose(*range(k), k, k + 2, k + 1, k + 3).reshape(*lead, n, n)


SUDOKU = Board.of_size(9)  # the paper's board: Sudoku-Extreme


def _choices() -> str:
    return "the boards are " + ", ".join(
        f"{Board.of_size(n).name} ({Board.of_size(n).box} boxes)" for n in SIZES
    )


def parse_board(text: str, what: str = "--board") -> Board:
    """The board a user names as NxN (4x4, 6x6, 8x8 or 9x9); UserError naming `what` otherwise."""
    first, sep, second = str(text).strip().lower().partition("x")
    if not (sep and first.isdigit() and first == second):
        raise UserError(f"{what} {text!r}: expected NxN, e.g. 6x6; {_choices()}")
    return Board.of_size(int(first))

"""Validity-preserving Sudoku symmetries (those of the original's dataset builder), drawn and applied as whole
arrays, for any board (trm/data/board.py) with boxes of r rows x c columns.

One augmentation is: a relabelling of the digits 1..n (0 = blank stays 0), a transpose with probability 1/2 when
the boxes are square (r == c: a transpose would turn r x c boxes into c x r ones, so other boards never draw it),
a row permutation (shuffle the n / r bands of r rows, then the r rows inside each band) and a column permutation
(shuffle the n / c stacks of c columns, then the c columns inside each stack). Applied in the order: transpose,
then `new[i, j] = old[row_perm[i], col_perm[j]]`, then the digit map; the same draw goes to a question and its
answer. A 9x9 board's draws are the original builder's: the same draws from the generator, in the same order.

The transpose and the two permutations together are one gather of the cells, `new = old[source_cell]`, so a
chunk of examples is augmented by two fancy-indexing operations and no Python loop per example.

Randomness: group k (the k-th kept puzzle with its augmentations) draws from its own stream seeded by
(seed, k). A puzzle's augmentations therefore do not depend on how many puzzles are built, so with the
nested subsamples of the builder a 100-puzzle dataset is exactly the first 100 groups of a 1000-puzzle one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from functools import cache

import numpy as np
from tqdm import tqdm

from trm.data.board import Board

_AUGMENT_STREAM = 0xA06
# Examples augmented per fancy-indexing pass (at least one group): small enough for the index arrays to
# stay in cache, which is about twice as fast as passes of 64K examples.
_CHUNK_EXAMPLES = 4096


@dataclass
class Augmentations:
    """A batch of M augmentations of an n x n board as drawn."""

    digit_map: np.ndarray  # [M, n + 1] uint8: new digit of each old digit; digit_map[:, 0] == 0 (blank stays)
    transpose: np.ndarray  # [M] bool
    row_perm: np.ndarray  # [M, n] int16: new row i is old row row_perm[i] (after the transpose)
    col_perm: np.ndarray  # [M, n] int16

    def source_cell(self) -> np.ndarray:
        """[M, n * n]: the old cell that each new cell reads, transpose and both permutations combined."""
        # After a transpose, cell (a, b) holds old[b, a]; so new[i, j] reads old[col_perm[j], row_perm[i]]:
        # the row permutation steps by 1 cell instead of n, and the column permutation by n instead of 1.
        n = self.row_perm.shape[1]
        row_step = np.where(self.transpose, 1, n).astype(np.int16)[:, None]
        col_step = np.where(self.transpose, n, 1).astype(np.int16)[:, None]
        cells = (self.row_perm * row_step)[:, :, None] + (self.col_perm * col_step)[:, None, :]
        return cells.reshape(-1, n * n)

    @staticmethod
    def concatenate(parts: list[Augmentations]) -> Augmentations:
        return Augmentations(
            *(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Augmentations))
        )


@cache
def band_permutations(groups: int, size: int) -> np.ndarray:
    """Every permutation of 0..groups*size-1 that shuffles the `groups` bands of `size` lines, then the lines inside
    each band: groups! * (size!)**groups rows (1296 for a 9x9 board's 3 bands of 3 rows)."""
    outer = list(itertools.permutations(range(groups)))
    inner = np.array(list(itertools.permutations(range(size))))
    table = [
        np.concatenate([band * size + inner[k[i]] for i, band in enumerate(bands)])
        for bands in outer
        for k in itertools.product(range(len(inner)), repeat=groups)
    ]
    return np.array(table, dtype=np.int16)


def row_permutations(board: Board) -> np.ndarray:
    """The row permutations of `board`: its n / r bands of r rows."""
    return band_permutations(board.n // board.box_rows, board.box_rows)


def col_permutations(board: Board) -> np.ndarray:
    """The column permutations of `board`: its n / c stacks of c columns."""
    return band_permutations(board.n // board.box_cols, board.box_cols)


def draw_augmentations(rng: np.random.Generator, count: int, board: Board) -> Augmentations:
    """Draw `count` independent augmentations of `board` from `rng`."""
    # argsort of i.i.d. uniforms is a uniform random permutation.
    digits = rng.random((count, board.n)).argsort(axis=1).astype(np.uint8) + 1
    digit_map = np.concatenate([np.zeros((count, 1), dtype=np.uint8), digits], axis=1)
    rows, cols = row_permutations(board), col_permutations(board)
    if board.box_rows == board.box_cols:
        # Drawing a uniform index into the table draws a band-and-line permutation as the original's builder does.
        transpose = rng.random(count) < 0.5
        row_index, col_index = rng.integers(0, len(rows), size=(2, count))
    else:
        transpose = np.zeros(count, dtype=bool)
        row_index, col_index = rng.integers(0, len(rows), size=count), rng.integers(0, len(cols), size=count)
    return Augmentations(digit_map, transpose, rows[row_index], cols[col_index])


def apply_augmentations(grids: list[np.ndarray], group: np.ndarray, aug: Augmentations) -> list[np.ndarray]:
    """Augment example m as `grid[group[m]]` under augmentation m, for each [G, cells] uint8 grid array.

    Returns one [M, cells] uint8 array per input array (e.g. questions and answers under the same draws).
    """
    n = aug.row_perm.shape[1]
    cells = group[:, None] * (n * n) + aug.source_cell()
    digit_offset = np.arange(len(group))[:, None] * (n + 1)
    digit_map = aug.digit_map.reshape(-1)
    return [digit_map[digit_offset + grid.reshape(-1)[cells]] for grid in grids]


def group_rng(seed: int, group: int) -> np.random.Generator:
    """The random stream of group `group` (the group-th kept puzzle)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, _AUGMENT_STREAM, group])))


def augment(
    questions: np.ndarray, answers: np.ndarray, num_aug: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Expand N puzzles of one board into N groups of 1 + num_aug examples each, as two [N * (1 + num_aug), cells]
    uint8 arrays.

    Example 0 of each group is the original; examples 1..num_aug are its augmentations.
    """
    board = Board.from_cells(questions.shape[1])
    n, per_group, cells = len(questions), 1 + num_aug, board.cells
    out_q = np.empty((n, per_group, cells), dtype=np.uint8)
    out_a = np.empty((n, per_group, cells), dtype=np.uint8)
    out_q[:, 0] = questions
    out_a[:, 0] = answers
    if num_aug > 0:
        groups_per_chunk = max(1, _CHUNK_EXAMPLES // num_aug)
        with tqdm(
            total=n * num_aug, desc="augmenting", unit=" examples", unit_scale=True, mininterval=1.0
        ) as bar:
            for start in range(0, n, groups_per_chunk):
                stop = min(n, start + groups_per_chunk)
                draws = [draw_augmentations(group_rng(seed, g), num_aug, board) for g in range(start, stop)]
                aug = Augmentations.concatenate(draws)
                group = np.repeat(np.arange(stop - start), num_aug)
                new_q, new_a = apply_augmentations([questions[start:stop], answers[start:stop]], group, aug)
                out_q[start:stop, 1:] = new_q.reshape(-1, num_aug, cells)
                out_a[start:stop, 1:] = new_a.reshape(-1, num_aug, cells)
                bar.update((stop - start) * num_aug)
    return out_q.reshape(-1, cells), out_a.reshape(-1, cells)

"""Validity-preserving Sudoku symmetries (those of the original's dataset builder), drawn and applied as whole arrays.

One augmentation is: a relabelling of the digits 1..9 (0 = blank stays 0), a transpose with probability
1/2, a row permutation (shuffle the 3 bands, then the 3 rows inside each band) and a column permutation
(the same over stacks). Applied in the order: transpose, then `new[i, j] = old[row_perm[i], col_perm[j]]`,
then the digit map; the same draw goes to a question and its answer.

The transpose and the two permutations together are one gather of the 81 cells, `new = old[source_cell]`,
so a chunk of examples is augmented by two fancy-indexing operations and no Python loop per example.

Randomness: group k (the k-th kept puzzle with its augmentations) draws from its own stream seeded by
(seed, k). A puzzle's augmentations therefore do not depend on how many puzzles are built, so with the
nested subsamples of the builder a 100-puzzle dataset is exactly the first 100 groups of a 1000-puzzle one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

import numpy as np
from tqdm import tqdm

_AUGMENT_STREAM = 0xA06
# Examples augmented per fancy-indexing pass (at least one group): small enough for the index arrays to
# stay in cache, which is about twice as fast as passes of 64K examples.
_CHUNK_EXAMPLES = 4096


@dataclass
class Augmentations:
    """A batch of M augmentations as drawn."""

    digit_map: np.ndarray  # [M, 10] uint8: new digit of each old digit; digit_map[:, 0] == 0 (blank stays)
    transpose: np.ndarray  # [M] bool
    row_perm: np.ndarray  # [M, 9] int16: new row i is old row row_perm[i] (after the transpose)
    col_perm: np.ndarray  # [M, 9] int16

    def source_cell(self) -> np.ndarray:
        """[M, 81]: the old cell that each new cell reads, transpose and both permutations combined."""
        # After a transpose, cell (a, b) holds old[b, a]; so new[i, j] reads old[col_perm[j], row_perm[i]]:
        # the row permutation steps by 1 cell instead of 9, and the column permutation by 9 instead of 1.
        row_step = np.where(self.transpose, 1, 9).astype(np.int16)[:, None]
        col_step = np.where(self.transpose, 9, 1).astype(np.int16)[:, None]
        cells = (self.row_perm * row_step)[:, :, None] + (self.col_perm * col_step)[:, None, :]
        return cells.reshape(-1, 81)

    @staticmethod
    def concatenate(parts: list[Augmentations]) -> Augmentations:
        return Augmentations(
            *(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Augmentations))
        )


def _band_permutations() -> np.ndarray:
    """All 6 * 6**3 = 1296 permutations of 0..8 that shuffle the 3 bands, then the 3 lines inside each band."""
    perms3 = np.array(list(itertools.permutations(range(3))))
    table = [
        np.concatenate([band * 3 + perms3[inner[k]] for k, band in enumerate(bands)])
        for bands in perms3
        for inner in itertools.product(range(6), repeat=3)
    ]
    return np.array(table, dtype=np.int16)


# Drawing a uniform index into this table draws a band-and-line permutation as the original's builder does.
BAND_PERMUTATIONS = _band_permutations()


def draw_augmentations(rng: np.random.Generator, count: int) -> Augmentations:
    """Draw `count` independent augmentations from `rng`."""
    # argsort of i.i.d. uniforms is a uniform random permutation.
    digits = rng.random((count, 9)).argsort(axis=1).astype(np.uint8) + 1
    digit_map = np.concatenate([np.zeros((count, 1), dtype=np.uint8), digits], axis=1)
    transpose = rng.random(count) < 0.5
    row_perm, col_perm = BAND_PERMUTATIONS[rng.integers(0, len(BAND_PERMUTATIONS), size=(2, count))]
    return Augmentations(digit_map, transpose, row_perm, col_perm)


def apply_augmentations(grids: list[np.ndarray], group: np.ndarray, aug: Augmentations) -> list[np.ndarray]:
    """Augment example m as `grid[group[m]]` under augmentation m, for each [G, 81] uint8 grid array.

    Returns one [M, 81] uint8 array per input array (e.g. questions and answers under the same draws).
    """
    cells = group[:, None] * 81 + aug.source_cell()
    digit_offset = np.arange(len(group))[:, None] * 10
    digit_map = aug.digit_map.reshape(-1)
    return [digit_map[digit_offset + grid.reshape(-1)[cells]] for grid in grids]


def group_rng(seed: int, group: int) -> np.random.Generator:
    """The random stream of group `group` (the group-th kept puzzle)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, _AUGMENT_STREAM, group])))


def augment(
    questions: np.ndarray, answers: np.ndarray, num_aug: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Expand N puzzles into N groups of 1 + num_aug examples each, as two [N * (1 + num_aug), 81] uint8 arrays.

    Example 0 of each group is the original; examples 1..num_aug are its augmentations.
    """
    n, per_group = len(questions), 1 + num_aug
    out_q = np.empty((n, per_group, 81), dtype=np.uint8)
    out_a = np.empty((n, per_group, 81), dtype=np.uint8)
    out_q[:, 0] = questions
    out_a[:, 0] = answers
    if num_aug > 0:
        groups_per_chunk = max(1, _CHUNK_EXAMPLES // num_aug)
        with tqdm(
            total=n * num_aug, desc="augmenting", unit=" examples", unit_scale=True, mininterval=1.0
        ) as bar:
            for start in range(0, n, groups_per_chunk):
                stop = min(n, start + groups_per_chunk)
                draws = [draw_augmentations(group_rng(seed, g), num_aug) for g in range(start, stop)]
                aug = Augmentations.concatenate(draws)
                group = np.repeat(np.arange(stop - start), num_aug)
                new_q, new_a = apply_augmentations([questions[start:stop], answers[start:stop]], group, aug)
                out_q[start:stop, 1:] = new_q.reshape(-1, num_aug, 81)
                out_a[start:stop, 1:] = new_a.reshape(-1, num_aug, 81)
                bar.update((stop - start) * num_aug)
    return out_q.reshape(-1, 81), out_a.reshape(-1, 81)

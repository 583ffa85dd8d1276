"""Batches for training and evaluation, with the original loader's order, made resumable.

Training walks "iterations" of `eval_interval_epochs` epochs (train.eval_interval: one iteration per evaluation).
Iteration `it` shuffles the groups with a Philox generator seeded `seed + it` (one permutation per epoch,
concatenated), draws one puzzle uniformly inside each group (one random augmentation of each base puzzle per epoch),
cuts the order into global batches and drops the last partial batch. A batch is therefore a pure function of (seed,
iteration, batch index): resuming needs only the step number, and every host computes the same global batch and
keeps its own contiguous slice of rows.

Evaluation reads the test split in order, in chunks of the global batch; the last chunk is padded with pad rows
whose labels are all ignored, so they count in no metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from trm.config import steps_per_interval
from trm.data.format import SplitData
from trm.errors import UserError

IGNORE_LABEL = -100


@dataclass(frozen=True)
class Batch:
    """One host's rows of a global batch, as int32 arrays ready for the device."""

    inputs: np.ndarray  # [rows, seq_len]
    labels: np.ndarray  # [rows, seq_len], IGNORE_LABEL where there is no target
    puzzle_identifiers: np.ndarray  # [rows]

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"inputs": self.inputs, "labels": self.labels, "puzzle_identifiers": self.puzzle_identifiers}


def _host_rows(global_batch_size: int, process_index: int, process_count: int) -> slice:
    """This process's contiguous block of rows (callers split the batch evenly, trm.config.batch_split_problem)."""
    per_host = global_batch_size // process_count
    return slice(process_index * per_host, (process_index + 1) * per_host)


def _to_batch(split: SplitData, example_ids: np.ndarray) -> Batch:
    ignore = int(split.metadata["ignore_label_id"])
    labels = np.asarray(split.labels[example_ids], dtype=np.int32)
    labels = np.where(labels == ignore, IGNORE_LABEL, labels).astype(np.int32)
    return Batch(
        inputs=np.asarray(split.inputs[example_ids], dtype=np.int32),
        labels=labels,
        puzzle_identifiers=np.asarray(split.puzzle_identifiers[example_ids], dtype=np.int32),
    )


class TrainBatches:
    """The deterministic sequence of training batches; `batch(step)` is this host's slice of global batch `step`.

    `step` counts from 0. Only Sudoku-style datasets (one example per puzzle) are supported.
    """

    def __init__(
        self,
        split: SplitData,
        global_batch_size: int,
        eval_interval_epochs: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
    ) -> None:
        puzzle_sizes = np.diff(split.puzzle_indices)
        if not np.all(puzzle_sizes == 1):
            raise UserError("training data must hold exactly one example per puzzle (Sudoku format)")
        self.split = split
        self.global_batch_size = global_batch_size
        self.eval_interval_epochs = eval_interval_epochs
        self.seed = seed
        self.rows = _host_rows(global_batch_size, process_index, process_count)
        self.num_groups = len(split.group_indices) - 1
        self.batches_per_iter = steps_per_interval(self.num_groups, eval_interval_epochs, global_batch_size)
        if self.batches_per_iter == 0:
            raise UserError(
                f"train.global_batch_size={global_batch_size} exceeds the {self.num_groups * eval_interval_epochs} "
                f"examples of one evaluation interval ({eval_interval_epochs} epochs x {self.num_groups} groups)"
            )
        self._cached_iter: int | None = None
        self._cached_order: np.ndarray | None = None

    def _example_order(self, iteration: int) -> np.ndarray:
        """Example ids of one iteration, in order: one random puzzle of every group, per epoch."""
        if self._cached_iter != iteration:
            rng = np.random.Generator(np.random.Philox(self.seed + iteration))
            groups = np.concatenate(
                [rng.permutation(self.num_groups) for _ in range(self.eval_interval_epochs)]
            )
            starts = self.split.group_indices[groups].astype(np.int64)
            sizes = self.split.group_indices[groups + 1].astype(np.int64) - starts
            puzzles = starts + rng.integers(0, sizes)
            self._cached_order = self.split.puzzle_indices[puzzles].astype(np.int64)
            self._cached_iter = iteration
        return self._cached_order

    def global_example_ids(self, step: int) -> np.ndarray:
        """Example ids of the whole global batch `step` (all hosts)."""
        iteration, index = divmod(step, self.batches_per_iter)
        order = self._example_order(iteration)
        return order[index * self.global_batch_size : (index + 1) * self.global_batch_size]

    def batch(self, step: int) -> Batch:
        return _to_batch(self.split, self.global_example_ids(step)[self.rows])

    def epoch_at(self, step: int) -> float:
        """Epochs completed after `step` batches (fractional)."""
        return step * self.global_batch_size / self.num_groups


def eval_batches(
    split: SplitData,
    global_batch_size: int,
    limit: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    first_batch: int = 0,
) -> Iterator[Batch]:
    """This host's slices of the test split in order, the last global batch padded with ignored rows.

    `limit` evaluates only the first `limit` examples (intermediate evaluations on a subset); `first_batch`
    skips the batches before it (a resumed evaluation).
    """
    rows = _host_rows(global_batch_size, process_index, process_count)
    total = len(split.inputs) if limit is None else min(limit, len(split.inputs))
    pad_id = int(split.metadata["pad_id"])
    blank_id = int(split.metadata["blank_identifier_id"])
    for start in range(first_batch * global_batch_size, total, global_batch_size):
        ids = np.arange(start, min(start + global_batch_size, total))
        batch = _to_batch(split, ids)
        missing = global_batch_size - len(ids)
        if missing:
            seq_len = batch.inputs.shape[1]
            batch = Batch(
                inputs=np.concatenate([batch.inputs, np.full((missing, seq_len), pad_id, np.int32)]),
                labels=np.concatenate([batch.labels, np.full((missing, seq_len), IGNORE_LABEL, np.int32)]),
                puzzle_identifiers=np.concatenate(
                    [batch.puzzle_identifiers, np.full(missing, blank_id, np.int32)]
                ),
            )
        yield Batch(batch.inputs[rows], batch.labels[rows], batch.puzzle_identifiers[rows])

"""The one evaluation of a model, used by the trainer (its evaluations during and at the end of training) and by
`trm evaluate` (test-time scaling, trm/train/evaluate_checkpoint.py).

Every puzzle starts from a fresh carry and runs max(counts) supervision steps; the carry after step k is the
start of step k + 1, so the figures for every requested count k come from the same pass. As in the original's
evaluation, the Q head never stops a puzzle early. For each count k, over the real (unpadded) puzzles:

  exact_accuracy       puzzles whose cells are all right after k steps (the headline metric)
  accuracy             right cells / cells, averaged per puzzle
  q_halt_accuracy      puzzles where (q_halt_logit >= 0) agrees with "exactly right" at step k
  mean_halt_step       mean over puzzles of the first step at which the Q head says halt (q_halt_logit > 0,
                       the training halting rule); a puzzle whose Q head has not said halt by step k counts k
  halted_fraction      puzzles whose Q head said halt within k steps
  halt_exact_accuracy  exact accuracy of the answer at that first halt step (at step k if none): what
                       adaptive halting would score with a budget of k steps
  lm_loss, q_halt_loss per-puzzle mean cross-entropy and Q-halt BCE at step k

One compiled program runs one supervision step and its per-puzzle statistics on every row of a batch, and a pass
calls it max(counts) times; nothing in it depends on the counts. So the trainer (counts = train.eval_steps) and
`trm evaluate` run the same program on the same rows: with the same batch size and devices, their figures at a
count both report are bit-identical. The statistics are summed on the host in float64 and in row order (the Tally
of trm/train/records.py, host code: changing it changes no compiled program), so how the rows were split over
devices does not change how they are added.

Data parallelism (`put_host_rows`, `_all_rows`): the rows of a batch are split over the mesh and each process
feeds its own rows (trm/train/batches.py), the weights are replicated; the program moves no rows between devices.
The host then gathers every row's statistics, so every process sums the same numbers in the same order.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from trm.config import evaluation_batch
from trm.data.format import SplitData
from trm.model.act import act_step, initial_carry
from trm.run.distributed import batch_sharded, data_mesh, put_global, put_host_rows, replicated
from trm.train.batches import IGNORE_LABEL, eval_batches
from trm.train.loss import CROSS_ENTROPY
from trm.train.records import Tally
from trm.train.step import ModelTemplate


class Evaluator:
    """Per-puzzle statistics after each of `counts` supervision steps, on a mesh (default: every device)."""

    def __init__(self, model: ModelTemplate, counts: Sequence[int], mesh: Mesh | None = None) -> None:
        self.model = model
        self.counts = tuple(sorted(set(counts)))
        self.mesh = data_mesh() if mesh is None else mesh
        rows = batch_sharded(self.mesh)
        self._fresh = jax.jit(self._fresh_state, out_shardings=rows)
        self._step = jax.jit(self._one_step, out_shardings=rows)

    def with_counts(self, counts: Sequence[int]) -> Evaluator:
        """An evaluator reporting `counts` that runs this one's compiled program (nothing in it depends on them)."""
        other = copy.copy(self)
        other.counts = tuple(sorted(set(counts)))
        return other

    def put_weights(self, params: dict, puzzle_emb, buffers: dict) -> tuple:
        """The weights replicated over the mesh (arrays already there, like a training state's, stay put)."""
        whole = replicated(self.mesh)
        return jax.tree.map(
            lambda x: x if isinstance(x, jax.Array) else put_global(x, whole), (params, puzzle_emb, buffers)
        )

    def __call__(self, weights: tuple, batch: dict[str, np.ndarray]) -> tuple[dict[int, dict], np.ndarray]:
        """({count: {statistic: [rows]}}, real [rows]) for one global batch, of which this process holds `batch`
        (its own block of rows); every process gets every row's statistics."""
        rows = put_host_rows(batch, self.mesh)  # this process's rows of the global batch
        state, real = self._fresh(rows)
        max_steps = np.int32(self.counts[-1])
        stats = {}
        for t in range(1, self.counts[-1] + 1):
            state, step_stats = self._step(*weights, state, rows, np.int32(t), max_steps)
            if t in self.counts:
                stats[t] = {name: _all_rows(value) for name, value in step_stats.items()}
        return stats, _all_rows(real)

    def lower(self, weights: tuple, batch: dict):
        """The lowered supervision step, from weights and a batch placed as `put_weights` and `put_host_rows`
        place them, or abstract ones (jax.ShapeDtypeStruct with shardings, e.g. for a TPU topology's devices)."""
        rows = batch_sharded(self.mesh)
        state, _ = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rows),
            jax.eval_shape(self._fresh, batch),
        )
        scalar = jax.ShapeDtypeStruct((), np.int32, sharding=replicated(self.mesh))
        return self._step.lower(*weights, state, batch, scalar, scalar)

    def _fresh_state(self, batch: dict) -> tuple:
        """The state before the first step: an all-halted carry (each row loads its puzzle at step 1), no halt
        seen yet; and which rows are real puzzles (padding rows have no labels)."""
        rows = batch["labels"].shape[0]
        no_halt = jnp.zeros((rows,), jnp.int32)
        # initial_carry reads only the architecture (`.cfg`).
        carry = initial_carry(self.model, rows)
        return (carry, no_halt, jnp.zeros((rows,), bool)), (batch["labels"] != IGNORE_LABEL).any(-1)

    def _one_step(
        self, params, puzzle_emb, buffers, state, batch, t, max_steps, z_L_noise=None, answers=False
    ):
        """Supervision step `t` of every row and its per-puzzle statistics. `max_steps` is the pass's length,
        traced: no row halts (and restarts) before it, and the program is the same for every pass. For the
        sampled evaluation (trm/train/sampled.py): `z_L_noise` is added to z_L before the step (act_step), and
        `answers` (static) adds each row's "prediction" (its argmax tokens) and "q_halt_logit" to the statistics."""
        module = self.model.bind(params, puzzle_emb, buffers)
        carry, first_halt, exact_at_halt = state
        labels = batch["labels"]
        mask = labels != IGNORE_LABEL
        cells = mask.sum(-1)
        divisor = jnp.maximum(cells, 1).astype(jnp.float32)
        carry, out = act_step(module, carry, batch, training=False, max_steps=max_steps, z_L_noise=z_L_noise)
        prediction = jnp.argmax(out.logits, axis=-1)
        correct = mask & (prediction == labels)
        exact = correct.sum(-1) == cells
        q_halt = out.q_halt_logits
        says_halt_first = (first_halt == 0) & (q_halt > 0)
        first_halt = jnp.where(says_halt_first, t, first_halt)
        exact_at_halt = jnp.where(says_halt_first, exact, exact_at_halt)
        halted = first_halt > 0
        target = exact.astype(jnp.float32)
        stats = {
            "exact_accuracy": exact,
            "accuracy": correct.sum(-1) / divisor,
            "q_halt_accuracy": (q_halt >= 0) == exact,
            "mean_halt_step": jnp.where(halted, first_halt, t),
            "halted_fraction": halted,
            "halt_exact_accuracy": jnp.where(halted, exact_at_halt, exact),
            "lm_loss": CROSS_ENTROPY[module.cfg.loss](out.logits, labels).sum(-1) / divisor,
            "q_halt_loss": jnp.maximum(q_halt, 0) - q_halt * target + jnp.log1p(jnp.exp(-jnp.abs(q_halt))),
        }
        stats = {k: v.astype(jnp.float32) for k, v in stats.items()}
        if answers:
            stats.update(prediction=prediction.astype(jnp.int32), q_halt_logit=q_halt)
        return (carry, first_halt, exact_at_halt), stats


def _all_rows(array: jax.Array) -> np.ndarray:
    """Every row of a row-split array on this host: the processes exchange their rows (a collective)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def evaluate(
    evaluator: Evaluator,
    weights: tuple,
    split: SplitData,
    batch_size: int,
    limit: int | None = None,
    progress: bool = False,
    tally: Tally | None = None,
    after_batch: Callable[[Tally], bool] | None = None,
) -> list[dict] | None:
    """One record per count of `evaluator` (`Tally.results`), over the first `limit` puzzles of `split` (all when
    None), in global batches of `batch_size` rows (a multiple of the mesh's devices). `weights` come from
    `evaluator.put_weights`. Every process gets the same records.

    A `tally` of an earlier, stopped evaluation with the same counts, rows and batch size continues it from its
    next batch. `after_batch(tally)` runs after every batch, on every process; when it returns True the evaluation
    stops there and returns None (the tally holds what was done).

    Fewer puzzles than one batch (a smoke test split, a small subset) are evaluated in one batch just large
    enough for them: padding rows would cost as much as real ones (16 puzzles at batch 192: 12 times the work).
    The cap depends only on the puzzles and the devices, so a continued evaluation batches the same way."""
    total = len(split.inputs) if limit is None else min(limit, len(split.inputs))
    batch_size = evaluation_batch(batch_size, total, evaluator.mesh.size)
    tally = Tally(evaluator.counts) if tally is None else tally
    if tally.counts != evaluator.counts:
        raise ValueError(
            f"a tally of counts {tally.counts} cannot continue an evaluation of {evaluator.counts}"
        )
    for stats, real in _progress(evaluator, weights, split, batch_size, limit, progress, tally):
        tally.add(stats, real)
        if after_batch is not None and after_batch(tally):
            return None
    return tally.results()


def _progress(
    evaluator, weights, split, batch_size, limit, progress, tally
) -> Iterator[tuple[dict, np.ndarray]]:
    """The evaluator's output per batch from the tally's next batch on, with a progress bar on process 0 when
    asked."""
    from tqdm import tqdm

    total = len(split.inputs) if limit is None else min(limit, len(split.inputs))
    shown = progress and jax.process_index() == 0
    bar = tqdm(
        total=total,
        initial=tally.count,
        desc="evaluate",
        unit=" puzzles",
        disable=not shown or None,
        file=sys.stderr,
    )
    batches = eval_batches(split, batch_size, total, jax.process_index(), jax.process_count(), tally.batches)
    for batch in batches:
        stats, real = evaluator(weights, batch.as_dict())
        bar.update(int(real.sum()))
        yield stats, real
    bar.close()

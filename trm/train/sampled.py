"""Sampled test-time recursion (PTRM, arXiv 2605.19943; Corbett et al., arXiv 2605.25230): K trajectories per
puzzle, each with Gaussian noise of scale sigma added to its latent z_L before every supervision step, and one
answer per puzzle chosen from them. docs/fidelity.md says where the noise goes and why.

Every trajectory is the deterministic evaluation's (trm/train/evaluator.py) with that noise: the same program,
with the noise added in act_step, and for each row its answer (argmax tokens) and Q-halt logit. The noise of a
trajectory at a step is drawn from a key folded from (seed, puzzle index in the evaluated rows, trajectory, step),
so it does not depend on the batch size, the devices, or where a stopped evaluation continued. With sigma = 0
no noise is added at all (the deterministic program), and with K = 1 as well every figure is bit for bit the
deterministic evaluation's exact_accuracy and accuracy (tests/test_sampled.py).

For each count k of supervision steps, over the real puzzles (SAMPLED_STATS):

  q_exact_accuracy, q_accuracy         the trajectory with the highest Q-halt logit (the first among equals)
  vote_exact_accuracy, vote_accuracy   the answer most trajectories give (a whole-board majority vote; among
                                       equally frequent answers, the one whose trajectory has the highest Q-halt
                                       logit)
  oracle_exact_accuracy                puzzles some trajectory solves: the ceiling of any selection rule
  trajectory_exact_accuracy            mean over the trajectories: one noisy trajectory's accuracy

A batch holds `batch_size // K` puzzles (at least one) of K rows each, so a pass runs batch_size rows at a
time, as the deterministic one does, whatever K.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from trm.data.format import SplitData
from trm.run.distributed import batch_sharded, put_host_rows
from trm.train.batches import eval_batches
from trm.train.evaluator import Evaluator, _all_rows
from trm.train.records import Tally
from trm.train.sampling import DEFAULT_SEED, SAMPLED_STATS, check_sampling, puzzles_per_batch


class SampledTally(Tally):
    """The float64 sums of a sampled evaluation, per count and statistic (resumable as Tally is)."""

    STATS = SAMPLED_STATS
    SD = ()


class SampledEvaluator:
    """`evaluator`'s program with K noisy trajectories per puzzle; its counts are the evaluator's."""

    def __init__(
        self, evaluator: Evaluator, trajectories: int, sigma: float, seed: int = DEFAULT_SEED
    ) -> None:
        check_sampling([trajectories], sigma)
        self.evaluator = evaluator
        self.counts = evaluator.counts
        self.trajectories = trajectories
        self.sigma = float(sigma)
        self.seed = seed
        self._step = jax.jit(self._one_step, out_shardings=batch_sharded(evaluator.mesh))

    def with_trajectories(self, trajectories: int) -> SampledEvaluator:
        """This evaluator with another K, running the same compiled program (nothing in it depends on K)."""
        check_sampling([trajectories], self.sigma)
        other = copy.copy(self)
        other.trajectories = trajectories
        return other

    def _one_step(self, params, puzzle_emb, buffers, state, batch, t, max_steps, seed):
        noise = None
        if self.sigma > 0:  # sigma 0 adds nothing: the deterministic program
            shape = state[0].z_L.shape[1:]

            def draw(puzzle, trajectory):
                key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), puzzle), trajectory)
                return jax.random.normal(jax.random.fold_in(key, t), shape, jnp.float32)

            noise = self.sigma * jax.vmap(draw)(batch["puzzle"], batch["trajectory"])
        return self.evaluator._one_step(
            params, puzzle_emb, buffers, state, batch, t, max_steps, z_L_noise=noise, answers=True
        )

    def __call__(self, weights: tuple, rows: dict[str, np.ndarray]) -> tuple[dict[int, dict], np.ndarray]:
        """({count: {statistic: [rows]}}, real [rows]) of one global batch, of which this process holds `rows`
        (inputs, labels, puzzle_identifiers, puzzle, trajectory)."""
        rows = put_host_rows(rows, self.evaluator.mesh)
        state, real = self.evaluator._fresh(rows)
        max_steps = np.int32(self.counts[-1])
        stats = {}
        for t in range(1, self.counts[-1] + 1):
            state, step_stats = self._step(*weights, state, rows, np.int32(t), max_steps, np.int32(self.seed))
            if t in self.counts:
                stats[t] = {name: _all_rows(value) for name, value in step_stats.items()}
        return stats, _all_rows(real)


def choose(stats: dict[str, np.ndarray], trajectories: int) -> dict[str, np.ndarray]:
    """Per puzzle, the SAMPLED_STATS of its `trajectories` consecutive rows' statistics."""
    exact = stats["exact_accuracy"].reshape(-1, trajectories)
    accuracy = stats["accuracy"].reshape(-1, trajectories)
    q = stats["q_halt_logit"].reshape(-1, trajectories)
    answers = stats["prediction"].reshape(*exact.shape, -1)
    votes = (answers[:, :, None, :] == answers[:, None, :, :]).all(-1).sum(-1)
    voted = np.where(votes == votes.max(1, keepdims=True), q, -np.inf).argmax(1)
    best = q.argmax(1)
    puzzles = np.arange(len(exact))
    return {
        "q_exact_accuracy": exact[puzzles, best],
        "q_accuracy": accuracy[puzzles, best],
        "vote_exact_accuracy": exact[puzzles, voted],
        "vote_accuracy": accuracy[puzzles, voted],
        "oracle_exact_accuracy": exact.max(1),
        "trajectory_exact_accuracy": exact.mean(1, dtype=np.float64),
    }


def evaluate_sampled(
    sampled: SampledEvaluator,
    weights: tuple,
    split: SplitData,
    batch_size: int,
    limit: int | None = None,
    tally: SampledTally | None = None,
    after_batch: Callable[[SampledTally], bool] | None = None,
) -> list[dict] | None:
    """One record per count of `sampled` over the first `limit` puzzles of `split` (all when None), each with
    "trajectories", "sigma" and "seed"; None when `after_batch(tally)` said to stop (the tally holds what was
    done, and continues it with the same arguments). Every process gets the same records."""
    k = sampled.trajectories
    total = len(split.inputs) if limit is None else min(limit, len(split.inputs))
    per_batch = puzzles_per_batch(batch_size, k, total, sampled.evaluator.mesh.size)
    tally = SampledTally(sampled.counts) if tally is None else tally
    if tally.counts != sampled.counts:
        raise ValueError(
            f"a tally of counts {tally.counts} cannot continue an evaluation of {sampled.counts}"
        )
    rows = per_batch * k
    per_host = rows // jax.process_count()
    host = slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)
    for batch in eval_batches(split, per_batch, total, first_batch=tally.batches):
        puzzle = tally.batches * per_batch + np.arange(per_batch, dtype=np.int32)
        repeated = {name: np.repeat(value, k, axis=0) for name, value in batch.as_dict().items()}
        repeated |= {
            "puzzle": np.repeat(puzzle, k),
            "trajectory": np.tile(np.arange(k, dtype=np.int32), per_batch),
        }
        stats, real = sampled(weights, {name: value[host] for name, value in repeated.items()})
        tally.add({count: choose(stats[count], k) for count in sampled.counts}, real[::k])
        if after_batch is not None and after_batch(tally):
            return None
    setting = {"trajectories": k, "sigma": sampled.sigma, "seed": sampled.seed}
    return [{**record, **setting} for record in tally.results()]


def describe(sampled: SampledEvaluator, puzzles: int) -> None:
    """One line on stderr: what the pass evaluates."""
    print(
        f"sampled evaluation: {sampled.trajectories} trajectories x {puzzles} puzzles, noise sigma "
        f"{sampled.sigma}, seed {sampled.seed}, step counts {','.join(map(str, sampled.counts))}",
        file=sys.stderr,
    )

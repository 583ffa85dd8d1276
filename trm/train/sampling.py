"""What the sampled test-time recursion samples (trm/train/sampled.py), JAX-free: its settings, their defaults and
checks, read by `trm train`, `trm evaluate`, job files and the workflow without importing JAX.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trm.errors import UserError

# The noise sd of the papers' Sudoku-Extreme settings (docs/fidelity.md, "Sampled test-time recursion").
DEFAULT_SIGMA = 0.3
# The noise's seed in every run's final evaluation: a constant of the code (as test_time.SUBSET_SEED), so every run
# of every study draws the same noise for a puzzle; `trm evaluate --sample-seed` takes another.
DEFAULT_SEED = 0

SAMPLED_STATS = (
    "q_exact_accuracy",
    "q_accuracy",
    "vote_exact_accuracy",
    "vote_accuracy",
    "oracle_exact_accuracy",
    "trajectory_exact_accuracy",
)


@dataclass(frozen=True)
class Sampling:
    """What a run's final evaluation samples: each of `trajectories` (K) at noise `sigma`, from `seed`."""

    trajectories: tuple[int, ...]
    sigma: float = DEFAULT_SIGMA
    seed: int = DEFAULT_SEED


def check_sampling(trajectories: Sequence[int], sigma: float, option: str = "--trajectories") -> None:
    """UserError naming the setting when a count of trajectories is below 1 or sigma is negative or not finite."""
    bad = [k for k in trajectories if not isinstance(k, int) or k < 1]
    if bad or not trajectories:
        raise UserError(
            f"{option} {list(trajectories)}: expected positive integers (trajectories per puzzle)"
        )
    if not math.isfinite(sigma) or sigma < 0:
        raise UserError(f"noise sigma {sigma}: expected a finite number >= 0 (0: no noise)")


def puzzles_per_batch(batch_size: int, trajectories: int, puzzles: int, devices: int) -> int:
    """Puzzles per batch: batch_size // K (at least 1), fewer when the split has fewer (as evaluation_batch),
    rounded up so that their rows split evenly over the devices. K = 1 is the deterministic evaluation's batch."""
    unit = devices // math.gcd(trajectories, devices)
    per_batch = min(max(batch_size // trajectories, 1), -(-puzzles // unit) * unit)
    return -(-per_batch // unit) * unit

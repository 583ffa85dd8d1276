"""What the sampled test-time recursion samples (trm/train/sampled.py), JAX-free: its settings, their defaults and
checks, read by `trm train`, `trm evaluate`, job files and the workflow without importing JAX.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trm.errors import UserError

# The defaults, from the papers' Sudoku-Extreme settings: noise sd 0.3 (the paired third-party evaluation of
# PTRM, and PTRM's released Sudoku configuration), K = 16 trajectories at 16 supervision steps.
DEFAULT_TRAJECTORIES = (16,)
DEFAULT_SIGMA = 0.3
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

    trajectories: tuple[int, ...] = DEFAULT_TRAJECTORIES
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

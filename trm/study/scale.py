"""Study scales: `paper` runs each experiment as configured; `smoke` shrinks every experiment to run on a CPU.

The smoke scale is data (`SMOKE`): one rule per config key, applied on top of each experiment's resolved config.
Dividing a key, rather than setting it, keeps the dimension a group varies: exp01's widths stay in proportion
(8 to 48), exp04a still spans 50x in puzzles, exp06 still spans 32x in batch. Keys no rule names (recursion
depths, halting, dtype, optimizer, EMA, schedules' switches) keep their experiment's value. A smoke run costs
about 0.2 TFLOP (half training, half the two evaluations): compute, not only compilation, sets its time on a CPU.

The plan (trm/study/plan.py) applies them to each experiment's resolved config and writes the result as the one file
the run trains; the resolved config, hence its hash, differs between scales.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from trm.errors import UserError

SCALES = ("paper", "smoke")

# key -> ("divide", divisor, minimum): round(value / divisor), at least minimum; or ("set", value).
SMOKE: dict[str, tuple] = {
    "arch.hidden_size": ("divide", 32, 8),  # 512 -> 16; exp01 256..1536 -> 8..48
    "arch.puzzle_emb_len": ("set", 1),  # one position holds the embedding: 82 tokens instead of 97
    "data.train_puzzles": ("divide", 50, 2),  # 1000 -> 20; exp04a 100..5000 -> 2..100
    "data.num_aug": ("divide", 20, 1),  # 1000 -> 50; exp04b 10..2000 -> 1..100
    "train.global_batch_size": ("divide", 256, 1),  # 6144 -> 24; exp06 1536..49152 -> 6..192
    "optim.lr_warmup_steps": ("divide", 1000, 1),  # 2000 -> 2 (a smoke run is a few dozen steps)
    "schedules.curriculum.epochs": ("divide", 2000, 1),  # 10000 of 50000 epochs -> 5 of 24
    "train.epochs": ("set", 24),  # two evaluation intervals: 20 steps at the baseline's 20 puzzles / 24 batch
    "train.eval_interval": ("set", 12),  # >= one batch per interval even at 2 puzzles or batch 192
    "train.eval_subset": ("set", None),  # the smoke test split is small: evaluate all of it
}
# The smoke datasets' one source, generated offline: train puzzles (the largest smoke dataset, exp04a_5000's 100)
# and test puzzles. Fixed, so that running a subset first and the whole study later reuses the same pool.
SMOKE_POOL = {"train": 100, "test": 16}
# Test puzzles of a final evaluation per scale: the smoke pool's, and Sudoku-Extreme's full test split.
TEST_PUZZLES = {"smoke": SMOKE_POOL["test"], "paper": 423_168}


def _apply(rule: tuple, value: Any) -> Any:
    if rule[0] == "set":
        return rule[1]
    _, divisor, minimum = rule
    return max(minimum, math.floor(value / divisor + 0.5))


def at_scale(config: dict, scale: str) -> dict:
    """A copy of an experiment's resolved paper config with the rules of `scale` applied (not validated)."""
    if scale not in SCALES:
        raise UserError(f"unknown scale {scale!r}: one of {', '.join(SCALES)}")
    scaled = copy.deepcopy(config)
    if scale == "paper":
        return scaled
    for key, rule in SMOKE.items():
        *path, leaf = key.split(".")
        section = scaled
        for part in path:
            section = section[part]
        section[leaf] = _apply(rule, section[leaf])
    return scaled

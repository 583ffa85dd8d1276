"""Study scales: `paper` runs each experiment as configured; `smoke` shrinks every experiment to run on a CPU.

The smoke scale is data (`SMOKE`): one rule per config key, applied on top of each experiment's resolved config.
Dividing or multiplying a key, rather than setting it, keeps the dimension a group varies: exp01's widths stay in
proportion, exp04a still spans 50x in puzzles, exp06 still spans 32x in batch, exp10 its learning rates, exp08 the
order of its EMA rates. Keys no rule names (recursion depths, halting, dtype, optimizer, schedules' switches)
keep their experiment's value.

It is chosen to show learning within the local study's time: easier puzzles (SMOKE_POOL's blanks instead of
minimal puzzles' ~60), a narrow net, a few dozen optimizer steps, a learning rate 100 times the paper's (a few
dozen steps of 1e-4 barely move the weights) and an EMA horizon of about the same share of training as the
paper's (0.999 over ~8000 steps; 0.9 over a few dozen). Exact accuracy mostly stays at 0 at this scale, so plots
fall back to cell accuracy and verdicts keep their smoke-scale caveat.

The plan (trm/study/plan.py) applies them to each experiment's resolved config and writes the result as the one file
the run trains; the resolved config, hence its hash, differs between scales.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from trm.errors import UserError

SCALES = ("paper", "smoke")

# key -> ("divide", divisor, minimum): round(value / divisor), at least minimum; ("multiply", factor);
# ("horizon", divisor, minimum): an EMA rate whose horizon 1 / (1 - rate) is divided, at least minimum;
# ("set", value).
SMOKE: dict[str, tuple] = {
    "arch.hidden_size": ("divide", 16, 8),  # 512 -> 32; exp01 256..1536 -> 16..96
    "arch.puzzle_emb_len": ("set", 1),  # one position holds the embedding: 82 tokens instead of 97
    "data.train_puzzles": ("divide", 50, 2),  # 1000 -> 20; exp04a 100..5000 -> 2..100
    "data.num_aug": ("divide", 20, 1),  # 1000 -> 50; exp04b 10..2000 -> 1..100
    "train.global_batch_size": ("divide", 256, 1),  # 6144 -> 24; exp06 1536..49152 -> 6..192
    "optim.lr": ("multiply", 100),  # 1e-4 -> 1e-2; exp10 and exp06 keep their ratios
    "optim.puzzle_emb_lr": ("multiply", 100),
    "optim.lr_warmup_steps": ("divide", 1000, 1),  # 2000 -> 2 (a smoke run is a few dozen steps)
    "optim.ema_rate": ("horizon", 100, 0.25),  # 0.999 -> 0.9; exp08 0.99..0.9995 -> 0.25..0.95
    "schedules.curriculum.epochs": ("divide", 700, 1),  # 10000 of 50000 epochs -> 14 of 72
    "train.epochs": ("set", 72),  # 60 steps at the baseline's 20 puzzles / 24 batch
    "train.eval_interval": ("set", 36),  # two evaluations; >= one batch per interval even at 2 puzzles
    "train.eval_subset": ("set", None),  # the smoke test split is small: evaluate all of it
}
# The smoke datasets' one source, generated offline: train puzzles (the largest smoke dataset, exp04a_5000's 100)
# and test puzzles, each with `blanks` blank cells (easier than minimal puzzles, so that short runs learn). Fixed,
# so that running a subset first and the whole study later reuses the same pool. 24 test puzzles: a one-run cell
# accuracy's 95% sampling half-width (about 2.1 points) is under half the seed spread (5 points), and 24 is a
# multiple of every smoke evaluation batch below it (3, 6, 12, 24): no padding rows (docs/statistics.md,
# "Test-split sizes").
SMOKE_POOL = {"train": 100, "test": 24, "blanks": 30}
# Test puzzles of a final evaluation per scale: the smoke pool's, and Sudoku-Extreme's full test split.
TEST_PUZZLES = {"smoke": SMOKE_POOL["test"], "paper": 423_168}


def _apply(rule: tuple, value: Any) -> Any:
    if rule[0] == "set":
        return rule[1]
    if rule[0] == "multiply":
        return float(f"{value * rule[1]:.12g}")  # 3e-3, not 0.0030000000000000005
    if rule[0] == "horizon":
        return max(rule[2], float(f"{1.0 - (1.0 - value) * rule[1]:.12g}"))
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

"""Study scales: `paper` runs each experiment as configured; `smoke` and `mini` shrink every experiment onto a smaller
Sudoku board to run on one machine.

A local scale is data (`Scale`): one rule per config key, applied on top of each experiment's resolved paper config,
and the pool of generated puzzles its datasets are built from. Dividing or multiplying a key, rather than setting
it, keeps the dimension a group varies: exp01's widths stay in proportion, exp04a still spans 50x in puzzles, exp06
still spans 32x in batch, exp10 its learning rates, exp08 the order of its EMA rates. Keys no rule names (recursion
depths, halting, dtype, optimizer, schedules' switches) keep their experiment's value.

- `smoke` (`make run`, the workflow's default): 4x4 puzzles, width 32, a few hundred optimizer steps: the whole
  study in minutes on a laptop's CPU, with a baseline that solves puzzles. Short of convergence, so its verdicts
  say so.
- `mini`: 6x6 puzzles, width 64, trained past its baseline's learning transition: its 56 runs took 7.4 minutes
  on one H200, 12 at a time (CPU hours per run). Its baseline solves 99.6% of held-out puzzles, so it has headroom
  below only, and its note says what that leaves a verdict to say.

Both keep the paper's proportions where the paper's code rounds for accelerators: a SwiGLU's inner width is about 3
times its width at the paper's 512 (1536), but rounding up to a multiple of 256 would make it 8 times at width 32,
so the local scales round to a multiple of 16 (arch.swiglu_multiple; docs/fidelity.md). How each recipe was chosen,
with its measured learning curve: docs/statistics.md, "The local scales".

The plan (trm/study/plan.py) applies them to each experiment's resolved config and writes the result as the one file
the run trains; the resolved config, hence its hash, differs between scales.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from trm.config import config_value, set_config_value
from trm.errors import UserError

SUDOKU_EXTREME_TEST_PUZZLES = 423_168  # the paper scale's test split


@dataclass(frozen=True)
class Pool:
    """The generated puzzles a local scale's datasets are built from (`trm smoke-pool`): `train` puzzles (at least
    the scale's largest data.train_puzzles) and `test` further, distinct ones, each minimal (unique solution, no
    given removable) or with `blanks` blank cells."""

    board: str
    train: int
    test: int
    blanks: int | None = None


@dataclass(frozen=True)
class Scale:
    """A scale: its rules (key -> rule, see `_apply`), its puzzles (a generated `pool`, or None for the workflow's
    `source`: Sudoku-Extreme), and whether a group whose exact accuracy is 0 throughout is judged and plotted on
    cell accuracy instead (too short to solve puzzles)."""

    name: str
    rules: dict[str, tuple] = field(default_factory=dict)
    pool: Pool | None = None
    cell_fallback: bool = False
    note: str = ""  # what a verdict of this scale can and cannot say, printed with the verdicts

    @property
    def test_puzzles(self) -> int:
        """The test puzzles a run's final evaluation scores: its pool's test split, or Sudoku-Extreme's."""
        return SUDOKU_EXTREME_TEST_PUZZLES if self.pool is None else self.pool.test


# Rules: key -> ("divide", divisor, minimum): round(value / divisor), at least minimum; ("multiply", factor);
# ("horizon", divisor, minimum): an EMA rate whose horizon 1 / (1 - rate) is divided, at least minimum;
# ("set", value).
SMOKE = Scale(
    "smoke",
    rules={
        "data.board": ("set", "4x4"),
        "arch.hidden_size": ("divide", 16, 8),  # 512 -> 32; exp01 256..1536 -> 16..96
        "arch.swiglu_multiple": ("set", 16),
        "arch.puzzle_emb_len": ("set", 1),  # one position holds the embedding: 17 tokens instead of 32
        "data.train_puzzles": ("divide", 10, 2),  # 1000 -> 100; exp04a 100..5000 -> 10..500
        "data.num_aug": ("divide", 20, 1),  # 1000 -> 50; exp04b 10..2000 -> 1..100
        "train.global_batch_size": ("divide", 192, 1),  # 6144 -> 32; exp06 1536..49152 -> 8..256
        "optim.lr": ("multiply", 30),  # 1e-4 -> 3e-3; exp10 and exp06 keep their ratios
        "optim.puzzle_emb_lr": ("multiply", 30),
        "optim.lr_warmup_steps": ("divide", 200, 1),  # 2000 -> 10
        "optim.ema_rate": ("horizon", 50, 0.25),  # 0.999 -> 0.95; exp08 0.99..0.9995 -> 0.5..0.975
        "schedules.curriculum.epochs": ("divide", 781, 1),  # 10000 of 50000 epochs -> 13 of 64
        "train.epochs": ("set", 64),  # 200 steps at the baseline's 100 puzzles / 32 batch
        "train.eval_interval": ("set", 16),  # four evaluations
        "train.eval_subset": ("set", 64),
    },
    pool=Pool("4x4", train=500, test=256),
    cell_fallback=True,
    note=(
        "smoke scale: 4x4 puzzles and a few hundred optimizer steps, short of convergence; a verdict here is about "
        "this small task and budget, not the paper's"
    ),
)
MINI = Scale(
    "mini",
    rules={
        "data.board": ("set", "6x6"),
        "arch.hidden_size": ("divide", 8, 8),  # 512 -> 64; exp01 256..1536 -> 32..192
        "arch.swiglu_multiple": ("set", 16),
        "arch.puzzle_emb_len": ("set", 1),
        "data.num_aug": ("divide", 50, 1),  # 1000 -> 20; exp04b 10..2000 -> 1..40
        "train.global_batch_size": ("divide", 96, 1),  # 6144 -> 64; exp06 1536..49152 -> 16..512
        "optim.lr": ("multiply", 10),  # 1e-4 -> 1e-3
        "optim.puzzle_emb_lr": ("multiply", 10),
        "optim.lr_warmup_steps": ("divide", 100, 1),  # 2000 -> 20
        "optim.ema_rate": ("horizon", 10, 0.25),  # 0.999 -> 0.99; exp08 0.99..0.9995 -> 0.9..0.995
        "schedules.curriculum.epochs": ("divide", 390, 1),  # 10000 of 50000 epochs -> 26 of 128
        "train.epochs": ("set", 128),  # 2000 steps at the baseline's 1000 puzzles / 64 batch
        "train.eval_interval": ("set", 16),
        "train.eval_subset": ("set", 512),
    },
    pool=Pool("6x6", train=5000, test=1024),
    cell_fallback=True,
    note=(
        "mini scale: 6x6 puzzles, trained past the baseline's learning transition (99.6% test exact accuracy over "
        "3 seeds on one GPU): a criterion that needs a gain over the baseline cannot be supported here, and one "
        "that bounds a gain holds at the ceiling; a verdict says which settings fall short of it "
        '(docs/statistics.md, "The local scales")'
    ),
)
PAPER = Scale("paper")
SCALES_BY_NAME: dict[str, Scale] = {s.name: s for s in (PAPER, SMOKE, MINI)}
SCALES = tuple(SCALES_BY_NAME)  # the names, e.g. for command-line choices


def scale_of(name: str) -> Scale:
    """The scale named `name`; UserError naming the choices otherwise."""
    if name not in SCALES_BY_NAME:
        raise UserError(f"unknown scale {name!r}: one of {', '.join(SCALES)}")
    return SCALES_BY_NAME[name]


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
    scaled = copy.deepcopy(config)
    for key, rule in scale_of(scale).rules.items():
        set_config_value(scaled, key, _apply(rule, config_value(scaled, key)))
    return scaled

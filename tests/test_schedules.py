"""Learning-rate schedule, recursion curriculum (contrib01) and halting-exploration anneal (contrib02)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

from trm.errors import UserError
from trm.train.schedule import cycles_at, halt_exploration_at, lr_at, make_lr_schedule

BASE_CONFIG = Path(__file__).resolve().parents[1] / "config" / "base.yaml"


def config(curriculum: dict | None = None, halt_exploration: dict | None = None) -> dict:
    cfg = copy.deepcopy(yaml.safe_load(BASE_CONFIG.read_text()))
    cfg["schedules"]["curriculum"].update(curriculum or {})
    cfg["schedules"]["halt_exploration"].update(halt_exploration or {})
    return cfg


def test_lr_warmup_then_cosine_to_min_ratio():
    base, warmup, total, ratio = 1e-4, 2000, 12000, 0.1
    lr = make_lr_schedule(base, warmup, total, ratio)
    assert float(lr(1)) == pytest.approx(base / 2000, rel=1e-6)  # first update
    assert float(lr(1000)) == pytest.approx(base / 2, rel=1e-6)
    assert float(lr(1999)) == pytest.approx(base * 1999 / 2000, rel=1e-6)
    assert float(lr(2000)) == pytest.approx(base, rel=1e-6)  # warm-up end: cosine at progress 0
    assert float(lr(7000)) == pytest.approx(base * (ratio + (1 - ratio) * 0.5), rel=1e-6)  # mid cosine
    assert float(lr(9500)) == pytest.approx(
        base * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * 0.75))), rel=1e-5
    )
    assert float(lr(12000)) == pytest.approx(base * ratio, rel=1e-6)  # end
    assert float(lr(15000)) == pytest.approx(base * ratio, rel=1e-6)  # past the end: held, not rising again


def test_lr_min_ratio_one_is_constant_after_warmup():
    lr = make_lr_schedule(1e-4, 2000, 65100, 1.0)
    assert {lr(step) for step in range(2000, 65101, 97)} == {1e-4}


def test_lr_edge_cases_no_warmup_and_no_decay_span():
    no_warmup = make_lr_schedule(1.0, 0, 100, 0.0)
    assert float(no_warmup(0)) == pytest.approx(1.0)
    assert float(no_warmup(50)) == pytest.approx(0.5, rel=1e-6)
    assert float(no_warmup(100)) == pytest.approx(0.0, abs=1e-7)
    short = make_lr_schedule(1.0, 10, 5, 0.5)  # total_steps <= warmup: finite values, no division by zero
    assert [float(short(s)) for s in (5, 10, 11)] == pytest.approx([0.5, 1.0, 0.5])
    with pytest.raises(UserError, match="must be >= 0"):
        make_lr_schedule(1.0, -1, 100, 1.0)


def test_lr_is_computed_in_float64_on_the_host_as_the_original_does():
    """The original computes each update's rate as a Python float; float32 arithmetic would differ in the last
    bits of the float32 rate the step receives (base / 2000 rounded once, not 1e-4 and 1 / 2000 rounded first)."""
    warmup = [lr_at(step, 1e-4, 2000, 12000, 0.1) for step in range(1, 2000)]
    assert all(type(value) is float for value in warmup)
    assert warmup == [1e-4 * step / 2000 for step in range(1, 2000)]
    in_float32 = np.float32(1e-4) * np.arange(1, 2000, dtype=np.float32) * np.float32(1 / 2000)
    assert (np.float32(warmup) != in_float32).any()
    assert lr_at(12000, 1e-4, 2000, 12000, 0.1) == pytest.approx(1e-5, rel=1e-12)


def test_curriculum_ramps_from_start_to_arch_values():
    cfg = config(curriculum={"enabled": True, "start_H_cycles": 1, "start_L_cycles": 2, "epochs": 10000})
    assert cycles_at(0, cfg) == (1, 2)
    assert cycles_at(2500, cfg) == (1, 3)
    assert cycles_at(5000, cfg) == (2, 4)
    assert cycles_at(9999.5, cfg) == (2, 5)
    assert cycles_at(10000, cfg) == (3, 6)
    assert cycles_at(50000, cfg) == (3, 6)
    sweep = [cycles_at(e, cfg) for e in np.linspace(0, 12000, 1201)]
    assert all(all(isinstance(c, int) for c in pair) for pair in sweep)
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(sweep, sweep[1:], strict=False))
    # H steps at 5000; L at 2500, 5000, 7500: the shared step leaves 5 pairs (the docstring's bound is 7).
    assert sorted(set(sweep)) == [(1, 2), (1, 3), (2, 4), (2, 5), (3, 6)]


def test_curriculum_disabled_returns_arch_values_and_bad_start_is_rejected():
    cfg = config()
    assert cycles_at(0, cfg) == (cfg["arch"]["H_cycles"], cfg["arch"]["L_cycles"])
    cfg["arch"]["L_cycles"] = 10
    assert cycles_at(123, cfg) == (3, 10)
    bad = config(curriculum={"enabled": True, "start_L_cycles": 7})
    with pytest.raises(UserError, match=r"schedules\.curriculum\.start_L_cycles = 7"):
        cycles_at(0, bad)


def test_halt_exploration_anneals_linearly_when_enabled():
    cfg = config(halt_exploration={"enabled": True, "start": 0.3, "end": 0.05})
    total = 1000
    for step, want in [(0, 0.3), (250, 0.2375), (500, 0.175), (1000, 0.05), (1500, 0.05)]:
        assert float(halt_exploration_at(step, total, cfg)) == pytest.approx(want, rel=1e-6)
    traced = jax.jit(lambda s: halt_exploration_at(s, total, cfg))
    assert float(traced(500)) == pytest.approx(0.175, rel=1e-6)


def test_halt_exploration_disabled_is_the_arch_constant():
    cfg = config()
    cfg["arch"]["halt_exploration_prob"] = 0.2
    assert [float(halt_exploration_at(s, 1000, cfg)) for s in (0, 500, 1000)] == pytest.approx([0.2] * 3)

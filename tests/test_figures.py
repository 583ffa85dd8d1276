"""Every figure is computed from what it claims to measure (issue 37), checked as properties over synthetic records
and tables, so that cases nobody listed are caught too:

- the summary's train-side figures are those of the rows (training examples that halted) its train records
  counted: records weigh by their counts, and a record that counted none adds nothing, whether the trainer wrote
  its means as null (this one) or as 0 (earlier ones).
"""

from __future__ import annotations

import numpy as np
import pytest

from trm.analysis.summary import run_metrics
from trm.train.records import ROW_MEANS, row_means

CONFIG = {"train": {"eval_interval": 36, "global_batch_size": 24}}


def _record(
    step: int, epoch: float, halted: list[int], exact: list[bool], empty_as_zero: bool = False
) -> dict:
    """A train record as the trainer writes it from the rows that halted in its window (`halted`: their halt
    steps, `exact`: whether each was exactly right); `empty_as_zero`: a window without a halted row written as
    trainers before issue 37 did, with 0 for every mean."""
    sums = {
        "count": float(len(halted)),
        "steps": float(sum(halted)),
        "steps_sq": float(sum(h * h for h in halted)),
        "accuracy": float(sum(exact)),
        "exact_accuracy": float(sum(exact)),
        "q_halt_accuracy": 0.0,
    }
    means = row_means(sums)
    if not halted and empty_as_zero:
        means = dict.fromkeys(ROW_MEANS, 0.0)
    return {
        "kind": "train",
        "step": step,
        "epoch": epoch,
        "count": len(halted),
        "examples_per_s": 100.0,
        **means,
    }


def _final(epochs: float) -> dict:
    test = {"exact_accuracy": 0.0, "accuracy": 0.3, "accuracy_puzzle_sd": 0.05, "count": 24, "epoch": epochs}
    return {"steps": 60, "epochs": epochs, "test": test, "best_test": test}


def test_train_figures_are_the_counted_rows_whatever_the_windows():
    rng = np.random.default_rng(37)
    for _ in range(300):
        intervals = int(rng.integers(1, 4))
        epochs = 36.0 * intervals
        windows = sorted(set(rng.uniform(0.5, epochs, size=int(rng.integers(1, 8))).round(2)) | {epochs})
        records, last_rows, last_exact = [], [], []
        for n, epoch in enumerate(windows):
            rows = int(rng.integers(1, 40)) if rng.random() > 0.35 else 0  # some windows see no halt
            halted = [int(h) for h in rng.integers(1, 17, size=rows)]
            exact = [bool(e) for e in rng.random(rows) < 0.3]
            records.append(
                _record(n + 1, float(epoch), halted, exact, empty_as_zero=bool(rng.random() < 0.5))
            )
            if epoch > epochs - 36:  # the last evaluation interval
                last_rows += halted
                last_exact += exact
        metrics = run_metrics(CONFIG, records, _final(epochs))
        if not last_rows:
            assert metrics["mean_halt_steps"] is None and metrics["train_exact_accuracy"] is None
            assert metrics["halt_steps_variance"] is None and metrics["train_test_gap"] is None
            continue
        assert metrics["mean_halt_steps"] == pytest.approx(np.mean(last_rows), rel=1e-12)
        assert metrics["halt_steps_variance"] == pytest.approx(np.var(last_rows), rel=1e-9, abs=1e-9)
        assert metrics["train_exact_accuracy"] == pytest.approx(np.mean(last_exact), rel=1e-12, abs=1e-15)


def test_a_smoke_runs_last_window_without_a_halt_leaves_its_halt_steps_at_the_limit():
    """The smoke run of the issue: 60 steps logged at 50 and 60; every row halts at the limit of 16 (steps 16, 32,
    48), so the 10-step window after step 50 counts no row. Its figures were read as 0 and halved the mean to 8."""
    halted_at_limit = [16] * 72  # 3 halts of 24 rows
    empty = row_means({"count": 0.0, "steps": 0.0, "steps_sq": 0.0, "accuracy": 0.0, "exact_accuracy": 0.0})
    assert empty == dict.fromkeys(ROW_MEANS)  # a mean over no row is not 0
    for zero in (False, True):
        records = [_record(50, 60.0, halted_at_limit, [False] * 72), _record(60, 72.0, [], [], zero)]
        metrics = run_metrics(CONFIG, records, _final(72.0))
        assert metrics["mean_halt_steps"] == 16.0 and metrics["halt_steps_variance"] == 0.0
        assert metrics["train_exact_accuracy"] == 0.0

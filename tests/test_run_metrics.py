"""`trm run-metrics` pools the halt-step variance of the last evaluation interval's train records."""

from __future__ import annotations

import numpy as np
import pytest

from trm.analysis.run_metrics import _pooled_variance


def _record(halt_steps: list[int]) -> dict:
    """A train record as the trainer writes it: rows counted, their mean and (population) variance."""
    return {"count": len(halt_steps), "steps": np.mean(halt_steps), "steps_variance": np.var(halt_steps)}


def test_pooled_variance_equals_the_variance_of_every_row():
    groups = [[3, 16, 7], [2, 2, 10, 4], [16]]
    pooled = _pooled_variance([_record(g) for g in groups])
    assert pooled == pytest.approx(np.var(sum(groups, [])), rel=1e-12)


def test_pooled_variance_is_null_when_a_record_did_not_measure_it():
    old = {"count": 3, "steps": 4.0}  # written before steps_variance existed
    assert _pooled_variance([_record([1, 2]), old]) is None
    assert _pooled_variance([_record([1, 2]), {**old, "steps_variance": None}]) is None
    assert _pooled_variance([]) is None

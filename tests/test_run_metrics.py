"""`trm run-metrics`: the halt-step variance pooled over the last evaluation interval's train records, and the
final and best evaluations of a run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trm.analysis.run_metrics import _pooled_variance, summarize_run
from trm.train.records import best_evaluation


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


def _eval(step: int, exact: float, subset: int | None = 8192) -> dict:
    """An eval record as the trainer writes it (metrics abridged)."""
    count = 8192 if subset else 422_786
    return {"kind": "eval", "split": "test", "subset": subset, "step": step, "epoch": step / 10, "count": count,
            "exact_accuracy": exact, "accuracy": 0.9}  # fmt: skip


def test_best_evaluation_is_the_highest_and_the_latest_among_equals():
    records = [
        _eval(100, 0.5),
        {"kind": "train", "step": 150},
        _eval(200, 0.8),
        _eval(300, 0.7),
        _eval(400, 0.8, None),
    ]
    assert best_evaluation(records) == {k: v for k, v in records[-1].items() if k not in ("kind", "split")}
    assert best_evaluation(records[:4])["step"] == 200
    assert best_evaluation([{"kind": "train", "step": 1}]) is None


def _collected_run(tmp_path: Path, evals: list[dict], final_extra: dict) -> tuple[Path, Path]:
    run = tmp_path / "run"
    run.mkdir()
    train = {"kind": "train", "step": 400, "epoch": 40.0, "count": 10, "steps": 3.0, "steps_variance": 1.0,
             "exact_accuracy": 0.9, "examples_per_s": 100.0}  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [train, *evals]))
    (run / "config.json").write_text(json.dumps({"train": {"eval_interval": 10, "global_batch_size": 8}}))
    final = {
        "config_hash": "abc",
        "devices": 1,
        "steps": 400,
        "epochs": 40.0,
        "test": evals[-1],
        **final_extra,
    }
    (run / "final.json").write_text(json.dumps(final))
    test_time = tmp_path / "steps.json"
    test_time.write_text(json.dumps({"checkpoint_step": 400, "results": []}))
    return run, test_time


def test_the_table_keeps_the_final_and_the_best_evaluation(tmp_path):
    evals = [_eval(200, 0.82), _eval(400, 0.8, None)]
    run, test_time = _collected_run(tmp_path, evals, {"best_test": best_evaluation(evals)})
    summary = summarize_run(run, test_time)
    assert summary["test_exact_accuracy"] == 0.8
    assert (summary["best_test_exact_accuracy"], summary["best_test_epoch"], summary["best_test_puzzles"]) == (0.82, 20.0, 8192)  # fmt: skip
    # A final.json written before it kept the best: the same figures from metrics.jsonl.
    (tmp_path / "old").mkdir()
    old, _ = _collected_run(tmp_path / "old", evals, {})
    assert summarize_run(old, test_time) == summary

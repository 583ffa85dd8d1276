"""benchmarks/bench_learning.py: a study's learning read from its table, verdicts and test split, figure by figure
against the records it comes from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from trm.data.format import array_path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_learning.py"


def _study(root: Path, exact: list[float], low: float) -> Path:
    """A smoke results folder: 3 seeds of one baseline config, shared by two groups' baselines (so repeated in the
    table), one treatment; a 4x4 test split of 2 puzzles with 4 and 8 givens; verdicts judged on three metrics."""
    results = root / "smoke"
    rows = []
    for group, member in (("exp01", "exp01c"), ("exp02a", "exp02a_03")):
        for seed, value in enumerate(exact):
            rows.append(
                {"id": member, "group": group, "run": member + (f"~s{seed}" if seed else ""), "baseline": True,
                 "config_hash": f"h{seed}", "config_key": "k", "test_exact_accuracy": value,
                 "test_cell_accuracy": 0.5 + value / 2}
            )  # fmt: skip
    rows.append(
        {"id": "exp01a", "group": "exp01", "run": "exp01a", "baseline": False, "config_hash": "t",
         "config_key": "t", "test_exact_accuracy": 0.9, "test_cell_accuracy": 0.95}
    )  # fmt: skip
    table = pd.DataFrame(rows)
    for metric in ("test_exact_accuracy", "test_cell_accuracy"):
        table[f"{metric}_mean"] = table[metric].mean()
        table[f"{metric}_low"], table[f"{metric}_high"] = low, 0.99
    results.mkdir(parents=True)
    table.to_csv(results / "table.csv", index=False)
    criteria = [
        {"metric": "test_exact_accuracy", "verdict": "supported"},
        {"metric": "test_exact_accuracy", "verdict": "inconclusive"},
        {"metric": "test_cell_accuracy", "verdict": "not supported"},
        {"metric": "examples_per_second", "verdict": "not supported"},
        {"metric": "test_exact_accuracy", "verdict": "no effect at this scale"},
    ]
    (results / "verdicts").mkdir()
    (results / "verdicts" / "verdicts.json").write_text(json.dumps({"groups": [{"criteria": criteria}]}))
    inputs = np.ones((2, 16), dtype=np.uint8)  # all blank
    inputs[0, :4] = 2
    inputs[1, :8] = 3
    path = array_path(results / "datasets" / "p10-a5", "test", "inputs")
    path.parent.mkdir(parents=True)
    np.save(path, inputs)
    return root


def _run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(root), "--scales", "smoke", "mini"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_learning_study_prints_its_seeds_floor_and_decisions_by_metric(tmp_path):
    done = _run(_study(tmp_path, [0.4, 0.55, 0.41], low=0.2))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "baseline exp01c over 3 seeds" in out  # the shared runs counted once
    assert "test exact accuracy: 0.400, 0.550, 0.410; mean" in out and "[0.200, 0.990]" in out
    assert "copy-the-givens floor: 0.375 cell accuracy" in out  # (4/16 + 8/16) / 2
    assert "criteria decided: 3 of 5: 1 on exact accuracy, 1 on cell accuracy, 1 on other metrics" in out
    assert "learns: the baseline solves puzzles" in out
    assert "mini: no whole-study table and verdicts yet" in out


def test_a_baseline_whose_interval_reaches_zero_is_a_pipeline_check(tmp_path):
    done = _run(_study(tmp_path, [0.0, 0.02, 0.0], low=-0.01))
    assert done.returncode == 0, done.stderr
    assert "does NOT learn what its groups measure" in done.stdout


def test_no_results_at_any_scale_exits_non_zero(tmp_path):
    done = _run(tmp_path)
    assert done.returncode == 1 and "smoke: no whole-study table" in done.stdout and not done.stderr

"""`trm aggregate`: the table reads each experiment's summary (`trm summarize`) and the training job's benchmark; its
metric columns are the registry's (trm/study/metrics.py), in its order."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from trm.cli import main as trm_main
from trm.study.groups import GROUPS_PATH
from trm.study.metrics import CURVE_METRICS, RUN_METRICS, SUMMARY_METRICS, TEST_TIME_METRICS
from trm.study.plan import plan_study

EXPERIMENTS = ("exp01a", "exp01c", "exp04a_1000")  # the last two share one run (both are baselines)


def _summary(config: dict, config_hash: str, accuracy: float) -> dict:
    """A summary as `trm summarize` writes it."""
    metrics = {key: float(n) for n, key in enumerate(SUMMARY_METRICS)}
    return {
        "config": config,
        "config_hash": config_hash,
        "devices": 2,
        **metrics,
        "test_exact_accuracy": accuracy,
        "curve": [{"epoch": 1.0, "test_exact_accuracy": accuracy, "test_cell_accuracy": 0.5}],
        "test_time": [{key: 16 if key == "steps" else accuracy for key in TEST_TIME_METRICS}],
    }


@pytest.fixture
def results(tmp_path: Path) -> Path:
    plan = {exp.id: exp for exp in plan_study("smoke", list(EXPERIMENTS))}
    for n, exp_id in enumerate(EXPERIMENTS):
        exp = plan[exp_id]
        path = tmp_path / "runs" / f"{exp_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_summary(exp.config, exp.hash, 0.1 * n)))
        benchmark = tmp_path / "benchmarks" / "train" / f"{exp_id}.tsv"
        benchmark.parent.mkdir(parents=True, exist_ok=True)
        benchmark.write_text(
            f"s\th:m:s\n{3600.0 * (n + 1)}\t1:00:00\n"
        )  # the job that only summarised: short
    return tmp_path


def test_the_table_is_the_summaries_metrics_in_the_registrys_order(results):
    output = results / "table"
    args = ["aggregate", *EXPERIMENTS, "--results", str(results), "--groups", str(GROUPS_PATH)]
    args += ["--peak-flops", "5e10", "--utilization", "0.1", "--test-puzzles", "16", "--output", str(output)]
    assert trm_main(args) == 0
    table = pd.read_csv(f"{output}.csv")
    columns = list(table.columns)
    assert columns[:5] == ["id", "group", "baseline", "varied", "config_hash"]
    assert columns[5 : 5 + len(RUN_METRICS)] == list(RUN_METRICS)
    assert all("." in key for key in columns[5 + len(RUN_METRICS) :])  # then the config keys groups plot
    assert list(table["test_exact_accuracy"]) == pytest.approx([0.0, 0.1, 0.2])
    summary = json.loads((results / "runs/exp01a.json").read_text())
    assert all(table.loc[0, key] == summary[key] for key in SUMMARY_METRICS if key != "test_exact_accuracy")
    # The shared run reports the wall time of the job that trained it; accelerator-hours use the run's devices.
    assert list(table["wall_time_s"]) == [3600.0, 3 * 3600.0, 3 * 3600.0]
    assert list(table["accelerator_hours"]) == [2.0, 6.0, 6.0]
    assert (table["parameter_count"] > 0).all() and (table["effective_depth"] > 0).all()
    curves = pd.read_csv(f"{output}-curves.csv")
    assert list(curves.columns) == ["id", "group", *CURVE_METRICS]
    test_time = pd.read_csv(f"{output}-test-time.csv")
    assert list(test_time.columns) == ["id", "group", "baseline", *TEST_TIME_METRICS]
    assert list(test_time["baseline"]) == [False, True, True]


def test_a_missing_summary_names_the_file_and_who_writes_it(results, capsys):
    (results / "runs/exp01c.json").unlink()
    args = ["aggregate", *EXPERIMENTS, "--results", str(results), "--groups", str(GROUPS_PATH)]
    args += [
        "--peak-flops",
        "5e10",
        "--utilization",
        "0.1",
        "--test-puzzles",
        "16",
        "--output",
        str(results / "t"),
    ]
    assert trm_main(args) == 2
    err = capsys.readouterr().err
    assert "runs/exp01c.json: missing (`trm summarize` writes it when the run has finished)" in err

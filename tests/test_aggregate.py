"""`trm aggregate`: the table reads each experiment's summary (`trm summarize`), its costs included; its metric
columns are the registry's (trm/study/metrics.py), in its order."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from workflow_support import finished_runs, study

from trm.analysis.aggregate import RUN_TABLE_COLUMNS, repair_summaries
from trm.analysis.judge import SUMMARY_FIELDS
from trm.analysis.uncertainty import NO_INTERVAL, SAMPLING_ONLY, wilson_interval
from trm.cli import main as trm_main
from trm.study.estimate import evaluation_flops, model_costs, training_flops
from trm.study.groups import GROUPS_PATH
from trm.study.metrics import CURVE_METRICS, RUN_METRICS, SAMPLED_METRICS, SUMMARY_METRICS, TEST_TIME_METRICS
from trm.study.plan import plan_study

EXPERIMENTS = ("exp01a", "exp01c", "exp04a_1000")  # the last two share one run (both are baselines)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    planned = study(tmp_path, {"experiments": list(EXPERIMENTS)})
    accuracy = {exp_id: 0.1 * n for n, exp_id in enumerate(EXPERIMENTS)}
    # The last two share one run: `trm summarize` gives both its wall time.
    wall = dict(zip(EXPERIMENTS, (3600.0, 3 * 3600.0, 3 * 3600.0), strict=True))
    return finished_runs(planned, accuracy, wall)


def aggregate(results: Path, output: Path, experiments: tuple[str, ...] = EXPERIMENTS) -> int:
    args = ["aggregate", *experiments, "--results", str(results), "--groups", str(GROUPS_PATH)]
    args += ["--peak-flops", "5e10", "--utilization", "0.1", "--test-puzzles", "16", "--output", str(output)]
    return trm_main(args)


def test_the_table_is_the_summaries_metrics_in_the_registrys_order(results):
    output = results / "table"
    assert aggregate(results, output) == 0
    table = pd.read_csv(f"{output}.csv")
    columns = list(table.columns)
    identity = ["id", "group", "baseline", "varied", "config_hash", "seed", "run", "config_key"]
    assert columns[:10] == [*identity, "weights_sha256", "floor_only"]
    assert tuple(columns[:10]) == RUN_TABLE_COLUMNS  # what the plots and the verdicts require of a table
    assert not table["floor_only"].any()  # every run given, none only for the noise floor
    assert columns[10 : 10 + len(RUN_METRICS)] == list(RUN_METRICS)
    summaries = [f"{m}_{suffix}" for m in SUMMARY_METRICS for suffix in SUMMARY_FIELDS]
    # then the config keys groups plot, then each summary metric's per-experiment uncertainty
    assert all("." in key for key in columns[10 + len(RUN_METRICS) : -len(summaries)])
    assert columns[-len(summaries) :] == summaries
    assert list(table["seed"]) == [plan_study("smoke", [e])[0].config["train"]["seed"] for e in EXPERIMENTS]
    assert list(table["test_exact_accuracy"]) == pytest.approx([0.0, 0.1, 0.2])
    summary = json.loads((results / "runs/exp01a.json").read_text())
    unmeasured = ("test_exact_accuracy", "epochs_to_85pct")
    assert all(table.loc[0, key] == summary[key] for key in SUMMARY_METRICS if key not in unmeasured)
    assert table["epochs_to_85pct"].isna().all() and list(table["epochs_to_85pct_n"]) == [0, 0, 0]
    # The shared run reports its own wall time; accelerator-hours use the run's devices.
    assert list(table["wall_time_s"]) == [3600.0, 3 * 3600.0, 3 * 3600.0]
    assert list(table["accelerator_hours"]) == [2.0, 6.0, 6.0]
    assert (table["parameter_count"] > 0).all() and (table["effective_depth"] > 0).all()
    # One run per experiment and no baseline with 2 seeds: no noise floor, so an accuracy's interval is the
    # sampling interval over the 16 test puzzles, and a metric that is no fraction of them has none; the table
    # says which.
    assert list(table["test_exact_accuracy_n"]) == [1, 1, 1]
    assert set(table["test_exact_accuracy_interval"]) == {SAMPLING_ONLY}
    assert (
        table.loc[2, "test_exact_accuracy_low"],
        table.loc[2, "test_exact_accuracy_high"],
    ) == pytest.approx(wilson_interval(0.2 * 16, 16))
    assert set(table["examples_per_second_interval"]) == {NO_INTERVAL}
    assert table["examples_per_second_low"].isna().all() and table["test_exact_accuracy_sd"].isna().all()
    # The table, the curves and the test-time scaling: CSV files, nothing else.
    assert sorted(p.name for p in Path(output).parent.glob(f"{Path(output).name}*")) == [
        f"{Path(output).name}{end}" for end in ("-curves.csv", "-sampled.csv", "-test-time.csv", ".csv")
    ]
    curves = pd.read_csv(f"{output}-curves.csv")
    assert list(curves.columns) == ["id", "run", "group", *CURVE_METRICS]
    test_time = pd.read_csv(f"{output}-test-time.csv")
    assert list(test_time.columns) == [
        "id",
        "run",
        "group",
        "baseline",
        *TEST_TIME_METRICS,
        "flops_per_puzzle",
    ]
    assert list(test_time["baseline"]) == [False, True, True]
    # The sampled recursion beside it: one row per run, count and K.
    sampled = pd.read_csv(f"{output}-sampled.csv")
    assert list(sampled.columns) == ["id", "run", "group", "baseline", *SAMPLED_METRICS, "flops_per_puzzle"]
    # The test-time compute of one answer: K trajectories x 16 steps x one supervision step's forward FLOPs.
    one = test_time.set_index("run")["flops_per_puzzle"]
    assert list(sampled["flops_per_puzzle"]) == [k * one[run] for run in sampled["run"][::2] for k in (1, 4)]
    assert list(sampled["trajectories"]) == [1, 4] * 3 and list(sampled["id"]) == [
        e for e in EXPERIMENTS for _ in "ab"
    ]


def test_a_missing_summary_names_the_file_and_who_writes_it(results, capsys):
    (results / "runs/exp01c.json").unlink()
    assert aggregate(results, results / "t") == 2
    err = capsys.readouterr().err
    assert "runs/exp01c.json: missing (`trm summarize` writes it when the run has finished)" in err
    # A summary without a metric of this version (an older or hand-made file) is refused, not read as unmeasured.
    path = results / "runs/exp01a.json"
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "curve"}))
    assert aggregate(results, results / "t") == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("exp01a.json: not a run summary of this version (no curve); rerun snakemake, which "
                        "summarises the finished run again without training")  # fmt: skip
    assert "\n" not in err and "Traceback" not in err


def test_a_damaged_summary_is_named_and_the_workflow_removes_it_to_summarise_the_run_again(results, capsys):
    """A summary cut short (a full disk, a copy stopped halfway) looks done to Snakemake: the table refuses it in
    one line, and the workflow, when it starts, removes it (a dry run only says so), so that the run's train job
    summarises the finished run again instead of the table failing on every run."""
    damaged, old = results / "runs/exp01c.json", results / "runs/exp01a.json"
    text = damaged.read_text()
    damaged.write_text(text[: len(text) // 2])
    old.write_text(json.dumps({k: v for k, v in json.loads(old.read_text()).items() if k != "curve"}))
    assert aggregate(results, results / "t") == 2
    err = capsys.readouterr().err
    assert err == (
        f"trm aggregate: error: {old}: not a run summary of this version (no curve); rerun snakemake, which "
        "summarises the finished run again without training\n"
    )
    paths = [str(results / f"runs/{exp}.json") for exp in EXPERIMENTS]
    dry = repair_summaries(paths, dry_run=True)
    assert dry[0].endswith(
        "(no curve); a real run removes it and the run's train job summarises the finished run again"
    )
    assert dry[1].startswith(f"{damaged}: damaged (cut short, or edited?): not valid JSON at line 1 (")
    assert damaged.exists() and old.exists()
    assert [line.replace("a real run removes it and", "removed:") for line in dry] == repair_summaries(
        paths, False
    )
    assert not damaged.exists() and not old.exists() and (results / "runs/exp04a_1000.json").exists()
    assert repair_summaries(paths, dry_run=False) == []  # nothing left to remove


def test_each_runs_config_is_its_job_files(results, capsys):
    """The table reads a run's config from its job file, named by the hash its summary carries: one that is
    missing, or holds another run's job, is one line naming it."""
    config_hash = json.loads((results / "runs/exp01a.json").read_text())["config_hash"]
    job = results / "jobs" / f"{config_hash}.json"
    record = json.loads(job.read_text())
    job.unlink()
    assert aggregate(results, results / "t") == 2
    assert capsys.readouterr().err == (
        f"trm aggregate: error: {job}: job file not found (the workflow writes RESULTS/SCALE/jobs/<hash>.json)\n"
    )
    job.write_text(json.dumps({**record, "config_hash": "0" * 12}))
    assert aggregate(results, results / "t") == 2
    err = capsys.readouterr().err
    assert f"{job}: the job of config {'0' * 12}, not {config_hash}: rerun snakemake" in err


def test_a_collected_runs_cost_is_the_runs_own_not_the_collecting_jobs(results):
    """The issue's case: a job that only collected a run lasted 0.32 s (Snakemake's benchmark of it), and the table
    reported that as the run's wall time. It reports the run's own, from its summary, and the accelerator-hours
    from it."""
    for exp_id in EXPERIMENTS:
        benchmark = results / "benchmarks" / "train" / f"{exp_id}.tsv"
        benchmark.parent.mkdir(parents=True, exist_ok=True)
        benchmark.write_text("s\th:m:s\n0.32\t0:00:00\n")  # the collecting job, as Snakemake records it
    path = results / "runs/exp01a.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "wall_time_s": 60.5}))
    assert aggregate(results, results / "t") == 0
    table = pd.read_csv(results / "t.csv")
    assert table.loc[0, "wall_time_s"] == 60.5
    assert table.loc[0, "accelerator_hours"] == pytest.approx(60.5 * 2 / 3600)  # 2 devices


def test_a_runs_flops_count_its_test_time_passes_on_the_puzzles_they_scored(results):
    """The test-time curve and the sampled recursion of exp01a scored 8 of the 16 test puzzles (the workflow's
    test_time_subset): its run_flops count the headline on the whole split and those passes on the 8, as the plan
    prices them; before, every pass was counted on the whole split."""
    assert aggregate(results, results / "whole") == 0
    path = results / "runs/exp01a.json"
    summary = json.loads(path.read_text())
    for record in (*summary["test_time"], *summary["sampled"]):
        record["count"] = 8
    path.write_text(json.dumps(summary))
    assert aggregate(results, results / "subset") == 0
    whole, subset = (pd.read_csv(results / f"{name}.csv").set_index("run") for name in ("whole", "subset"))
    config = plan_study("smoke", ["exp01a"])[0].config
    costs = model_costs(config)
    on_subset = training_flops(config, costs) + evaluation_flops(config, costs, 16, [16], 2, 8, [1, 4])
    assert subset.loc["exp01a", "run_flops"] == pytest.approx(on_subset, rel=1e-12)
    assert subset.loc["exp01a", "run_flops"] < whole.loc["exp01a", "run_flops"]
    assert (
        subset.loc["exp01c", "run_flops"] == whole.loc["exp01c", "run_flops"]
    )  # its own summary is unchanged


def test_a_reference_has_a_row_of_its_own_in_no_group_labelled_as_groups_yaml_says(tmp_path):
    """ref_paper (groups.yaml `references`): the paper's batch 768 where the baseline has 6144, at any scale."""
    planned = study(tmp_path, {"experiments": ["exp01a", "ref_paper"]})
    runs = ("exp01a", "ref_paper")
    results = finished_runs(planned, dict(zip(runs, (0.1, 0.2), strict=True)), dict.fromkeys(runs, 60.0))
    assert aggregate(results, tmp_path / "t", runs) == 0
    table = pd.read_csv(tmp_path / "t.csv").set_index("id")
    assert (table.loc["ref_paper", "group"], table.loc["ref_paper", "varied"]) == ("reference", "paper recipe (batch 768)")  # fmt: skip
    assert not table.loc["ref_paper", "baseline"] and table.loc["exp01a", "group"] == "exp01"
    batch = table["train.global_batch_size"]
    assert batch["ref_paper"] * 8 == batch["exp01a"]
    assert table.loc["ref_paper", "test_exact_accuracy"] == pytest.approx(0.2)

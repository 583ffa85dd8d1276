"""Replicates (the workflow setting `replicates`): the seeds each experiment trains, planned as runs of their own
(trm/study/study.py, plan.py), priced on their own line (costs.py), and grouped under their experiment in the table,
where the baseline's seeds measure the noise floor (trm/analysis/aggregate.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from workflow_support import REPO, copy_workflow, finished_runs, refused, study

from trm.analysis.uncertainty import FLOOR_AND_SAMPLING, SEEDS
from trm.cli import main as trm_main
from trm.run import state as runstate
from trm.study.groups import GROUPS_PATH
from trm.study.plan import plan_study, replicate_of
from trm.study.status import collect

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def _seeds(planned, exp_id: str) -> list[int]:
    return [e.config["train"]["seed"] for e in planned.plan.values() if e.experiment == exp_id]


def test_the_smoke_plan_runs_three_seeds_of_the_baseline_and_one_of_the_others(tmp_path):
    planned = study(tmp_path, {"groups": ["exp01"]})
    assert list(planned.plan) == [
        *("exp01a", "exp01b", "exp01c", "exp01c~s1", "exp01c~s2"),
        *("exp01d", "exp01e", "exp01f", "ref_paper"),
    ]
    runs = [planned.plan[i] for i in ("exp01c", "exp01c~s1", "exp01c~s2")]
    seed = runs[0].config["train"]["seed"]
    assert _seeds(planned, "exp01c") == [seed, seed + 1, seed + 2] and _seeds(planned, "exp01a") == [seed]
    assert len({r.hash for r in runs}) == 3 and [r.replicate for r in runs] == [0, 1, 2]
    # Replicate 0 is today's run: the hash (so the run dir and results) of the plan without replicates.
    (today,) = plan_study("smoke", ["exp01c"])
    assert runs[0].hash == today.hash and runs[0].config == today.config
    for run in runs[1:]:  # nothing but the seed differs
        assert {**run.config, "train": {**run.config["train"], "seed": seed}} == today.config
        assert planned.run_url(run.id).endswith(f"/runs/{run.hash}") and run.hash in planned.job_file(run.id)
    assert planned.references == ["ref_paper"]


def test_group_and_experiment_overrides(tmp_path):
    changes = {"groups": ["exp01", "exp05"], "replicates": {"smoke": {"groups": {"exp01": 2}}}}
    planned = study(tmp_path, changes)
    assert len(_seeds(planned, "exp01a")) == 2 and len(_seeds(planned, "exp05_a")) == 1
    assert len(_seeds(planned, "exp01c")) == 3  # a group's count raises, never lowers, its baseline's
    assert len(_seeds(planned, "exp05_d")) == 3  # exp05's baseline: the same config, so the same runs
    assert planned.first_with_same_run("exp05_d~s2") == "exp01c~s2"
    changes["replicates"]["smoke"]["experiments"] = {"exp01c": 1, "exp05_a": 4}
    planned = study(tmp_path, changes)
    assert len(_seeds(planned, "exp01c")) == 1 and len(_seeds(planned, "exp05_a")) == 4
    assert planned.first_with_same_run("exp05_d~s2") == "exp05_d~s2"  # exp01c has no seed 2 now


def test_a_bad_override_is_one_line_naming_the_setting(tmp_path):
    message = refused(tmp_path, {"replicates": {"smoke": {"groups": {"exp99": 2}}}})
    assert message == f"--config: replicates.smoke.groups: no group exp99 in {REPO / 'config/groups.yaml'}"
    message = refused(tmp_path, {"replicates": {"smoke": {"experiments": {"exp01z": 2, "exp01y": 3}}}})
    assert message.startswith("--config: replicates.smoke.experiments: no experiment exp01y, exp01z")
    message = refused(tmp_path, {"replicates": {"smoke": {"seeds": 0}}})
    assert "replicates.smoke.seeds" in message and "at least 1" in message


def test_the_plan_prices_replicates_on_their_own_line(tmp_path):
    planned = study(tmp_path, {"groups": ["exp06"], "accelerator": {"price_per_hour": 2.0}})
    costs, baseline = planned.costs, planned.plan["exp06_c"]
    assert baseline.id == "exp06_c" and costs.hours["exp06_c~s1"] == costs.hours["exp06_c"]
    header, training, evaluation, replicates, sampled, price = costs.plan_text().splitlines()
    assert sampled.startswith("  sampled:    K = 4 trajectories per puzzle")  # tests/test_sampled.py
    assert header.startswith(
        "TRM study, scale smoke: 6 experiments in 1 groups and 1 reference, 1 datasets, 9 "
    )
    own = [e for e in costs.hours if "~" not in e]
    assert training.startswith(
        f"  training:   {sum(costs.hours[e]['training'] for e in own):.4g} CPU core-hours"
    )
    extra = 2 * sum(costs.hours["exp06_c"].values())
    assert replicates == (
        f"  replicates: 2 runs (more seeds: replicates.smoke), {extra:.4g} CPU core-hours of training and "
        f"evaluation ({extra:.4g} h of jobs on 1 devices each)"
    )
    total = sum(sum(hours.values()) for hours in costs.hours.values())
    assert price.startswith(f"  price:      ${total * 2:,.0f} for these {total:.4g} CPU core-hours")
    seed = baseline.config["train"]["seed"]
    first = costs.message("exp06_c~s2").splitlines()[0]
    assert first.startswith("train exp06_c~s2: estimated on the job's 1 devices")
    assert first.endswith(f"; replicate 2 of exp06_c (train.seed {seed + 2})")


def test_the_table_groups_replicates_under_their_experiment_and_measures_the_floor(tmp_path):
    planned = study(tmp_path, {"experiments": ["exp01a", "exp01c"]})
    accuracy = {"exp01a": 0.30, "exp01c": 0.40, "exp01c~s1": 0.46, "exp01c~s2": 0.43}
    assert list(accuracy) == list(planned.plan)
    results = finished_runs(planned, accuracy, dict.fromkeys(accuracy, 60.0))
    args = ["aggregate", *accuracy, "--results", str(results), "--groups", str(GROUPS_PATH)]
    args += ["--peak-flops", "5e10", "--utilization", "0.1", "--test-puzzles", "16"]
    assert trm_main([*args, "--output", str(results / "table")]) == 0
    table = pd.read_csv(results / "table.csv").set_index("run")
    assert list(table["id"]) == ["exp01a", "exp01c", "exp01c", "exp01c"]
    assert table["config_key"].nunique() == 2 and table["config_hash"].nunique() == 4
    baseline = table.loc["exp01c"]
    assert baseline["test_exact_accuracy_n"] == 3 and baseline["test_exact_accuracy_interval"] == SEEDS
    assert abs(baseline["test_exact_accuracy_mean"] - 0.43) < 1e-12
    # One seed of exp01a: its interval is the floor the baseline's three seeds measured, with sampling.
    assert table.loc["exp01a", "test_exact_accuracy_interval"] == FLOOR_AND_SAMPLING


@pytest.mark.workflow  # runs Snakemake
def test_a_dry_run_shows_the_replicate_jobs(tmp_path):
    workdir = copy_workflow(tmp_path / "workflow")
    command = [SNAKEMAKE, "-n", "--config", "groups=[exp01]", "results=out"]
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "  replicates: 2 runs (more seeds: replicates.smoke)" in output
    for run_id in ("exp01c~s1", "exp01c~s2"):
        assert f"train {run_id}: estimated on the job's 1 devices" in output
        assert f"out/smoke/runs/{run_id}.json" in output
    assert "; replicate 1 of exp01c (train.seed 1)" in output


def test_trm_status_names_a_replicates_run(tmp_path):
    (exp,) = plan_study("smoke", ["exp01c"])
    root = tmp_path / "storage"
    for run in (exp, replicate_of(exp, 2)):
        run_dir = str(root / "smoke" / "runs" / run.hash)
        runstate.write_status(run_dir, {"state": "running", "config_hash": run.hash})
    seeds = {"smoke": {"seeds": 1, "baseline": 3, "groups": {}, "experiments": {}}}
    names = [name for name, _ in collect(str(root), stale_after_s=600, replicates=seeds)]
    assert [name.split(" (+")[0] for name in names] == ["exp01c", "exp01c~s2"]
    assert all(name.endswith("same config)") for name in names)  # every group's baseline shares them

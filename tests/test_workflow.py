"""The Snakemake workflow over the Study (trm/study/study.py, tested as plain Python in tests/test_study.py): the plan
of the study (dry runs through the Snakemake API), bad settings rejected at parse time, the printed estimates, the
job files, lint, and one end-to-end run of two tiny experiments through every rule to the HTML report, then
idempotent reruns."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from snakemake.api import SnakemakeApi
from snakemake.settings.types import (
    ConfigSettings,
    DAGSettings,
    OutputSettings,
    Quietness,
    RerunTrigger,
    ResourceSettings,
)
from workflow_support import estimates, job_stats, lighten

from trm.analysis.uncertainty import FLOOR_AND_PUZZLE_SD, SEEDS
from trm.launch.job import read_job
from trm.study.plan import plan_study
from trm.study.scale import SMOKE

pytestmark = pytest.mark.workflow

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def dry_run(
    workdir: Path, config: dict | None = None, targets: set[str] | None = None, triggers: set | None = None
) -> list[Path]:
    """The files a run of the workflow would write (a dry run through the Snakemake API), as paths below
    `workdir`; `triggers`: Snakemake's rerun triggers (default: all of them)."""
    updated: list[str] = []
    rerun = {"rerun_triggers": triggers} if triggers else {}
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(config=config or {}),
            snakefile=workdir / "Snakefile",
            workdir=workdir,
        )
        workflow.dag(DAGSettings(targets=targets or set(), **rerun)).execute_workflow(
            executor="dryrun", updated_files=updated
        )
    return [Path(path) for path in updated]


def planned_jobs(
    workdir: Path, config: dict | None = None, targets: set[str] | None = None, triggers: set | None = None
) -> collections.Counter:
    """Dry-run the workflow; count the jobs that would run, per kind, from the files they would write."""
    return job_kinds(dry_run(workdir, config, targets, triggers))


def job_kinds(paths: list[Path]) -> collections.Counter:
    """The jobs that write the files `paths`, counted per kind."""
    kinds = collections.Counter()
    for path in paths:
        if path.parent.name == "runs" and path.suffix == ".json":
            kinds["train"] += 1
        elif path.parent.name == "datasets":
            kinds["build_dataset"] += 1
        elif "staged" in path.parts:
            kinds["stage_dataset"] += 1
        elif path.parent.name == "plots" and path.suffix == ".png":
            kinds["plot_group"] += 1
        elif path.name == "table.csv":
            kinds["aggregate"] += 1
    return kinds


def parse_error(workdir: Path, config: dict | None = None) -> str:
    with pytest.raises(Exception) as info:  # noqa: B017 (Snakemake wraps parse errors in several types)
        planned_jobs(workdir, config)
    return str(info.value)


# ----------------------------------------------------------------------------------------------- the plan


def test_dry_run_of_all_plans_67_trainings_and_the_reference_on_10_datasets(workdir):
    jobs = planned_jobs(workdir)
    # 68 experiments and 2 replicates of each of the 14 group baselines (replicates.smoke.baseline)
    assert jobs == {"build_dataset": 10, "stage_dataset": 10, "train": 96, "aggregate": 1, "plot_group": 14}


def test_one_experiment_by_output_path_or_config_and_one_group(workdir):
    by_path = planned_jobs(workdir, targets={"results/smoke/runs/exp06_f.json"})
    assert by_path == {"build_dataset": 1, "stage_dataset": 1, "train": 1}
    # One experiment trains with the baseline's 3 seeds (the noise floor of its interval: tests/test_selection.py),
    # and writes its table, verdicts and plots in a folder of its own, none of the whole study's outputs.
    files = dry_run(workdir, {"experiments": ["exp01a"]})
    assert job_kinds(files) == {
        "build_dataset": 1,
        "stage_dataset": 1,
        "train": 1 + 3,
        "aggregate": 1,
        "plot_group": 1,
    }
    analysis = [f for f in files if f.name.startswith("table") or {"plots", "verdicts"} & set(f.parts)]
    assert len(analysis) == 4 + 4 + 2  # the table's 4 files, the verdicts' and the group's plot
    selection = Path("results/smoke/selections/exp01a")
    assert all(f.is_relative_to(selection) for f in analysis), analysis
    assert planned_jobs(workdir, {"groups": ["exp04a"]})["train"] == 6 + 2 + 1  # baseline seeds, reference
    assert planned_jobs(workdir, {"groups": ["exp04a"]})["build_dataset"] == 6


def test_dry_run_prints_estimated_training_and_evaluation_hours_per_job(workdir):
    """The Study's summary and each job's estimate (their figures: tests/test_study.py), as the dry run prints them."""
    result = subprocess.run(
        [SNAKEMAKE, "-n", "--config", "groups=[exp06]"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=True,
    )
    output = result.stdout + result.stderr
    training, evaluation = estimates(output, "training"), estimates(output, "evaluation")
    replicates = ["exp06_c~s1", "exp06_c~s2"]  # the baseline's seeds, priced on their own line
    assert (
        sorted(training)
        == sorted(evaluation)
        == sorted([*(f"exp06_{x}" for x in "abcdef"), "ref_paper", *replicates])
    )
    assert "6 experiments in 1 groups and 1 reference" in output and "9 distinct runs" in output
    assert "estimated at an assumed 10% of peak (a rough bound, not a forecast):" in output
    study = {line.split(":")[0].strip(): line for line in output.splitlines() if line.startswith("  ")}
    for part, per_job in (("training", training), ("evaluation", evaluation)):
        own = sum(hours for job, hours in per_job.items() if job not in replicates)
        assert float(study[part].split(":")[1].split()[0]) == pytest.approx(own, rel=1e-3)
        assert "CPU core-hours" in study[part]
    extra = sum(training[job] + evaluation[job] for job in replicates)
    assert study["replicates"].startswith("  replicates: 2 runs (more seeds: replicates.smoke), ")
    assert float(study["replicates"].split("), ")[1].split()[0]) == pytest.approx(extra, rel=1e-3)


def test_a_change_of_storage_stages_the_datasets_there_again(workdir):
    """The issue: after a change of `storage=` (`results=` kept), the stage receipt still stood for the other
    storage's copy, nothing was staged, and training failed with "no dataset is staged". A receipt's path now
    names the storage it stands for, so a new storage stages again, and its runs train there, whatever Snakemake
    remembers of earlier runs (here nothing, and file times are its only trigger)."""
    target, mtime = {"results/smoke/runs/exp01c.json"}, {RerunTrigger.MTIME}
    first = {"experiments": ["exp01c"], "storage": str(workdir / "first")}
    # What a run with the first storage leaves (its summary aside), each file newer than its inputs.
    written = [p for p in dry_run(workdir, first, target) if p.parent.name != "runs"]
    order = ("pool", "datasets")  # then the receipt, in a folder of its own below staged/
    for age, path in enumerate(
        sorted(written, key=lambda p: order.index(p.parent.name) if p.parent.name in order else 2)
    ):
        path = workdir / path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if path.parent.name == "datasets" else path.write_text("")
        os.utime(path, (1e9 + age, 1e9 + age))
    assert planned_jobs(workdir, first, target, mtime) == {"train": 1}
    moved = {**first, "storage": str(workdir / "second")}
    assert planned_jobs(workdir, moved, target, mtime) == {"stage_dataset": 1, "train": 1}


# ------------------------------------------------------------------------------------------------ bad input


def test_misspelt_key_in_an_experiment_file_names_file_key_and_allowed_keys(workdir):
    (workdir / "config/experiments/exp01a.yaml").write_text("arch:\n  hiden_size: 256\n")
    message = parse_error(workdir)
    assert "config/experiments/exp01a.yaml" in message
    assert "arch.hiden_size" in message and "did you mean 'arch.hidden_size'" in message
    assert "num_heads" in message  # the allowed keys


def test_wrong_type_in_an_experiment_file_is_rejected(workdir):
    (workdir / "config/experiments/exp06_a.yaml").write_text("train:\n  global_batch_size: big\n")
    message = parse_error(workdir)
    assert "exp06_a.yaml" in message and "train.global_batch_size" in message and "an integer" in message


def test_unknown_experiment_or_group_lists_the_allowed_ids(workdir):
    message = parse_error(workdir, {"experiments": ["exp01z"]})
    assert "exp01z" in message and "did you mean" in message and "exp10e" in message
    message = parse_error(workdir, {"groups": ["exp11"]})
    assert "exp11" in message and "contrib02" in message


def test_bad_workflow_settings_are_rejected(workdir):
    """A bad setting stops the parse with the Study's one line (every check: tests/test_study.py)."""
    message = parse_error(workdir, {"scael": "smoke"})
    assert "--config: unknown key 'scael'" in message and "scale" in message and "storage" in message


def test_experiment_file_with_a_bad_id_is_rejected(workdir):
    shutil.copy(workdir / "config/experiments/exp01a.yaml", workdir / "config/experiments/Exp-01.yaml")
    message = parse_error(workdir)
    assert "Exp-01.yaml" in message and "^[a-z0-9_]+$" in message


def test_lint_is_clean_but_for_the_software_environments():
    """Snakemake's lint finds nothing but its advice to give each rule a conda environment or container: no rule
    has one, deliberately (every command is the `trm` of the environment running Snakemake; docs/architecture.md)."""
    result = subprocess.run([SNAKEMAKE, "--lint"], cwd=REPO, capture_output=True, text=True)
    output = result.stdout + result.stderr
    lints = [line.strip() for line in output.splitlines() if line.startswith("    * ")]
    assert lints and set(lints) == {"* Specify a conda environment or container for each rule.:"}, output


# ---------------------------------------------------------------------------------------------- end to end


def test_two_tiny_experiments_run_through_every_rule_to_the_report_then_rerun_nothing(workdir):
    # Nothing here depends on the model's depth or dtype: the copy trains a light model (its plans are dry
    # runs in the copy, which reads its own config/base.yaml).
    lighten(workdir)
    # Two seeds of the baseline measure the noise floor: the selection trains them too (tests/test_selection.py).
    # No reference: ref_paper runs through the same rules, at 1,600 steps (the smoke batch of 4) more than any
    # of these; its table row and its lines in the plots are tested in test_aggregate.py and test_plots.py.
    seeds = "replicates={smoke: {baseline: 2}}"
    config = ["--config", "experiments=[exp01a,exp04a_100]", seeds]
    # One training at a time (the rule's resource, as a one-GPU profile sets it): exp04a_100 and the baseline's
    # seeds train with the same programs (Sudoku has one puzzle identifier), so only the first of them compiles;
    # two at once compiled them twice whenever Snakemake started two of them together (70-74 CPU-seconds alone,
    # 65 one at a time).
    run = subprocess.run(
        [SNAKEMAKE, "--cores", "2", "--resources", "training_jobs=1", *config],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    results = workdir / "results/smoke"
    # A selection's table, verdicts and plots: in a folder of its own, never the whole study's.
    analysis = results / "selections/exp01a+exp04a_100"
    assert not (results / "table.csv").exists() and not (results / "plots").exists()
    table = pd.read_csv(analysis / "table.csv")
    assert list(table["id"]) == ["exp01a", "exp04a_100", "exp01c", "exp01c"]
    assert list(table["floor_only"]) == [False, False, True, True]
    width = plan_study("smoke", ["exp01a"])[0].config["arch"]["hidden_size"]
    assert table.loc[0, "varied"] == f"hidden_size={width}, num_heads=4"
    assert (
        table.loc[1, "data.train_puzzles"]
        == plan_study("smoke", ["exp04a_100"])[0].config["data"]["train_puzzles"]
    )
    assert (table["parameter_count"] > 0).all() and (table["wall_time_s"] > 0).all()
    assert table["test_exact_accuracy"].between(0, 1).all()
    # One run per selected experiment: a cell accuracy's interval is the noise floor (the baseline's seeds) with
    # the sampling interval, from the run's own spread over the test puzzles (the final evaluation's
    # accuracy_puzzle_sd).
    assert table["test_cell_accuracy_puzzle_sd"].between(0, 1, inclusive="neither").all()
    intervals = table.groupby("floor_only")["test_cell_accuracy_interval"].unique()
    assert list(intervals[False]) == [FLOOR_AND_PUZZLE_SD] and list(intervals[True]) == [SEEDS]
    assert sorted(p.name for p in (analysis / "plots").glob("*.png")) == ["exp01.png", "exp04a.png"]
    for group in ("exp01", "exp04a"):
        assert (analysis / f"plots/{group}.png").stat().st_size > 1000
        svg = (analysis / f"plots/{group}.svg").read_text()
        assert "<svg" in svg and "accuracy vs test-time supervision steps" in svg
        assert "run:exp01c" not in svg  # floor only: not drawn
    # Test-time scaling: each run scored at the smoke test_time_steps by its training job, as the last phase.
    test_time = pd.read_csv(analysis / "table-test-time.csv")
    assert list(zip(test_time["run"], test_time["steps"], strict=True)) == [
        (run, steps) for run in ("exp01a", "exp04a_100", "exp01c", "exp01c~s1") for steps in (16, 32)
    ]
    assert list(test_time["baseline"]) == [False] * 4 + [True] * 4
    assert test_time["exact_accuracy"].between(0, 1).all() and test_time["accuracy"].between(0, 1).all()
    # Beside it the sampled recursion (test_time_trajectories.smoke), on the curve's 64 puzzles: K = 4 per count.
    sampled = pd.read_csv(analysis / "table-sampled.csv")
    assert list(zip(sampled["run"], sampled["trajectories"], sampled["steps"], strict=True)) == [
        (run, 4, steps) for run in ("exp01a", "exp04a_100", "exp01c", "exp01c~s1") for steps in (16, 32)
    ]
    assert (sampled["sigma"] == 0.3).all() and (sampled["count"] == 64).all()
    assert (
        list(test_time["count"]) == [SMOKE.test_puzzles, 64] * 4
    )  # the headline's whole split, the curve's 64
    assert (sampled["oracle_exact_accuracy"] >= sampled["q_exact_accuracy"]).all()
    assert table["sampled_oracle_exact_accuracy"].between(0, 1).all()
    # Each run's one local file is its summary, read from the run dir in storage after its _SUCCESS marker.
    summary = json.loads((results / "runs/exp01a.json").read_text())
    assert sorted(p.name for p in (results / "runs").iterdir()) == [
        "exp01a.json",
        "exp01c.json",
        "exp01c~s1.json",
        "exp04a_100.json",
    ]
    run_dir = workdir / f"results/storage/smoke/runs/{summary['config_hash']}"
    evaluation = json.loads((run_dir / "test_time.json").read_text())
    assert evaluation["results"][0]["count"] == SMOKE.test_puzzles
    assert evaluation["weights"] in ("ema", "params")
    # At the training halt limit (16 steps) the test-time figures are the trainer's final test evaluation: one
    # pass records both, so they are equal by construction, not by tolerance. The controller ran no evaluation.
    shell_commands = run.stdout + run.stderr  # printed: profiles/default sets printshellcmds
    assert " summarize " in shell_commands and " evaluate --checkpoint" not in shell_commands
    at_halt_limit = test_time[test_time["steps"] == 16].set_index("run")
    for row in table.itertuples():
        assert at_halt_limit.loc[row.run, "exact_accuracy"] == row.test_exact_accuracy
        assert at_halt_limit.loc[row.run, "accuracy"] == row.test_cell_accuracy
    # Each selected group's criteria judged on the table; with one member per group (the baseline's runs are there
    # for the floor only), every one lacks data.
    verdicts = json.loads((analysis / "verdicts/verdicts.json").read_text())
    assert verdicts["scale"] == "smoke" and verdicts["note"] == SMOKE.note
    assert [(g["id"], g["verdict"]) for g in verdicts["groups"]] == [
        ("exp01", "not enough data"),
        ("exp04a", "not enough data"),
    ]
    # The run dir in storage is named by the config hash the summary carries, as is the run's job file, where the
    # table read the config: the run dir's copy is the job file's, and the summary holds none.
    assert (run_dir / "_SUCCESS").exists() and table.loc[0, "config_hash"] == summary["config_hash"]
    job = read_job(str(results / "jobs" / f"{summary['config_hash']}.json"))
    assert "config" not in summary and job.run.config == json.loads((run_dir / "config.json").read_text())
    assert job.run.config["arch"]["hidden_size"] == width

    # The README's command: a report of a selection is given the run's --config.
    report = subprocess.run(
        [SNAKEMAKE, "--report", "report.html", *config],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr[-4000:]
    assert "Missing metadata" not in report.stderr and "WARNING" not in report.stderr.upper(), report.stderr
    html = (workdir / "report.html").read_text()
    assert "exp01.png" in html and "table.csv" in html
    assert "Verdict at the smoke scale: not enough data." in html and "verdicts.md" in html

    again = subprocess.run(
        [SNAKEMAKE, "-n", *config], cwd=workdir, capture_output=True, text=True, check=True
    )
    assert "Nothing to be done" in again.stdout + again.stderr

    # A summary cut short looks done to Snakemake: the next run removes it, and the run's job summarises the
    # finished run again, without training it.
    damaged = "results/smoke/runs/exp04a_100.json"
    whole = (workdir / damaged).read_text()
    (workdir / damaged).write_text(whole[: len(whole) // 2])
    repaired = subprocess.run(
        [SNAKEMAKE, "--cores", "1", damaged, *config],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert repaired.returncode == 0, repaired.stderr[-4000:]
    assert f"note: {damaged}: damaged (cut short, or edited?): not valid JSON at line " in repaired.stderr
    assert "removed: the run's train job summarises the finished run again" in repaired.stderr
    assert (workdir / damaged).read_text() == whole
    log = (results / "logs/train/exp04a_100.log").read_text()
    assert "summarised" in log and "[host 0]" not in log  # not trained again

    # Changing one experiment reruns it, its evaluation, the table and the plots; not the other experiment.
    exp_file = workdir / "config/experiments/exp01a.yaml"
    exp_file.write_text(exp_file.read_text().replace("num_heads: 4", "num_heads: 2"))
    config = ["--config", "experiments=[exp01a,exp04a_100]", seeds]
    plan = subprocess.run([SNAKEMAKE, "-n", *config], cwd=workdir, capture_output=True, text=True, check=True)
    jobs = job_stats(plan.stdout + plan.stderr)
    assert jobs == {"train": 1, "aggregate": 1, "verdicts": 1, "plot_group": 2, "all": 1}
    _relaunch_for_a_missing_count_and_share_a_run(
        workdir, json.loads((results / "runs/exp01c.json").read_text())["config_hash"]
    )


def _relaunch_for_a_missing_count_and_share_a_run(workdir: Path, baseline_hash: str) -> None:
    """A study asking for a test-time count a finished run lacks relaunches its job, which evaluates only that count;
    two experiments with one config (two groups' baselines, whose run's hash is `baseline_hash`) train one run and
    each get its summary."""
    results = workdir / "results/smoke"
    summaries = [f"results/smoke/runs/{exp}.json" for exp in ("exp04a_100", "exp01c", "exp04a_1000")]
    counts = "test_time_steps={smoke: [8, 16, 32], paper: [16, 32, 64, 128]}"
    config = ["--config", "experiments=[exp04a_100,exp01c,exp04a_1000]", counts]
    run = subprocess.run(
        [SNAKEMAKE, "--cores", "2", *summaries, *config],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    relaunched = json.loads((workdir / summaries[0]).read_text())
    assert [r["steps"] for r in relaunched["test_time"]] == [8, 16, 32]
    run_dir = workdir / "results/storage/smoke/runs" / relaunched["config_hash"]
    host_log = (run_dir / "logs/host-0.log").read_text()
    assert host_log.count("test-time evaluation of step counts 16,32") == 1
    assert host_log.count("test-time evaluation of step counts 8 ") == 1  # only the missing count
    first, second = ((workdir / path).read_text() for path in summaries[1:])
    assert first == second and json.loads(first)["config_hash"] == baseline_hash
    logs = [(results / f"logs/train/{exp}.log").read_text() for exp in ("exp01c", "exp04a_1000")]
    # exp01c trained for the floor of the first selection; its job now evaluates the missing count only.
    assert "has step counts 16,32, not 8" in logs[0] and "[host 0]" in logs[0]
    assert "summarised" in logs[1] and "[host 0]" not in logs[1]  # the shared run trained once

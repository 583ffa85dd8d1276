"""The local plan's estimate (trm/study/costs.py, measured.py): the runs left to train only, at the step times and
FLOP rate this machine measured (the results tables), with the start-up each job measured beside its steps, and
its ratio to the last table's measured wall time; planning reads local files only and imports no JAX."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
from workflow_support import REPO, finished_runs, study

from trm.cli import main as trm_main
from trm.study.costs import ASSUMED, MEASURED_RATE, SAME_STEP
from trm.study.estimate import training_steps
from trm.study.groups import GROUPS_PATH

ONE_SEED = {"replicates": {"smoke": {"baseline": 1}}}
STEP_S, WALL_S = 0.05, 400.0  # the measured runs' step time and job wall time
# Builds a Study from settings read on stdin, then prints the heavy libraries it imported.
PROBE = """
import json, sys
from trm.study.study import Study
settings = json.loads(sys.stdin.read())
Study(settings, lambda key: "config/config.yaml", "workflow/schemas/config.schema.yaml")
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & {"jax", "pandas", "gcsfs", "matplotlib"})))
"""


def _measured_study(tmp_path: Path) -> pd.DataFrame:
    """exp06_c (the baseline's step) and ref_paper trained here: their summaries (each step STEP_S), job wall
    times (WALL_S) and the table of their selection; returns the table."""
    planned = study(tmp_path, {"experiments": ["exp06_c", "ref_paper"], **ONE_SEED})
    runs = list(planned.plan)
    results = finished_runs(planned, dict.fromkeys(runs, 0.3), dict.fromkeys(runs, WALL_S))
    for run in runs:
        config = planned.plan[run].config
        path = results / "runs" / f"{run}.json"
        summary = json.loads(path.read_text())
        batch = config["train"]["global_batch_size"]
        summary |= {
            "steps": training_steps(config),
            "step_time_s": STEP_S,
            "examples_per_second": batch / STEP_S,
            "devices": 1,  # as this machine's jobs run (launch.devices_per_host)
        }
        path.write_text(json.dumps(summary))
    args = ["aggregate", "exp06_c", "ref_paper", "--results", str(results)]
    args += [
        "--groups",
        str(GROUPS_PATH),
        "--peak-flops",
        "5e10",
        "--utilization",
        "0.1",
        "--test-puzzles",
        "24",
    ]
    assert trm_main([*args, "--output", f"{planned.analysis}/table"]) == 0
    return pd.read_csv(f"{planned.analysis}/table.csv")


def test_a_local_plan_counts_only_the_runs_left_to_train(tmp_path):
    """The user's case: with nothing left to do, the plan still printed the whole study's estimate."""
    planned = study(tmp_path, {"groups": ["exp06"], **ONE_SEED})
    assert "finished" not in planned.costs.plan_text()
    finished_runs(planned, {"exp06_a": 0.3, "exp06_c": 0.4}, {"exp06_a": 60.0, "exp06_c": 60.0})
    # A run dir in local storage that holds _SUCCESS has finished too, summarised or not.
    success = Path(planned.run_url("ref_paper")) / "_SUCCESS"
    success.parent.mkdir(parents=True)
    success.touch()
    planned = study(tmp_path, {"groups": ["exp06"], **ONE_SEED})
    header, training, *_ = planned.costs.plan_text().splitlines()
    assert header.startswith(
        "TRM study, scale smoke: 6 experiments in 1 groups and 1 reference, 1 datasets, "
    )
    assert ", 7 distinct runs, 3 finished, 4 to train; estimated at an assumed 10% of peak" in header
    left = sum(planned.costs.hours[f"exp06_{x}"]["training"] for x in "bdef")
    assert training.startswith(f"  training:   {left:.4g} CPU core-hours")
    assert planned.costs.message("exp06_a") == (
        f"train exp06_a: its run {planned.plan['exp06_a'].hash} has finished: the job only summarises it "
        "(no training)"
    )
    finished_runs(planned, dict.fromkeys(planned.plan, 0.3), dict.fromkeys(planned.plan, 60.0))
    summary = study(tmp_path, {"groups": ["exp06"], **ONE_SEED}).costs.plan_text()
    assert summary.endswith(", 7 distinct runs, 7 finished, 0 to train: nothing to train")


def test_a_local_plan_estimates_from_the_steps_this_machine_measured(tmp_path):
    """The user's case: the plan said 2.78 + 1.28 = 4.06 CPU core-hours (FLOPs at an assumed 10% of peak) for a
    study whose jobs took 0.62 h. A run is now estimated at the step time measured for its step's shape, else at
    the measured FLOP rate, with the measured start-up of a job."""
    table = _measured_study(tmp_path).set_index("run")
    planned = study(tmp_path, {"experiments": ["exp04a_100", "exp06_a"], **ONE_SEED})
    costs = planned.costs
    # exp04a_100 trains on fewer puzzles with the baseline's step; exp06_a's batch makes another step.
    assert costs.source == {"exp04a_100": SAME_STEP, "exp06_a": MEASURED_RATE}
    exp04a_100 = planned.plan["exp04a_100"].config
    assert costs.hours["exp04a_100"]["training"] * 3600 == training_steps(exp04a_100) * STEP_S
    rates = table["train_flops_per_example_step"] * table["examples_per_second"]
    flops = costs.hours["exp06_a"]["training"] * 3600 * statistics.median(rates)
    batch = planned.plan["exp06_a"].config["train"]["global_batch_size"]
    per_step = flops / training_steps(planned.plan["exp06_a"].config) / batch
    assert abs(per_step / table.loc["exp06_c", "train_flops_per_example_step"] - 1) < 0.2  # a similar model
    # What a job spends outside its steps and evaluations: the mean over the measured runs.
    training = table["steps"] * STEP_S
    evaluation = (table["run_flops"] - table["steps"] * rates * STEP_S) / rates
    start_up = statistics.fmean(WALL_S - training - evaluation)
    assert 0 < start_up < WALL_S and abs(costs.hours["exp06_a"]["start-up"] * 3600 - start_up) < 1e-6
    lines = costs.plan_text().splitlines()
    assert lines[0].startswith(
        "TRM study, scale smoke: 2 experiments in 2 groups, 2 datasets, 2 distinct runs; estimated 1 runs at the "
        "step time measured for their step's shape"
    )
    assert lines[3].startswith("  start-up:   ") and f"{start_up:.3g} s per job, measured" in lines[3]
    (measured,) = [line for line in lines if line.startswith("  measured:")]
    table_path = re.escape(f"{planned.results}/selections/exp06_c+ref_paper/table.csv")
    figures = re.fullmatch(
        rf"  measured:   the runs of the last table \({table_path}\) took ([\d.]+) h of jobs; "
        r"this estimate gives them ([\d.]+) h \(([\d.]+) x measured\)",
        measured,
    )
    assert figures and float(figures[1]) == float(f"{2 * WALL_S / 3600:.3g}")
    # Their own step times and the mean start-up: the two runs' wall time, exactly.
    assert float(figures[3]) == 1.0
    # Planning from these measurements (the model costs cached, as a real run's onstart keeps them) imports neither
    # JAX nor pandas.
    planned.costs.save_cache()
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        input=json.dumps(planned.config),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    # Nothing measured in another results folder: the FLOPs at the assumed utilization, as the plan says.
    assert study(tmp_path / "fresh", {"experiments": ["exp06_a"]}).costs.source["exp06_a"] == ASSUMED

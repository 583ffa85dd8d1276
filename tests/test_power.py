"""Power before paying (trm/analysis/power.py): the difference a plan's seeds can decide, the seeds a criterion
would need, where the seed spread comes from, the dry run's table, and a simulation of the verdicts' own rule at
the reported difference."""

from __future__ import annotations

import itertools
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from workflow_support import TPU_PROFILE, runs_table, study

from trm.analysis import power
from trm.analysis.judge import judge_criterion
from trm.analysis.uncertainty import INCONCLUSIVE, noise_floor
from trm.study.groups import load_groups
from trm.study.scale import PAPER

SD = power.PUBLIC_SEED_SD["test_exact_accuracy"]  # 2 points
GROUP = {"id": "g", "members": ["a", "b"], "baseline": "b"}
BUCKET = "gs://my-trm-bucket/trm-study"


def criterion(check: str, **bound: float) -> dict:
    """A criterion of one member `a` against the reference `b` on test exact accuracy."""
    return {"check": check, "metric": "test_exact_accuracy", "members": ["a"], "against": ["b"], **bound}


def detectable(crit: dict, a: int, b: int, floor_df: int = 2, sd: float = SD) -> float:
    """D of `crit` with a and b seeds, at the paper's test split."""
    return power.detectable_difference(crit, GROUP, {"a": a, "b": b}, sd, floor_df, PAPER.test_puzzles)


def test_the_detectable_difference_shrinks_as_one_over_the_root_of_the_seeds():
    at_most = criterion("at_most", margin=0.01)
    shrinking = [detectable(at_most, n, n) for n in range(2, 31)]
    assert all(later < earlier for earlier, later in itertools.pairwise(shrinking))
    # 4 times the seeds: half the difference, a little more at few seeds (a wider t quantile).
    ratio = detectable(at_most, 20, 20) / detectable(at_most, 80, 80)
    assert 2.0 <= ratio <= 2.15
    # Two one-sided conditions (a `within`) need more than one at the same seeds.
    assert detectable(criterion("within", tolerance=0.01), 20, 20) > detectable(at_most, 20, 20)


def test_a_one_point_margin_on_one_seed_per_point_is_undecidable_and_the_seeds_proposed_suffice():
    at_least = criterion("at_least", margin=0.01)
    one_each = {"a": 1, "b": 1}
    planned = power.detectable_difference(at_least, GROUP, one_each, SD, 2, PAPER.test_puzzles)
    assert planned > 0.01  # undecidable as planned
    needed = power.seeds_to_decide(at_least, GROUP, one_each, SD, 2, PAPER.test_puzzles, 0.01)
    assert needed is not None and needed > 2
    assert detectable(at_least, needed, needed) <= 0.01 < detectable(at_least, needed - 1, needed - 1)
    # Without a planned noise floor one run's spread is unknown: D too, and seeds of its own settle it.
    assert detectable(at_least, 1, 1, floor_df=0) == math.inf
    assert power.seeds_to_decide(at_least, GROUP, one_each, SD, 0, PAPER.test_puzzles, 0.01) == needed


def test_a_measured_mini_table_sets_the_spread_and_the_summary_names_it(tmp_path):
    planned = study(tmp_path, {"experiments": ["exp01a", "exp01c"], "storage": BUCKET}, profile=TPU_PROFILE)
    public = {a.criterion: a for a in power.assess(planned)}
    # exp01.1: the baseline's 3 seeds against 85.4%; exp01.3: hidden 256's one run at least 1 point below it.
    assert set(public) == {"exp01.1", "exp01.3"}
    one_run = public["exp01.3"]
    assert not one_run.decidable and one_run.seeds is not None and one_run.seeds > 3
    assert one_run.added and all(runs > 0 and hours > 0 for runs, hours in one_run.added.values())
    assert "public reproductions" in power.report(planned)

    # The mini scale's baseline measured 3 seeds 1 point apart: half the public spread.
    table = Path(planned.config["results"]) / "mini" / "table.csv"
    table.parent.mkdir(parents=True)
    rows = pd.DataFrame({"id": ["exp01c"] * 3, "test_exact_accuracy": [0.49, 0.50, 0.51]})
    seeds = runs_table(rows, group="exp01").assign(baseline=True)
    seeds.to_csv(table, index=False)
    measured = {a.criterion: a for a in power.assess(planned)}
    for name, assessed in measured.items():
        assert assessed.spread.sd == pytest.approx(SD / 2)
        assert assessed.detectable == pytest.approx(public[name].detectable / 2, rel=0.01)
        assert assessed.seeds < public[name].seeds
    summary = power.report(planned).splitlines()[-1]
    assert (
        "decidable as planned" in summary
        and f"measured: 3 seeds of the noise-floor runs in {table}" in summary
    )


def test_a_spread_measured_at_the_ceiling_is_not_assumed(tmp_path):
    # The mini baseline measured on one H200: 3 seeds at 99.6 to 99.7%, a spread the ceiling squeezes.
    planned = study(tmp_path, {"experiments": ["exp01a", "exp01c"], "storage": BUCKET}, profile=TPU_PROFILE)
    table = Path(planned.config["results"]) / "mini" / "table.csv"
    table.parent.mkdir(parents=True)
    rows = pd.DataFrame({"id": ["exp01c"] * 3, "test_exact_accuracy": [0.997, 0.996, 0.996]})
    runs_table(rows, group="exp01").assign(baseline=True).to_csv(table, index=False)
    spread = power.seed_spread(planned.config["results"], "test_exact_accuracy")
    assert spread.sd == SD and "public reproductions" in spread.source
    assert f"noise-floor runs in {table} sit at 99.6%, where their spread is squeezed" in spread.source
    # Away from the ceiling the same table's spread is the one assumed.
    rows["test_exact_accuracy"] -= 0.1
    runs_table(rows, group="exp01").assign(baseline=True).to_csv(table, index=False)
    assert power.seed_spread(planned.config["results"], "test_exact_accuracy").sd == pytest.approx(
        0.000577, rel=0.01
    )


def test_the_smoke_scale_states_no_power(tmp_path):
    assert power.report(study(tmp_path)) == ""


@pytest.mark.workflow
def test_the_paper_dry_run_prints_a_line_per_criterion(workdir):
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    command = [snakemake, "-n", "--profile", "profiles/tpu-v4-64", "--config", f"storage={BUCKET}"]
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    block = output[output.index("  power:") :].splitlines()
    ids = [f"{g['id']}.{n}" for g in load_groups() for n in range(1, len(g["criteria"]) + 1)]
    for name in ids:
        (line,) = [x for x in block if x.startswith(f"    {name} ")]
        assert re.search(r"decidable$|needs \d+ seeds per point \(\+\d+ runs|not assessed|more than", line)
    assert "exp01.3" in ids and "TPU v4 chip-hours" in next(x for x in block if x.startswith("    exp01.3 "))
    summary = re.search(r"(\d+) of (\d+) criteria decidable as planned .*public reproductions", output)
    assert summary and int(summary[1]) < int(summary[2])  # one seed per point cannot decide 1-point margins


def decided(crit: dict, seeds: dict[str, int], true_difference: float, draws: int = 600) -> float:
    """How often the verdicts' rule (judge.judge_criterion, the floor pooled from b's seeds as the baseline's)
    decides `crit` when a - b is `true_difference` and every run spreads by SD."""
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(draws):
        b = list(0.5 + rng.normal(0, SD, seeds["b"]))
        a = list(0.5 + true_difference + rng.normal(0, SD, seeds["a"]))
        floor = noise_floor({"b": b})
        judged = judge_criterion(crit, GROUP, {"a": a, "b": b}, floor, PAPER.test_puzzles)
        hits += judged["verdict"] != INCONCLUSIVE
    return hits / draws


def test_the_verdicts_decide_at_the_reported_difference_at_least_80_percent_of_the_time():
    # One run against the baseline's 3 seeds, which also measure the noise floor: a true difference D inside
    # the margin is supported, D beyond it not supported, each at least 80% of the time.
    at_most = criterion("at_most", margin=0.01)
    d = detectable(at_most, 1, 3)
    assert decided(at_most, {"a": 1, "b": 3}, 0.01 - d) >= 0.77
    assert decided(at_most, {"a": 1, "b": 3}, 0.01 + d) >= 0.77
    # 3 seeds against 3, two one-sided conditions: equal means are within a tolerance of D.
    d = detectable(criterion("within", tolerance=0.01), 3, 3)
    assert decided(criterion("within", tolerance=d), {"a": 3, "b": 3}, 0.0) >= 0.77

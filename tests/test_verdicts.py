"""Success criteria of config/groups.yaml judged on results tables made here as `trm aggregate` writes them (trm.analysis.verdicts) against the
uncertainty of each difference: clear effects decided, effects inside the noise inconclusive with a seed estimate,
constant metrics no signal, single runs on the noise floor; and the `trm verdicts` command. Bad groups files:
test_groups_file.py."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from workflow_support import groups_file, runs_table

from trm.analysis import verdicts
from trm.analysis.aggregate import CURVE_COLUMNS, RUN_TABLE_COLUMNS, SAMPLED_COLUMNS, TEST_TIME_COLUMNS
from trm.analysis.uncertainty import (
    FLOOR_AND_SAMPLING,
    INCONCLUSIVE,
    NO_DATA,
    NO_SIGNAL,
    NOT_SUPPORTED,
    SAMPLING_ONLY,
    SEEDS,
    SUPPORTED,
)
from trm.analysis.verdicts import group_verdict, judge_groups
from trm.cli import main as trm_main
from trm.errors import UserError
from trm.study.groups import GROUPS_PATH, describe, load_groups

GROUP = {
    "id": "g",
    "title": "t",
    "hypothesis": "h",
    "expected": "e",
    "members": ["a", "b", "c", "d"],
    "baseline": "b",
}
SPLIT = 423_168  # the paper's test puzzles: the sampling interval of a single run is about ±0.1 points
JITTER = (-0.002, 0.0, 0.002)  # three seeds per point: 95% half-width of a difference about 0.5 points


def table(metric: str = "test_exact_accuracy", **values: float) -> pd.DataFrame:
    """Three seeds per experiment around each value: a difference of a few points is clearly decided."""
    rows = [(m, seed, v + jitter) for m, v in values.items() for seed, jitter in enumerate(JITTER)]
    return runs_table(pd.DataFrame(rows, columns=["id", "seed", metric]))


def runs(metric: str = "test_exact_accuracy", **values: list[float]) -> pd.DataFrame:
    """One row per run: each experiment's list holds its seeds' values."""
    rows = [(m, seed, v) for m, vs in values.items() for seed, v in enumerate(vs)]
    return runs_table(pd.DataFrame(rows, columns=["id", "seed", metric]))


def judge(criterion: dict, results: pd.DataFrame, scale: str = "paper") -> dict:
    group = {**GROUP, "criteria": [{"text": "t", "metric": "test_exact_accuracy", **criterion}]}
    return judge_groups([group], results, scale, SPLIT)["groups"][0]["criteria"][0]


def real_groups() -> dict[str, dict]:
    return {g["id"]: g for g in load_groups()}


# ------------------------------------------------------------------------------------------------ check kinds


def test_within_compares_each_member_with_the_best_reference_both_ways():
    criterion = {"check": "within", "members": ["a", "c"], "against": ["b"], "tolerance": 0.02}
    held = judge(criterion, table(a=0.86, b=0.87, c=0.875))
    assert held["verdict"] == SUPPORTED
    assert "a - b: supported: difference -1.0 ± 0.5 points (needs within ± 2.0)" in held["detail"]
    assert judge(criterion, table(a=0.83, b=0.87, c=0.87))["verdict"] == NOT_SUPPORTED
    assert judge(criterion, table(a=0.87, b=0.87, c=0.91))["verdict"] == NOT_SUPPORTED  # above counts too
    # Against the best of several references: "b is within 1 point of the best setting".
    best = {"check": "within", "members": ["b"], "against": ["a", "b", "c", "d"], "tolerance": 0.01}
    result = judge(best, table(a=0.80, b=0.865, c=0.87, d=0.60))
    assert result["verdict"] == SUPPORTED and result["detail"].startswith("b - c: supported")
    assert judge(best, table(a=0.80, b=0.85, c=0.87, d=0.60))["verdict"] == NOT_SUPPORTED


def test_at_least_and_at_most_with_a_margin_or_a_fixed_value():
    beats = {"check": "at_least", "members": ["d"], "against": ["a"], "margin": 0.03}
    assert judge(beats, table(a=0.799, d=0.874))["verdict"] == SUPPORTED
    result = judge(beats, table(a=0.86, d=0.874))
    assert result["verdict"] == NOT_SUPPORTED
    assert "d - a: not supported: difference 1.4 ± 0.5 points (needs >= 3.0)" in result["detail"]
    no_gain = {"check": "at_most", "members": ["c", "d"], "against": ["b"], "margin": 0.01}
    assert judge(no_gain, table(b=0.87, c=0.875, d=0.86))["verdict"] == SUPPORTED
    assert judge(no_gain, table(b=0.87, c=0.875, d=0.89))["verdict"] == NOT_SUPPORTED  # one member is enough
    below = {"check": "at_most", "members": ["a"], "against": ["b"], "margin": -0.01}
    assert judge(below, table(a=0.85, b=0.87))["verdict"] == SUPPORTED
    assert judge(below, table(a=0.868, b=0.87))["verdict"] == NOT_SUPPORTED
    reproduces = {"check": "at_least", "members": ["b"], "value": 0.854}
    assert judge(reproduces, table(b=0.87))["verdict"] == SUPPORTED
    assert judge(reproduces, table(b=0.80))["verdict"] == NOT_SUPPORTED


def test_best_is_one_of_reads_every_member_of_the_group():
    criterion = {"check": "best_is_one_of", "members": ["a", "b"]}
    assert judge(criterion, table(a=0.8, b=0.87, c=0.85, d=0.7))["verdict"] == SUPPORTED
    # A tie with a non-candidate cannot say which is best.
    assert judge(criterion, table(a=0.8, b=0.87, c=0.87, d=0.7))["verdict"] == INCONCLUSIVE
    result = judge(criterion, table(a=0.8, b=0.86, c=0.87, d=0.7))
    assert result["verdict"] == NOT_SUPPORTED and "b - c: not supported" in result["detail"]
    # Without d, the best is unknown even though d is not a candidate.
    result = judge(criterion, table(a=0.8, b=0.87, c=0.85))
    assert result["verdict"] == NO_DATA and result["detail"] == "no run in the table: d"


def test_monotonic_allows_steps_back_up_to_the_tolerance():
    rising = {"check": "monotonic", "members": ["a", "b", "c"], "direction": "increasing", "tolerance": 0.01}
    assert judge(rising, table(a=0.5, b=0.7, c=0.697))["verdict"] == SUPPORTED
    result = judge(rising, table(a=0.5, b=0.7, c=0.65))
    assert result["verdict"] == NOT_SUPPORTED
    assert "b - c: not supported: difference 5.0 ± 0.5 points (needs <= 1.0)" in result["detail"]
    falling = {"check": "monotonic", "members": ["c", "b", "a"], "direction": "decreasing"}
    assert judge(falling, table(a=0.1, b=0.2, c=0.3))["verdict"] == SUPPORTED
    assert judge(falling, table(a=0.1, b=0.3, c=0.2))["verdict"] == NOT_SUPPORTED


def test_missing_run_or_unmeasured_metric_is_not_enough_data():
    criterion = {"check": "at_most", "members": ["c", "d"], "against": ["b"]}
    result = judge(criterion, table(b=0.87, c=0.80))
    assert result["verdict"] == NO_DATA and result["detail"] == "no run in the table: d"
    result = judge(criterion, table(b=0.87, c=math.nan, d=0.8))
    assert result["verdict"] == NO_DATA and result["detail"] == "test_exact_accuracy not measured: c"
    assert [result["estimates"][m]["n"] for m in ("c", "d", "b")] == [0, 3, 3]


def test_group_verdict_any_failure_fails_and_support_needs_every_criterion():
    assert group_verdict([SUPPORTED, SUPPORTED]) == SUPPORTED
    assert group_verdict([NO_DATA, NOT_SUPPORTED, SUPPORTED]) == NOT_SUPPORTED
    assert group_verdict([SUPPORTED, NO_DATA, INCONCLUSIVE]) == NO_DATA
    assert group_verdict([NO_SIGNAL, NO_SIGNAL]) == NO_SIGNAL
    assert group_verdict([SUPPORTED, NO_SIGNAL]) == INCONCLUSIVE
    assert group_verdict([SUPPORTED, INCONCLUSIVE]) == INCONCLUSIVE


def test_best_is_one_of_takes_the_lowest_of_a_metric_where_lower_is_better():
    criterion = {"check": "best_is_one_of", "metric": "step_time_s", "members": ["a"]}
    fastest = judge(criterion, table("step_time_s", a=1.0, b=2.0, c=1.5, d=3.0))
    assert fastest["verdict"] == SUPPORTED and "a - c: supported" in fastest["detail"]
    slower = judge(criterion, table("step_time_s", a=1.2, b=2.0, c=1.0, d=3.0))
    assert slower["verdict"] == NOT_SUPPORTED and "a - c: not supported" in slower["detail"]
    assert describe(criterion) == "the lowest of all the group's members is one of a"


# ----------------------------------------------------------------------------- verdicts under noise (issue 28)


def test_an_effect_inside_the_noise_is_inconclusive_and_says_how_many_seeds_would_resolve_it():
    criterion = {"check": "at_least", "members": ["d"], "against": ["a"], "margin": 0.01}
    clear = runs(a=[0.50, 0.53, 0.56], d=[0.60, 0.62, 0.64])
    assert judge(criterion, clear)["verdict"] == SUPPORTED
    noisy = runs(a=[0.50, 0.56, 0.53], d=[0.57, 0.63, 0.60])
    result = judge(criterion, noisy)
    assert result["verdict"] == INCONCLUSIVE
    assert re.fullmatch(
        r"d - a: inconclusive: difference 7\.0 ± \d+\.\d points \(needs >= 1\.0\); about \d+ seeds per point "
        r"would resolve a difference of this size",
        result["detail"],
    ), result["detail"]
    assert [result["estimates"][m]["n"] for m in ("d", "a")] == [3, 3]


def test_a_metric_equal_for_every_run_is_no_signal_never_supported():
    criterion = {"check": "at_most", "members": ["c", "d"], "against": ["b"], "margin": 0.01}
    zeros = judge(criterion, runs(b=[0.0], c=[0.0], d=[0.0]))
    assert zeros["verdict"] == NO_SIGNAL and zeros["detail"] == "test_exact_accuracy is 0 for every run read"
    group = {**GROUP, "criteria": [{"text": "t", "metric": "test_exact_accuracy", **criterion}]}
    assert (
        judge_groups([group], runs(b=[0.0], c=[0.0], d=[0.0]), "paper", SPLIT)["groups"][0]["verdict"]
        == NO_SIGNAL
    )


def test_single_runs_borrow_the_noise_floor_of_the_baselines_seeds_and_say_so():
    criterion = {"check": "at_most", "members": ["c"], "against": ["b"], "margin": -0.01}
    results = runs(b=[0.55, 0.58, 0.61], c=[0.50])
    results["baseline"] = results["id"] == "b"
    result = judge(criterion, results)
    assert result["estimates"]["c"]["n"] == 1 and result["estimates"]["c"]["source"] == FLOOR_AND_SAMPLING
    assert result["estimates"]["b"]["source"] == SEEDS
    # The floor (sd 0.03, 2 degrees of freedom) makes c's interval far wider than its sampling alone.
    assert result["estimates"]["c"]["high"] - result["estimates"]["c"]["low"] > 0.2
    assert result["verdict"] == INCONCLUSIVE and "seeds per point would resolve" in result["detail"]
    # Without seeds anywhere, only the sampling interval is known: the spread is unknown and nothing is decided.
    alone = judge(criterion, runs(b=[0.58], c=[0.571]))
    assert alone["estimates"]["c"]["source"] == SAMPLING_ONLY
    assert "the seed spread is unknown" in alone["detail"]


# --------------------------------------------------------------------------------- the study's own criteria


def test_study_criteria_on_the_papers_figures():
    groups = real_groups()
    paper = runs_table(
        pd.DataFrame(
            {
                "id": ["exp08a", "exp08b", "exp08c", "exp08d", "exp08e", "exp03b", "exp03d"],
                "test_exact_accuracy": [0.799, 0.83, 0.86, 0.874, 0.87, 0.874, 0.795],
            }
        )
    )
    result = judge_groups([groups["exp08"], groups["exp03"]], paper, "paper", SPLIT)
    assert result["note"] == ""
    ema, depth = result["groups"]
    # One run each, no seeds: the whole split's sampling interval alone (about ±0.1 points), and the table says so.
    assert ema["criteria"][0]["estimates"]["exp08a"]["source"] == SAMPLING_ONLY
    assert [c["verdict"] for c in ema["criteria"]] == [SUPPORTED, SUPPORTED]
    assert ema["verdict"] == SUPPORTED
    # exp03: (2, 6) beats (4, 3) as in the paper; which configuration is best needs all five.
    assert [c["verdict"] for c in depth["criteria"]] == [SUPPORTED, NO_DATA]
    assert depth["verdict"] == NO_DATA


def test_study_criteria_can_fail():
    groups = real_groups()
    results = table(
        exp06_a=0.80,  # more than 2 points below 6144
        exp06_b=0.86,
        exp06_c=0.87,
        exp06_d=0.88,
        exp06_e=0.86,
        exp06_f=0.855,
        contrib01_baseline=0.87,
        contrib01_curriculum=0.875,
    )
    results["examples_per_second"] = [
        v for v in (1e3, 2e3, 3.5e3, 5e3, 5.1e3, 5.2e3, 3.5e3, 3.5e3) for _ in JITTER
    ]
    # The curriculum is slower: 35,000 epochs to 85% against 30,000, each seed a little apart.
    results["epochs_to_85pct"] = [math.nan] * 18 + [
        29_000.0,
        30_000.0,
        31_000.0,
        34_000.0,
        35_000.0,
        36_000.0,
    ]
    batch, curriculum = judge_groups([groups["exp06"], groups["contrib01"]], results, "paper", SPLIT)[
        "groups"
    ]
    assert [c["verdict"] for c in batch["criteria"]] == [NOT_SUPPORTED, SUPPORTED]
    assert "exp06_a - exp06_c: not supported: difference -7.0 ± 0.5 points" in batch["criteria"][0]["detail"]
    assert [c["verdict"] for c in curriculum["criteria"]] == [NOT_SUPPORTED, SUPPORTED]
    assert curriculum["verdict"] == NOT_SUPPORTED


def test_smoke_scale_judges_the_cell_accuracy_the_plots_show_and_says_what_it_tests():
    groups = real_groups()
    results = runs(exp08a=[0.0], exp08b=[0.0], exp08c=[0.0], exp08d=[0.0], exp08e=[0.0])
    results["test_cell_accuracy"] = [0.30, 0.31, 0.33, 0.45, 0.40]
    smoke = judge_groups([groups["exp08"]], results, "smoke", 16)
    assert "short of convergence" in smoke["note"]
    first = smoke["groups"][0]["criteria"][0]
    assert first["metric"] == "test_cell_accuracy" and "exact accuracy is 0 for every run" in first["caveat"]
    # 16 puzzles: a 15-point difference of two single runs is well inside the sampling interval.
    assert first["verdict"] == INCONCLUSIVE
    # The paper scale judges exact accuracy itself: all zero carries no signal.
    paper = judge_groups([groups["exp08"]], results, "paper", 16)["groups"][0]
    assert [c["verdict"] for c in paper["criteria"]] == [NO_SIGNAL, NO_SIGNAL] and paper[
        "verdict"
    ] == NO_SIGNAL
    assert smoke["note"] in verdicts.to_markdown(smoke) and first["caveat"] in verdicts.to_markdown(smoke)
    # A criterion against a published exact accuracy keeps exact accuracy: 0 throughout is no signal.
    baseline = runs(exp01a=[0.0], exp01b=[0.0], exp01c=[0.0], exp01d=[0.0], exp01e=[0.0], exp01f=[0.0])
    baseline["test_cell_accuracy"] = 0.5
    paper_figure = judge_groups([groups["exp01"]], baseline, "smoke", 16)["groups"][0]["criteria"][0]
    assert "value" in groups["exp01"]["criteria"][0] and paper_figure["metric"] == "test_exact_accuracy"
    assert paper_figure["verdict"] == NO_SIGNAL and paper_figure["caveat"] == ""
    assert smoke["note"] in verdicts.summary_rst(smoke).replace("\\", "")
    rst = verdicts.group_rst(smoke["groups"][0], smoke).replace("\\", "")
    assert "Verdict at the smoke scale: inconclusive.** Criteria: 2 inconclusive." in rst
    assert "exp08d 0.45 [" in rst and "(n=1)" in rst and "intervals: sampling only" in rst


def test_a_table_without_a_metric_column_is_refused():
    without = table(exp07a=0.8, exp07b=0.8).drop(columns="step_time_s")
    with pytest.raises(UserError, match="no column step_time_s"):
        judge_groups([real_groups()["exp07"]], without, "paper", SPLIT)


# ------------------------------------------------------------------------------------------------------ CLI


def test_cli_writes_every_output_for_the_groups_in_the_table(tmp_path, capsys):
    csv = tmp_path / "table.csv"
    results = table(exp07a=0.40, exp07b=0.0, exp07c=0.01)
    results["step_time_s"] = [v for v in (2.0, 1.0, 1.5) for _ in JITTER]
    results.to_csv(csv, index=False)
    out = tmp_path / "verdicts"
    args = ["verdicts", "--table", str(csv), "--groups", str(GROUPS_PATH), "--scale", "smoke"]
    args += ["--test-puzzles", "16", "--output", str(out)]
    assert trm_main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "exp07.rst",
        "verdicts.json",
        "verdicts.md",
        "verdicts.rst",
    ]
    written = json.loads((out / "verdicts.json").read_text())
    assert written["scale"] == "smoke" and [g["id"] for g in written["groups"]] == ["exp07"]
    accuracy, speed = written["groups"][0]["criteria"]
    assert accuracy["verdict"] == NOT_SUPPORTED and accuracy["estimates"]["exp07b"]["n"] == 3
    assert accuracy["comparisons"][0]["a"] == "exp07b" and accuracy["comparisons"][0]["b"] == "exp07a"
    assert speed["verdict"] == SUPPORTED
    markdown = (out / "verdicts.md").read_text()
    assert "short of convergence" in markdown and "| exp07 | " in markdown
    assert "1 not supported, 1 supported" not in markdown and "1 supported, 1 not supported" in markdown
    rst = (out / "exp07.rst").read_text()
    assert "**Verdict at the smoke scale: not supported.** Criteria: 1 supported, 1 not supported." in rst
    assert "exp07b - exp07a: not supported: difference -40.0 ± " in rst and "(n=3)" in rst
    assert "short of convergence" in capsys.readouterr().out
    # Named groups are judged even without runs.
    assert trm_main([*args, "exp01", "exp07"]) == 0
    assert [g["verdict"] for g in json.loads((out / "verdicts.json").read_text())["groups"]] == [
        NO_DATA,
        NOT_SUPPORTED,
    ]


def test_cli_refuses_bad_input_and_writes_nothing(tmp_path, capsys):
    csv = tmp_path / "table.csv"
    table(exp07a=0.8).to_csv(csv, index=False)
    out = tmp_path / "verdicts"
    base = ["verdicts", "--table", str(csv), "--scale", "paper", "--test-puzzles", "16", "--output", str(out)]
    assert trm_main([*base, "--groups", str(GROUPS_PATH), "exp99"]) == 2
    assert "unknown group exp99" in capsys.readouterr().err
    bad = groups_file(tmp_path, "check: at_most\n", "check: below\n")
    assert trm_main([*base, "--groups", str(bad)]) == 2
    assert "unknown kind 'below'" in capsys.readouterr().err
    missing = ["verdicts", "--table", str(tmp_path / "none.csv"), "--groups", str(GROUPS_PATH)]
    assert trm_main([*missing, "--scale", "paper", "--test-puzzles", "16", "--output", str(out)]) == 2
    assert "none.csv: missing" in capsys.readouterr().err
    assert not out.exists()


def test_plot_group_refuses_missing_malformed_or_foreign_tables_and_groups(tmp_path, capsys):
    out = tmp_path / "plots" / "exp07"
    base = ["plot-group", "exp07", "--output", str(out)]

    def refused(table: Path, groups: Path) -> str:
        assert trm_main([*base, "--table", str(table), "--groups", str(groups)]) == 2
        return capsys.readouterr().err

    assert "none.csv: missing; `trm aggregate` writes it" in refused(tmp_path / "none", GROUPS_PATH)
    good = tmp_path / "good"
    headers = {
        "": RUN_TABLE_COLUMNS,
        "-curves": CURVE_COLUMNS,
        "-test-time": TEST_TIME_COLUMNS,
        "-sampled": SAMPLED_COLUMNS,
    }
    for suffix, columns in headers.items():
        Path(f"{good}{suffix}.csv").write_text(",".join(columns) + "\n")
    # Each of the four tables is read; one missing is named, with the command that writes it.
    Path(f"{good}-sampled.csv").rename(tmp_path / "kept.csv")
    assert "good-sampled.csv: missing; `trm aggregate` writes it" in refused(good, GROUPS_PATH)
    (tmp_path / "kept.csv").rename(f"{good}-sampled.csv")
    (tmp_path / "foreign.csv").write_text("a,b\n1,2\n")
    assert "foreign.csv: no column id, group, baseline, varied" in refused(tmp_path / "foreign", GROUPS_PATH)
    # A hand-edited table that lost a column the plots read is refused naming it, before anything is drawn.
    edited = tmp_path / "edited"
    for suffix, columns in headers.items():
        kept = [c for c in columns if c != "count"]
        Path(f"{edited}{suffix}.csv").write_text(",".join(kept) + "\n")
    assert "edited-curves.csv: no column count: not a table" in refused(edited, GROUPS_PATH)
    (tmp_path / "broken.csv").write_text('id,group\nexp07a,exp07,"unterminated\n')
    assert "broken.csv: not a readable CSV table" in refused(tmp_path / "broken", GROUPS_PATH)
    bad_yaml = tmp_path / "groups.yaml"
    bad_yaml.write_text("groups: [\n")
    assert f"{bad_yaml}: not valid YAML" in refused(good, bad_yaml)
    bad_yaml.write_text("- exp07\n")
    assert "expected a mapping of keys (groups file) at the top level" in refused(good, bad_yaml)
    assert "groups file not found" in refused(good, tmp_path / "nope.yaml")
    assert not out.parent.exists()

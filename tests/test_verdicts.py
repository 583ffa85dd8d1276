"""Success criteria of config/groups.yaml judged on hand-made results tables (trm.analysis.verdicts), bad criteria
refused by load_groups, and the `trm verdicts` command."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from trm.analysis import verdicts
from trm.analysis.verdicts import (
    NO_DATA,
    NOT_SUPPORTED,
    SUPPORTED,
    evaluate,
    evaluate_criterion,
    group_verdict,
)
from trm.cli import main as trm_main
from trm.config import EXPERIMENTS_DIR
from trm.errors import UserError
from trm.study.groups import CHECK_FIELDS, GROUPS_PATH, describe, load_groups

GROUP = {"id": "g", "title": "test group", "members": ["a", "b", "c", "d"], "baseline": "b"}


def table(metric: str = "test_exact_accuracy", **values: float) -> pd.DataFrame:
    return pd.DataFrame({"id": list(values), metric: list(values.values())})


def judge(criterion: dict, results: pd.DataFrame) -> dict:
    return evaluate_criterion({"text": "t", "metric": "test_exact_accuracy", **criterion}, GROUP, results)


def real_groups() -> dict[str, dict]:
    return {g["id"]: g for g in load_groups()}


# ------------------------------------------------------------------------------------------------ check kinds


def test_within_compares_each_member_with_the_best_reference_both_ways():
    criterion = {"check": "within", "members": ["a", "c"], "reference": ["b"], "tolerance": 0.02}
    held = judge(criterion, table(a=0.85, b=0.87, c=0.88))
    assert held["verdict"] == SUPPORTED
    assert "largest difference 0.02 (a) <= tolerance 0.02" in held["detail"]  # 0.87 - 0.85 is 0.0200000001
    assert judge(criterion, table(a=0.84, b=0.87, c=0.87))["verdict"] == NOT_SUPPORTED
    assert judge(criterion, table(a=0.87, b=0.87, c=0.90))["verdict"] == NOT_SUPPORTED  # above counts too
    # Against the best of several references: "b is within 1 point of the best setting".
    best = {"check": "within", "members": ["b"], "reference": ["a", "b", "c", "d"], "tolerance": 0.01}
    result = judge(best, table(a=0.80, b=0.865, c=0.87, d=0.60))
    assert result["verdict"] == SUPPORTED and "the highest of a, b, c, d, c 0.87" in result["detail"]
    assert judge(best, table(a=0.80, b=0.85, c=0.87, d=0.60))["verdict"] == NOT_SUPPORTED


def test_at_least_and_at_most_with_a_margin_or_a_fixed_value():
    beats = {"check": "at_least", "members": ["d"], "reference": ["a"], "margin": 0.03}
    assert judge(beats, table(a=0.799, d=0.874))["verdict"] == SUPPORTED
    result = judge(beats, table(a=0.85, d=0.874))
    assert result["verdict"] == NOT_SUPPORTED
    assert "needs >= a 0.85 + 0.03 = 0.88: d 0.874 does not" in result["detail"]
    no_gain = {"check": "at_most", "members": ["c", "d"], "reference": ["b"], "margin": 0.01}
    assert judge(no_gain, table(b=0.87, c=0.875, d=0.86))["verdict"] == SUPPORTED
    assert judge(no_gain, table(b=0.87, c=0.875, d=0.89))["verdict"] == NOT_SUPPORTED  # one member is enough
    below = {"check": "at_most", "members": ["a"], "reference": ["b"], "margin": -0.01}
    assert judge(below, table(a=0.85, b=0.87))["verdict"] == SUPPORTED
    assert judge(below, table(a=0.865, b=0.87))["verdict"] == NOT_SUPPORTED
    reproduces = {"check": "at_least", "members": ["b"], "value": 0.854}
    assert judge(reproduces, table(b=0.87))["verdict"] == SUPPORTED
    assert judge(reproduces, table(b=0.80))["verdict"] == NOT_SUPPORTED


def test_best_is_one_of_reads_every_member_of_the_group():
    criterion = {"check": "best_is_one_of", "members": ["a", "b"]}
    assert judge(criterion, table(a=0.8, b=0.87, c=0.85, d=0.7))["verdict"] == SUPPORTED
    assert judge(criterion, table(a=0.8, b=0.87, c=0.87, d=0.7))["verdict"] == SUPPORTED  # a tie counts
    result = judge(criterion, table(a=0.8, b=0.86, c=0.87, d=0.7))
    assert result["verdict"] == NOT_SUPPORTED and "highest: c 0.87" in result["detail"]
    # Without d, the best is unknown even though d is not a candidate.
    result = judge(criterion, table(a=0.8, b=0.87, c=0.85))
    assert result["verdict"] == NO_DATA and result["detail"] == "no run in the table: d"


def test_monotonic_allows_steps_back_up_to_the_tolerance():
    rising = {"check": "monotonic", "members": ["a", "b", "c"], "direction": "increasing", "tolerance": 0.01}
    assert judge(rising, table(a=0.5, b=0.7, c=0.695))["verdict"] == SUPPORTED
    result = judge(rising, table(a=0.5, b=0.7, c=0.65))
    assert result["verdict"] == NOT_SUPPORTED
    assert "falls by 0.05 from b to c (tolerance 0.01)" in result["detail"]
    falling = {"check": "monotonic", "members": ["c", "b", "a"], "direction": "decreasing"}
    assert judge(falling, table(a=0.1, b=0.2, c=0.3))["verdict"] == SUPPORTED
    assert judge(falling, table(a=0.1, b=0.3, c=0.2))["verdict"] == NOT_SUPPORTED


def test_missing_run_or_unmeasured_metric_is_not_enough_data():
    criterion = {"check": "at_most", "members": ["c", "d"], "reference": ["b"]}
    result = judge(criterion, table(b=0.87, c=0.80))
    assert result["verdict"] == NO_DATA and result["detail"] == "no run in the table: d"
    result = judge(criterion, table(b=0.87, c=math.nan, d=0.8))
    assert result["verdict"] == NO_DATA and result["detail"] == "test_exact_accuracy not measured: c"
    assert result["values"] == {"c": None, "d": 0.8, "b": 0.87}


def test_group_verdict_needs_every_criterion_for_support():
    assert group_verdict([SUPPORTED, SUPPORTED]) == SUPPORTED
    assert group_verdict([SUPPORTED, NO_DATA]) == NO_DATA
    assert group_verdict([NO_DATA, NOT_SUPPORTED, SUPPORTED]) == NOT_SUPPORTED


def test_every_check_kind_has_a_function():
    assert set(verdicts.CHECKS) == set(CHECK_FIELDS)


def test_best_is_one_of_takes_the_lowest_of_a_metric_where_lower_is_better():
    criterion = {"text": "t", "check": "best_is_one_of", "metric": "step_time_s", "members": ["a"]}
    fastest = evaluate_criterion(criterion, GROUP, table("step_time_s", a=1.0, b=2.0, c=1.5, d=3.0))
    assert fastest["verdict"] == SUPPORTED and "lowest: a 1" in fastest["detail"]
    slower = evaluate_criterion(criterion, GROUP, table("step_time_s", a=1.2, b=2.0, c=1.0, d=3.0))
    assert slower["verdict"] == NOT_SUPPORTED and "lowest: c 1" in slower["detail"]
    assert describe(criterion) == "the lowest of all the group's members is one of a"


# --------------------------------------------------------------------------------- the study's own criteria


def test_study_criteria_on_the_papers_figures():
    groups = real_groups()
    paper = pd.DataFrame(
        {
            "id": ["exp08a", "exp08b", "exp08c", "exp08d", "exp08e", "exp03b", "exp03d"],
            "test_exact_accuracy": [0.799, 0.83, 0.86, 0.874, 0.87, 0.874, 0.795],
        }
    )
    result = evaluate([groups["exp08"], groups["exp03"]], paper, "paper")
    assert result["note"] == ""
    ema, depth = result["groups"]
    assert [c["verdict"] for c in ema["criteria"]] == [SUPPORTED, SUPPORTED]
    assert ema["verdict"] == SUPPORTED
    # exp03: (2, 6) beats (4, 3) as in the paper; which configuration is best needs all five.
    assert [c["verdict"] for c in depth["criteria"]] == [SUPPORTED, NO_DATA]
    assert depth["verdict"] == NO_DATA


def test_study_criteria_can_fail():
    groups = real_groups()
    rows = {
        "exp06_a": 0.80,  # more than 2 points below 6144
        "exp06_b": 0.86,
        "exp06_c": 0.87,
        "exp06_d": 0.88,
        "exp06_e": 0.86,
        "exp06_f": 0.85,
        "contrib01_baseline": 0.87,
        "contrib01_curriculum": 0.875,
    }
    results = table(**rows)
    results["examples_per_second"] = [1000.0, 2000.0, 3500.0, 5000.0, 5100.0, 5200.0, 3500.0, 3500.0]
    results["epochs_to_85pct"] = [math.nan] * 6 + [30000.0, 30000.0]  # the curriculum is not faster
    batch, curriculum = evaluate([groups["exp06"], groups["contrib01"]], results, "paper")["groups"]
    assert [c["verdict"] for c in batch["criteria"]] == [NOT_SUPPORTED, SUPPORTED]
    assert "largest difference 0.07 (exp06_a) > tolerance 0.02" in batch["criteria"][0]["detail"]
    assert [c["verdict"] for c in curriculum["criteria"]] == [NOT_SUPPORTED, SUPPORTED]
    assert curriculum["verdict"] == NOT_SUPPORTED


def test_smoke_scale_results_say_they_test_nothing():
    groups = real_groups()
    results = table(exp08a=0.0, exp08b=0.0, exp08c=0.0, exp08d=0.0, exp08e=0.0)
    result = evaluate([groups["exp08"]], results, "smoke")
    assert "too short to test the hypothesis" in result["note"]
    assert result["groups"] == evaluate([groups["exp08"]], results, "paper")["groups"]  # judged the same way
    assert result["note"] in verdicts.to_markdown(result)
    assert result["note"] in verdicts.summary_rst(result).replace("\\", "")
    assert "Verdict at the smoke scale" in verdicts.group_rst(result["groups"][0], result)


def test_a_table_without_a_metric_column_is_refused():
    with pytest.raises(UserError, match="no column step_time_s"):
        evaluate([real_groups()["exp07"]], table(exp07a=0.8, exp07b=0.8), "paper")


# ------------------------------------------------------------------------------------------ bad groups file


def groups_file(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of config/groups.yaml (with the experiment files beside it) with one edit."""
    text = GROUPS_PATH.read_text()
    assert old in text
    path = tmp_path / "config" / "groups.yaml"
    path.parent.mkdir()
    path.write_text(text.replace(old, new, 1))
    shutil.copytree(EXPERIMENTS_DIR, path.parent / "experiments")
    return path


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("check: at_most\n", "check: below\n", "criteria[1]: check: unknown kind 'below' (one of within,"),
        (
            "members: [exp01d, exp01e, exp01f]\n        reference",
            "members: [exp01d, exp01z, exp01f]\n        reference",
            "criteria[1]: members: 'exp01z' is not a member of the group",
        ),
        (
            "metric: test_exact_accuracy\n        members: [exp01d",
            "metric: test_accuracy\n        members: [exp01d",
            "criteria[1]: metric 'test_accuracy' is not a column of the results table",
        ),
        (
            "metric: test_exact_accuracy\n        members: [exp01d",
            "metric: test_exact_accuracy_raw\n        members: [exp01d",
            "criteria[1]: metric 'test_exact_accuracy_raw' is not a column of the results table",
        ),
        (
            "        margin: 0.01\n",
            "        tolerence: 0.01\n",
            "criteria[1]: unknown field 'tolerence' for check",
        ),
        ("        value: 0.854\n", "", "criteria[0]: check 'at_least' needs exactly one of 'reference'"),
        (
            "    how_to_read: >-\n      Test exact accuracy against parameter",
            "    how_to_read: >-\n      Test",
            None,
        ),
        (
            "    hypothesis: >-\n      On 1000",
            "    hypothesys: >-\n      On 1000",
            "missing field 'hypothesis'",
        ),
    ],
)
def test_bad_criteria_or_guide_fields_are_refused_naming_file_group_and_field(tmp_path, old, new, message):
    path = groups_file(tmp_path, old, new)
    if message is None:  # a harmless edit: the copy itself loads
        assert len(load_groups(path, path.parent / "experiments")) == 14
        return
    with pytest.raises(UserError) as err:
        load_groups(path, path.parent / "experiments")
    assert f"{path}: group 'exp01': " in str(err.value) and message in str(err.value)


def test_best_of_a_metric_or_a_pareto_front_needs_a_better_direction(tmp_path):
    old = "check: best_is_one_of\n        metric: test_exact_accuracy\n        members: [exp03a"
    path = groups_file(tmp_path, old, old.replace("test_exact_accuracy", "parameter_count"))
    with pytest.raises(UserError) as err:
        load_groups(path, path.parent / "experiments")
    assert (
        "group 'exp03': criteria[1]: check 'best_is_one_of' needs a metric with a better direction; "
        in str(err.value)
    )
    pareto = "{x: examples_per_second, y: test_exact_accuracy, log_x: false, kind: pareto}"
    (tmp_path / "pareto").mkdir()
    path = groups_file(tmp_path / "pareto", pareto, pareto.replace("examples_per_second", "effective_depth"))
    with pytest.raises(UserError) as err:
        load_groups(path, path.parent / "experiments")
    assert "group 'exp03': a pareto plot needs metrics with a better direction on both axes; x " in str(
        err.value
    )


def test_monotonic_needs_a_direction(tmp_path):
    path = groups_file(tmp_path, "direction: increasing\n        tolerance: 0.01\n", "tolerance: 0.01\n")
    with pytest.raises(UserError) as err:
        load_groups(path, path.parent / "experiments")
    assert "group 'exp02a': criteria[0]: missing field 'direction' for check 'monotonic'" in str(err.value)


# ------------------------------------------------------------------------------------------------------ CLI


def test_cli_writes_every_output_for_the_groups_in_the_table(tmp_path, capsys):
    csv = tmp_path / "table.csv"
    results = table(exp07a=0.02, exp07b=0.0, exp07c=0.01)
    results["step_time_s"] = [2.0, 1.0, 1.5]
    results.to_csv(csv, index=False)
    out = tmp_path / "verdicts"
    args = [
        "verdicts",
        "--table",
        str(csv),
        "--groups",
        str(GROUPS_PATH),
        "--scale",
        "smoke",
        "--output",
        str(out),
    ]
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
    assert accuracy["verdict"] == NOT_SUPPORTED and accuracy["values"] == {"exp07b": 0.0, "exp07a": 0.02}
    assert speed["verdict"] == SUPPORTED
    assert "too short to test the hypothesis" in (out / "verdicts.md").read_text()
    rst = (out / "exp07.rst").read_text()
    assert "**Verdict at the smoke scale: not supported.**" in rst and "exp07b 0 against exp07a 0.02" in rst
    assert "too short" in capsys.readouterr().out
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
    base = ["verdicts", "--table", str(csv), "--scale", "paper", "--output", str(out)]
    assert trm_main([*base, "--groups", str(GROUPS_PATH), "exp99"]) == 2
    assert "unknown group exp99" in capsys.readouterr().err
    bad = groups_file(tmp_path, "check: at_most\n", "check: below\n")
    assert trm_main([*base, "--groups", str(bad)]) == 2
    assert "unknown kind 'below'" in capsys.readouterr().err
    missing = ["verdicts", "--table", str(tmp_path / "none.csv"), "--groups", str(GROUPS_PATH)]
    assert trm_main([*missing, "--scale", "paper", "--output", str(out)]) == 2
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
    for suffix in ("", "-curves", "-test-time"):
        Path(f"{good}{suffix}.csv").write_text("id,group\nexp07a,exp07\n")
    (tmp_path / "foreign.csv").write_text("a,b\n1,2\n")
    assert "foreign.csv: no column id, group: not a table" in refused(tmp_path / "foreign", GROUPS_PATH)
    (tmp_path / "broken.csv").write_text('id,group\nexp07a,exp07,"unterminated\n')
    assert "broken.csv: not a readable CSV table" in refused(tmp_path / "broken", GROUPS_PATH)
    bad_yaml = tmp_path / "groups.yaml"
    bad_yaml.write_text("groups: [\n")
    assert f"{bad_yaml}: not valid YAML" in refused(good, bad_yaml)
    bad_yaml.write_text("- exp07\n")
    assert "expected a mapping of keys (groups file) at the top level" in refused(good, bad_yaml)
    assert "groups file not found" in refused(good, tmp_path / "nope.yaml")
    assert not out.parent.exists()

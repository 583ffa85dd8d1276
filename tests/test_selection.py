"""A selection of the study (`--config experiments=[...]` or `groups=[...]`; trm/study/selection.py): its table,
verdicts and plots in a folder of its own, never over the whole study's; the study's floor set planned with it,
so that its noise floor, hence every interval, is the whole study's; and those floor-only runs in its table but in
none of its verdicts and plots."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from workflow_support import finished_runs, runs_table, study

from trm.analysis.plots import plot_group
from trm.analysis.uncertainty import FLOOR_AND_SAMPLING, NO_DATA, SAMPLING_ONLY
from trm.analysis.verdicts import judge_groups
from trm.cli import main as trm_main
from trm.study.groups import GROUPS_PATH, load_groups, load_references
from trm.study.selection import floor_set, selection_name

GROUPS = load_groups()
REFERENCES = [ref["id"] for ref in load_references()]
EVERY = [m for g in GROUPS for m in g["members"]] + REFERENCES


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A folder whose results hold the whole study's finished runs (`finished_runs`) and its table (`_aggregate`)."""
    root = tmp_path_factory.mktemp("study")
    whole = study(root)
    # A run's accuracy depends on its run alone (experiments with equal configs share it), seeds differ.
    accuracy = {run: 0.2 + int(exp.hash[:6], 16) % 50 / 100 for run, exp in whole.plan.items()}
    finished_runs(whole, accuracy, dict.fromkeys(accuracy, 60.0))
    _aggregate(whole, Path(whole.analysis) / "table")
    return root


def test_a_selection_is_named_by_what_it_selects_and_the_whole_study_by_nothing():
    def name(*ids: str) -> str | None:
        return selection_name(list(ids), GROUPS, REFERENCES)

    assert name(*EVERY) is None  # every experiment, however it was asked for: the whole study
    assert name("exp01a") == "exp01a" and name("exp01a", "exp06_c") == "exp01a+exp06_c"
    exp06 = next(g["members"] for g in GROUPS if g["id"] == "exp06")
    assert name(*exp06, *REFERENCES) == "groups-exp06"  # whole groups with the references
    exp01 = next(g["members"] for g in GROUPS if g["id"] == "exp01")
    assert name(*exp01, *exp06, *REFERENCES) == "groups-exp01+exp06"
    assert name(*exp06) == "+".join(exp06)  # without the reference run: its experiments
    # Too long for a folder name: the first id, how many more, and a hash of the whole list.
    long = [m for g in GROUPS[:3] for m in g["members"]]
    shortened = name(*long)
    assert re.fullmatch(rf"{long[0]}\+{len(long) - 1}-more-[0-9a-f]{{8}}", shortened)
    assert name(*long[:-1]) != shortened and name(*long) == shortened


def test_a_selection_writes_its_analysis_in_its_own_folder_and_plans_the_floors_runs_it_lacks(root):
    whole = study(root)
    results = root / "results" / "smoke"
    assert whole.analysis == str(results) and whole.floor_only == []
    one = study(root, {"experiments": ["exp01a"]})
    assert one.analysis == str(results / "selections" / "exp01a")
    assert (one.selected_groups, one.references) == (["exp01"], [])
    # The floor set, one id per distinct run: every group's baseline (with its replicates) and the reference
    # runs, 43 ids of the whole study but 4 runs at the smoke scale (the baselines share one config), of which the
    # 3 seeds of the baselines' configuration measure the floor (the reference run's one seed measures no spread).
    wanted = set(floor_set(GROUPS, REFERENCES))
    reference_runs = {exp.hash for exp in whole.plan.values() if exp.experiment in wanted}
    assert (
        len([exp for exp in whole.plan.values() if exp.experiment in wanted]) == 43
        and len(reference_runs) == 4
    )
    assert one.floor_only == ["exp01c", "exp01c~s1", "exp01c~s2"]
    assert {one.plan[run].hash for run in one.floor_only} == reference_runs - {whole.plan["ref_paper"].hash}
    assert [run for run in one.plan if run not in one.floor_only] == ["exp01a"]
    # A selected baseline's seeds are the floor set's runs already: nothing is added.
    assert study(root, {"experiments": ["exp06_c", "exp01a"]}).floor_only == []
    group = study(root, {"groups": ["exp06"]})
    assert group.analysis == str(results / "selections" / "groups-exp06") and group.floor_only == []


def _aggregate(planned, output: Path) -> pd.DataFrame:
    selected = [run for run in planned.plan if run not in planned.floor_only]
    args = ["aggregate", *selected, "--results", planned.results, "--groups", str(GROUPS_PATH)]
    args += ["--peak-flops", "5e10", "--utilization", "0.1", "--test-puzzles", "24", "--output", str(output)]
    args += ["--floor-only", *planned.floor_only] if planned.floor_only else []
    assert trm_main(args) == 0
    return pd.read_csv(f"{output}.csv")


def test_a_one_experiment_selections_interval_is_the_whole_studys(root):
    """The user's case: after the whole study, `--config experiments=[exp01a]` gave exp01a's interval from sampling
    alone (no baseline seeds in its table), far narrower than the whole study's, which borrows the noise floor."""
    whole = study(root)
    full = pd.read_csv(Path(whole.analysis) / "table.csv").set_index("run")
    one = study(root, {"experiments": ["exp01a"]})
    table = _aggregate(one, Path(one.analysis) / "table").set_index("run")
    columns = [f"test_exact_accuracy_{x}" for x in ("mean", "n", "low", "high", "interval")]
    assert full.loc["exp01a", columns[-1]] == FLOOR_AND_SAMPLING != SAMPLING_ONLY
    assert table.loc["exp01a", columns].to_dict() == full.loc["exp01a", columns].to_dict()
    assert table["floor_only"].to_dict() == {
        "exp01a": False,
        **dict.fromkeys(["exp01c", "exp01c~s1", "exp01c~s2"], True),
    }
    intact = pd.read_csv(Path(whole.analysis) / "table.csv")
    assert len(intact) == len(whole.plan)  # the whole study's table


def test_floor_only_rows_measure_the_noise_floor_and_are_judged_in_no_criterion():
    group = {
        "id": "g",
        "title": "t",
        "hypothesis": "h",
        "expected": "e",
        "members": ["b", "c"],
        "baseline": "b",
    }
    rows = pd.DataFrame({"id": ["b", "b", "b", "c"], "test_exact_accuracy": [0.55, 0.58, 0.61, 0.50]})
    table = runs_table(rows)
    table["baseline"] = table["floor_only"] = table["id"] == "b"
    criteria = [
        {
            "text": "t",
            "metric": "test_exact_accuracy",
            "check": "at_most",
            "members": ["c"],
            "against": ["b"],
        },
        {"text": "t", "metric": "test_exact_accuracy", "check": "at_most", "members": ["c"], "value": 0.9},
    ]
    against_b, against_value = judge_groups([{**group, "criteria": criteria}], table, "paper", 423_168)[
        "groups"
    ][0]["criteria"]
    assert against_b["verdict"] == NO_DATA and against_b["detail"] == "no run in the table: b"
    assert against_value["estimates"]["c"]["source"] == FLOOR_AND_SAMPLING  # b's seeds measured the floor


def test_a_plot_draws_no_floor_only_run_but_its_bands_use_their_floor(tmp_path):
    group = next(g for g in GROUPS if g["id"] == "exp09")  # a curve panel and the test-time panel
    baseline, member = group["baseline"], next(m for m in group["members"] if m != group["baseline"])
    seeds = [(baseline, seed, 0.2 + 0.05 * seed) for seed in range(3)] + [(member, 0, 0.3)]
    runs = runs_table(pd.DataFrame(seeds, columns=["id", "seed", "test_exact_accuracy"]), "exp09")
    runs["baseline"] = runs["floor_only"] = runs["id"] == baseline
    runs["test_cell_accuracy"] = runs["test_exact_accuracy"] + 0.3
    points = list(zip(runs["id"], runs["run"], runs["test_exact_accuracy"], strict=True))
    curves = pd.DataFrame(
        [
            {"id": exp, "run": run, "group": "exp09", "epoch": epoch, "count": 24}
            | {"test_exact_accuracy": value, "test_cell_accuracy": value + 0.3}
            for exp, run, value in points
            for epoch in (36, 72)
        ]
    )
    test_time = pd.DataFrame(
        [
            {"id": exp, "run": run, "group": "exp09", "baseline": exp == baseline, "steps": k, "count": 24}
            | {"exact_accuracy": value, "accuracy": value + 0.3}
            for exp, run, value in points
            for k in (16, 32)
        ]
    )
    plot_group("exp09", runs, curves, test_time, Path(GROUPS_PATH), tmp_path / "exp09")
    svg = (tmp_path / "exp09.svg").read_text()
    assert f"run:{member}" in svg and baseline not in svg
    assert f"{member} (n=1: noise floor + sampling (Wilson))" in svg

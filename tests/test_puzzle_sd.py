"""The sampling interval of a one-run cell accuracy from its per-puzzle standard deviation (a run's
test_cell_accuracy_puzzle_sd, the final evaluation's accuracy_puzzle_sd): the t interval mean ± t(n - 1) sd / √n
over the n test puzzles, Wilson's bound where the sd is not recorded, and the table's interval column saying which.
Expected figures are written out here from textbook quantiles, never taken from the module's own output."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from workflow_support import runs_table

from trm.analysis.judge import PUZZLE_SD_COLUMNS, add_estimates, noise_floors, puzzle_sds
from trm.analysis.uncertainty import (
    FLOOR_AND_PUZZLE_SD,
    FLOOR_AND_SAMPLING,
    PUZZLE_SD_ONLY,
    SAMPLING_ONLY,
    SEEDS,
    difference,
    estimate,
    wilson_interval,
)
from trm.analysis.verdicts import judge_groups
from trm.study.metrics import RUN_METRICS, SUMMARY_METRICS

T15 = 2.131450  # Student t at 0.975 with 15 degrees of freedom (16 puzzles)
T2 = 4.302653  # ... with 2 (a floor of 3 seeds)
SD_COLUMN = "test_cell_accuracy_puzzle_sd"


def test_the_puzzle_sd_gives_the_t_interval_over_the_puzzles():
    alone = estimate([0.40], None, puzzles=16, puzzle_sd=0.2)
    assert alone.source == PUZZLE_SD_ONLY
    assert (alone.low, alone.high) == pytest.approx((0.40 - T15 * 0.05, 0.40 + T15 * 0.05), abs=1e-6)
    # Narrower than Wilson's bound, which takes every puzzle as all right or all wrong.
    w_low, w_high = wilson_interval(0.40 * 16, 16)
    assert alone.high - alone.low < (w_high - w_low) / 2
    # With the noise floor: the two half-widths in quadrature.
    floor = noise_floors(
        pd.DataFrame({"id": ["b"] * 3, "config_key": ["h"] * 3, "seed": [0, 1, 2], "m": [0.50, 0.52, 0.54]}),
        ["m"],
        ["b"],
    )
    both = estimate([0.40], floor["m"], puzzles=16, puzzle_sd=0.2)
    assert both.source == FLOOR_AND_PUZZLE_SD
    assert both.high - 0.40 == pytest.approx(math.hypot(T2 * 0.02, T15 * 0.05), abs=1e-6)
    # Seeds win over both: the puzzle sd of a seeded experiment does not enter.
    assert estimate([0.40, 0.42], None, puzzles=16, puzzle_sd=0.2).source == SEEDS


@pytest.mark.parametrize("sd", [None, math.nan, 0.0])
def test_without_a_recorded_sd_the_interval_is_wilsons(sd):
    fallback = estimate([0.40], None, puzzles=16, puzzle_sd=sd)
    assert fallback.source == SAMPLING_ONLY
    assert (fallback.low, fallback.high) == pytest.approx(wilson_interval(0.40 * 16, 16))


def test_a_difference_of_two_one_run_points_has_welch_satterthwaite_degrees_of_freedom():
    a = estimate([0.40], None, puzzles=16, puzzle_sd=0.2)
    b = estimate([0.30], None, puzzles=16, puzzle_sd=0.2)
    d = difference(a, b)
    # Equal variances of 15 degrees of freedom each: 30 together; se = √2 · 0.05.
    assert d.df == pytest.approx(30) and d.se == pytest.approx(math.sqrt(2) * 0.05)
    assert d.half_width == pytest.approx(2.042272 * math.sqrt(2) * 0.05, rel=1e-5)  # t(0.975, 30)


def test_the_sd_is_a_run_metric_of_the_table_but_not_a_column_of_the_summaries():
    assert PUZZLE_SD_COLUMNS == {"test_cell_accuracy": SD_COLUMN}
    assert SD_COLUMN in RUN_METRICS and SD_COLUMN in SUMMARY_METRICS
    # {metric}_sd is the sd over seeds: the per-puzzle sd must not share its name.
    assert all(f"{metric}_sd" != SD_COLUMN for metric in SUMMARY_METRICS)


def _table(**columns) -> pd.DataFrame:
    """a, c: one run each; b: 3 seeds (the noise floor). No run recorded its per-puzzle sd unless given."""
    return runs_table(
        pd.DataFrame(
            {
                "id": ["b", "b", "b", "a", "c"],
                "baseline": [True, True, True, False, False],
                "config_key": ["h", "h", "h", "x", "y"],
                "seed": [0, 1, 2, 0, 0],
                "test_cell_accuracy": [0.50, 0.52, 0.54, 0.40, 0.30],
                "test_exact_accuracy": [0.0, 0.0, 0.0, 0.0, 0.0],
                **columns,
            }
        )
    )


def test_the_table_reads_each_one_run_experiments_sd_and_names_the_interval_it_gave():
    table = _table(**{SD_COLUMN: [0.1, 0.1, 0.1, 0.2, math.nan]})  # c's run did not record it
    assert puzzle_sds(table, "test_cell_accuracy") == {"b": None, "a": 0.2, "c": None}
    assert puzzle_sds(table, "test_exact_accuracy") == {}  # a binomial: Wilson's interval is the right one
    metrics = ["test_cell_accuracy", "test_exact_accuracy"]
    out = add_estimates(table, metrics, noise_floors(table, metrics, ["b"]), test_puzzles=16).set_index("id")
    assert out.loc["a", "test_cell_accuracy_interval"] == FLOOR_AND_PUZZLE_SD
    assert out.loc["a", "test_cell_accuracy_high"] - 0.40 == pytest.approx(math.hypot(T2 * 0.02, T15 * 0.05))
    assert out.loc["c", "test_cell_accuracy_interval"] == FLOOR_AND_SAMPLING  # the fallback, said so
    # A binomial: Wilson's; and no floor, since every seed of the baseline read 0 (no measurement of the noise).
    assert out.loc["a", "test_exact_accuracy_interval"] == SAMPLING_ONLY
    assert set(out.loc["b", "test_cell_accuracy_interval"]) == {SEEDS}


def test_a_run_without_a_recorded_sd_keeps_wilsons_interval():
    table = _table()
    assert table[SD_COLUMN].isna().all()
    out = add_estimates(table, ["test_cell_accuracy"], {}, test_puzzles=16).set_index("id")
    assert out.loc["a", "test_cell_accuracy_interval"] == SAMPLING_ONLY
    assert (out.loc["a", "test_cell_accuracy_low"], out.loc["a", "test_cell_accuracy_high"]) == pytest.approx(
        wilson_interval(0.40 * 16, 16)
    )


def test_the_verdicts_judge_a_smoke_cell_accuracy_on_the_runs_puzzle_sd():
    group = {
        "id": "g",
        "title": "t",
        "hypothesis": "h",
        "expected": "e",
        "members": ["a", "b", "c"],
        "baseline": "b",
        "criteria": [
            {
                "text": "t",
                "metric": "test_exact_accuracy",
                "check": "at_least",
                "members": ["a"],
                "against": ["c"],
            }
        ],
    }
    # 0.40 - 0.30 over 16 puzzles: Wilson's bound (about ±22 points a side) cannot decide it; a per-puzzle sd of
    # 0.05 (±2.7 points a side, with the floor of 2 points x 4.3 in quadrature) can.
    sds = {SD_COLUMN: [0.05, 0.05, 0.05, 0.05, 0.05]}
    (criterion,) = judge_groups([group], _table(**sds), "smoke", 16)["groups"][0]["criteria"]
    assert criterion["metric"] == "test_cell_accuracy"  # exact accuracy is 0 throughout: the smoke fallback
    assert {criterion["estimates"][m]["source"] for m in ("a", "c")} == {FLOOR_AND_PUZZLE_SD}
    assert criterion["verdict"] == "supported"
    (wilson,) = judge_groups([group], _table(), "smoke", 16)["groups"][0]["criteria"]
    assert wilson["estimates"]["a"]["source"] == FLOOR_AND_SAMPLING and wilson["verdict"] == "inconclusive"

"""Intervals, noise floor, differences, power and criterion verdicts (trm.analysis.uncertainty, trm.analysis.judge)
on synthetic runs with known effects and noise. Expected figures come from textbook tables or from formulas
written out here, never from the module's own output."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from workflow_support import runs_table

from trm.analysis.judge import (
    CELL_CAVEAT,
    add_estimates,
    judge_criterion,
    judged_metric,
    noise_floors,
    samples_by_configuration,
    samples_by_experiment,
)
from trm.analysis.uncertainty import (
    AT_MOST,
    FLOOR_AND_SAMPLING,
    FLOOR_ONLY,
    INCONCLUSIVE,
    MAX_USEFUL_SEEDS,
    NO_DATA,
    NO_SIGNAL,
    NOT_SUPPORTED,
    SAMPLING_ONLY,
    SEEDS,
    SUPPORTED,
    difference,
    estimate,
    judge,
    noise_floor,
    normal_seeds_per_arm,
    puzzles_for_half_width,
    seeds_per_arm,
    t_quantile,
    wilson_interval,
)

GROUP = {"id": "g", "members": ["a", "b", "c", "d"], "baseline": "b"}
Z95, Z80 = 1.959964, 0.841621  # standard normal quantiles at 0.975 and 0.80


def runs(rng: np.random.Generator, mean: float, sd: float, seeds: int = 3) -> list[float]:
    return list(mean + sd * rng.standard_normal(seeds))


def criterion(check: str, **fields) -> dict:
    return {"text": "t", "check": check, "metric": "test_exact_accuracy", **fields}


def verdict(crit: dict, samples: dict, floor=None, puzzles=None) -> dict:
    return judge_criterion(crit, GROUP, samples, floor, puzzles)


# ---------------------------------------------------------------------------------------- textbook quantities


@pytest.mark.parametrize(
    ("df", "expected"), [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (math.inf, 1.960)]
)
def test_student_t_quantiles_match_the_printed_table(df, expected):
    assert t_quantile(df) == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (Wilson score, no correction).
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_interval_matches_newcombe(successes, trials, low, high):
    got = wilson_interval(successes, trials)
    assert got == pytest.approx((low, high), abs=5e-5)


def test_puzzles_for_a_half_width_is_the_smallest_count_that_reaches_it():
    for p, half in ((0.5, 0.005), (0.87, 0.005), (0.87, 0.001)):
        n = puzzles_for_half_width(half, p)
        assert Z95 * math.sqrt(p * (1 - p) / n) <= half * (1 + 1e-6)
        assert Z95 * math.sqrt(p * (1 - p) / (n - 1)) > half * (1 - 1e-6)
    # The figures: about ±0.1 points on the 423,168 test puzzles at 87%, ±0.4 on 25,000.
    assert puzzles_for_half_width(0.0011, 0.87) < 423_168 < puzzles_for_half_width(0.0010, 0.87)
    assert puzzles_for_half_width(0.0042, 0.87) < 25_000 < puzzles_for_half_width(0.0041, 0.87)


@pytest.mark.parametrize(
    ("effect", "arms", "expected"),
    # Two-sided 5%, 80% power, exact t test (G*Power; Cohen 1988 Table 2.4.1 for d = 0.5 and 0.8).
    [(0.5, 2, 64), (0.8, 2, 26), (0.2, 2, 394), (0.5, 1, 34), (0.8, 1, 15)],
)
def test_seeds_per_arm_matches_published_sample_sizes(effect, arms, expected):
    assert seeds_per_arm(effect, 1.0, arms=arms, limit=1000) == expected
    # Only the standardized effect matters: the same effect in points with the spread in points.
    assert seeds_per_arm(effect * 0.02, 0.02, arms=arms, limit=1000) == expected


def test_seeds_per_arm_approaches_the_closed_form_for_small_effects():
    for effect in (0.1, 0.15):
        closed = 2 * (Z95 + Z80) ** 2 / effect**2
        assert normal_seeds_per_arm(effect, 1.0) == pytest.approx(closed, rel=1e-5)
        assert 0 <= seeds_per_arm(effect, 1.0, limit=5000) - math.ceil(closed) <= 2
    assert seeds_per_arm(0.1, 1.0) is None  # 1571 is past MAX_USEFUL_SEEDS


# ---------------------------------------------------------------------------- estimates and the noise floor


def test_summary_over_seeds_is_the_student_t_interval():
    values = [0.529, 0.594, 0.551, 0.570, 0.562]  # five seeds spanning the range
    s = estimate(values, puzzles=16)  # with seeds, the puzzles do not enter
    mean, sd = sum(values) / 5, math.sqrt(sum((v - sum(values) / 5) ** 2 for v in values) / 4)
    assert (s.n, s.source) == (5, SEEDS)
    assert (s.mean, s.sd) == (pytest.approx(mean), pytest.approx(sd))
    assert (s.low, s.high) == pytest.approx(
        (mean - 2.776 * sd / math.sqrt(5), mean + 2.776 * sd / math.sqrt(5)), abs=1e-4
    )
    assert estimate([0.5, math.nan, None, 0.7]).n == 2  # not measured is not a run


def test_noise_floor_pools_the_seed_variance_of_every_experiment_with_seeds():
    a, b = [0.50, 0.52, 0.54], [0.60, 0.66]
    floor = noise_floor({"a": a, "b": b, "c": [0.9]})  # one run says nothing of the spread
    squares = (0.02**2 + 0 + 0.02**2) + (0.03**2 + 0.03**2)
    assert floor.sd == pytest.approx(math.sqrt(squares / 3)) and floor.df == 3
    assert floor.experiments == ("a", "b") and floor.runs == 5
    assert noise_floor({"a": [0.5], "b": [0.6, math.nan]}) is None


def test_seeds_that_all_read_the_same_value_measure_no_noise_floor():
    # The smoke study's train-test gap: 0 for every seed of the baseline (exact accuracies pinned at 0). A floor
    # of 0 would decide a one-run difference of 2.1 points with an interval of +- 0.
    assert noise_floor({"baseline": [0.0, 0.0, 0.0]}) is None
    wide, narrow = estimate([0.241], None), estimate([0.021], None)
    assert not math.isfinite(difference(wide, narrow).half_width)
    claim = judge(AT_MOST, 0.02, wide, narrow)
    assert claim.verdict == INCONCLUSIVE and "seed spread is unknown" in claim.text()


def test_a_single_run_takes_its_interval_from_the_noise_floor_and_says_so():
    baseline = [0.87, 0.85, 0.89]
    floor = noise_floor({"b": baseline})
    s = np.std(baseline, ddof=1)
    alone = estimate([0.80], floor)  # not a fraction of puzzles: the floor alone
    assert alone.source == FLOOR_ONLY
    assert alone.high - 0.80 == pytest.approx(4.303 * s, rel=1e-3)  # t at the floor's 2 degrees of freedom
    # Over a huge test split the sampling half-width vanishes beside the floor.
    assert estimate([0.80], floor, puzzles=10**9).source == FLOOR_AND_SAMPLING
    assert estimate([0.80], floor, puzzles=10**9).high - 0.80 == pytest.approx(4.303 * s, rel=1e-3)
    # Over 16 puzzles the sampling interval dominates, and both widen the interval past either alone.
    small = estimate([0.5], floor, puzzles=16)
    w_low, w_high = wilson_interval(8, 16)
    assert small.high - 0.5 == pytest.approx(math.hypot(4.303 * s, w_high - 0.5), rel=1e-3)
    assert small.low < w_low and small.high > w_high
    only = estimate([0.0], None, puzzles=16)
    assert only.source == SAMPLING_ONLY and (only.low, only.high) == pytest.approx(wilson_interval(0, 16))


# ------------------------------------------------------------------------------------------------ differences


def test_difference_of_seeded_experiments_is_welchs_interval():
    rng = np.random.default_rng(1)
    a, b = runs(rng, 0.80, 0.02, 3), runs(rng, 0.87, 0.01, 4)
    d = difference(estimate(a), estimate(b))
    welch = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (d.low, d.high) == pytest.approx((welch.low, welch.high))


def test_a_single_run_against_seeds_adds_the_floor_variance():
    baseline = [0.86, 0.88, 0.87]
    s2 = np.var(baseline, ddof=1)
    floor = noise_floor({"b": baseline})
    d = difference(estimate([0.80], floor), estimate(baseline))
    # var = s^2 (one run at the floor) + s^2 / 3 (the mean of 3); Welch-Satterthwaite df = 3.2 by hand.
    df = (s2 + s2 / 3) ** 2 / (s2**2 / 2 + (s2 / 3) ** 2 / 2)
    assert df == pytest.approx(3.2) and d.df == pytest.approx(3.2)
    assert d.half_width == pytest.approx(stats.t.ppf(0.975, 3.2) * math.sqrt(s2 * 4 / 3))


def test_two_single_runs_share_one_noise_floor_and_its_degrees_of_freedom():
    baseline = [0.86, 0.88, 0.87]
    s = np.std(baseline, ddof=1)
    floor = noise_floor({"b": baseline})
    d = difference(estimate([0.80], floor), estimate([0.84], floor))
    # var = 2 s^2 from one estimate with 2 degrees of freedom (not 4: the floor is counted once).
    assert d.df == pytest.approx(2)
    assert d.half_width == pytest.approx(4.303 * s * math.sqrt(2), rel=1e-3)


# ------------------------------------------------------------------------------------- verdicts on criteria


def test_a_clear_effect_is_supported_and_the_opposite_claim_is_not():
    rng = np.random.default_rng(7)
    # Hidden 256 is 6 points below 512, seed noise 1 point, 3 seeds each: "at least 1 point below" holds.
    samples = {"a": runs(rng, 0.81, 0.01), "b": runs(rng, 0.87, 0.01)}
    below = criterion("at_most", members=["a"], against=["b"], margin=-0.01)
    assert verdict(below, samples)["verdict"] == SUPPORTED
    above = criterion("at_least", members=["a"], against=["b"], margin=0.0)
    result = verdict(above, samples)
    assert result["verdict"] == NOT_SUPPORTED
    gap = (np.mean(samples["a"]) - np.mean(samples["b"])) * 100  # in points
    assert result["detail"].startswith(f"a - b: not supported: difference {gap:.1f} ± ")


def test_an_effect_inside_the_noise_is_inconclusive_with_a_seed_estimate():
    # 2.5 points below with 1 point of seed noise: 1.5 sd from the margin, so about 8 to 13 seeds resolve it.
    rng = np.random.default_rng(1)
    samples = {"a": runs(rng, 0.845, 0.01), "b": runs(rng, 0.87, 0.01)}
    result = verdict(criterion("at_most", members=["a"], against=["b"], margin=-0.01), samples)
    assert result["verdict"] == INCONCLUSIVE
    (compared,) = result["comparisons"]
    assert compared["low"] < -0.01 < compared["high"]
    # The estimate is the two-sample size for the observed distance from the margin at the measured spread.
    distance = abs(np.mean(samples["a"]) - np.mean(samples["b"]) + 0.01)
    spread2 = (np.var(samples["a"], ddof=1) + np.var(samples["b"], ddof=1)) / 2
    closed = 2 * (Z95 + Z80) ** 2 * spread2 / distance**2
    assert compared["seeds_per_point"] is not None
    assert math.ceil(closed) <= compared["seeds_per_point"] <= math.ceil(closed) + 2
    assert f"about {compared['seeds_per_point']} seeds per point would resolve" in result["detail"]
    assert result["detail"].startswith("a - b: inconclusive: difference ")


def test_a_difference_at_the_margin_says_seeds_will_not_resolve_it():
    a = estimate([0.860, 0.875, 0.865])
    b = estimate([0.870, 0.885, 0.875])  # a - b is exactly -0.01, the margin
    j = judge(AT_MOST, -0.01, a, b)
    assert j.verdict == INCONCLUSIVE and j.seeds is None
    assert f"even {MAX_USEFUL_SEEDS} seeds per point would not resolve it" in j.text()


@pytest.mark.parametrize("value", [0.0, 0.42])
def test_a_metric_equal_for_every_run_is_no_signal(value):
    samples = {m: [value] * 3 for m in "abcd"}
    for crit in (
        criterion("at_most", members=["a", "c"], against=["b"], margin=0.01),
        criterion("monotonic", members=["a", "b", "c"], direction="increasing", tolerance=0.01),
        criterion("best_is_one_of", members=["b"]),
        criterion("within", members=["a"], against=["b"], tolerance=0.01),
    ):
        assert verdict(crit, samples)["verdict"] == NO_SIGNAL
    # One run at 0 against a fixed figure is no signal too; a measured nonzero run is judged.
    assert verdict(criterion("at_least", members=["b"], value=0.854), {"b": [0.0]})["verdict"] == NO_SIGNAL
    floor = noise_floor({"x": [0.86, 0.88, 0.87]})
    judged = verdict(criterion("at_least", members=["b"], value=0.854), {"b": [0.5]}, floor, 423_168)
    assert judged["verdict"] == NOT_SUPPORTED


def test_single_runs_are_judged_against_the_noise_floor():
    rng = np.random.default_rng(11)
    baseline = runs(rng, 0.87, 0.01, 3)
    floor = noise_floor({"b": baseline})
    samples = {"a": [0.70], "b": baseline, "c": [0.865]}
    clear = verdict(criterion("at_most", members=["a"], against=["b"], margin=-0.01), samples, floor, 423_168)
    assert clear["verdict"] == SUPPORTED
    assert (
        clear["estimates"]["a"]["source"] == FLOOR_AND_SAMPLING and clear["estimates"]["b"]["source"] == SEEDS
    )
    close = verdict(
        criterion("within", members=["c"], against=["b"], tolerance=0.002), samples, floor, 423_168
    )
    assert close["verdict"] == INCONCLUSIVE and "seeds per point" in close["detail"]
    # Without a noise floor the spread of one run is unknown: the verdict says what to measure.
    blind = verdict(
        criterion("at_most", members=["c"], against=["a"], margin=0.0),
        {"a": [3 / 16], "c": [5 / 16]},
        None,
        16,
    )
    assert blind["verdict"] == INCONCLUSIVE and blind["estimates"]["a"]["source"] == SAMPLING_ONLY
    assert "the seed spread is unknown" in blind["detail"]


def test_single_runs_of_unknown_spread_never_decide():
    import json

    # Throughput is not a fraction of puzzles: one run each and no noise floor leave the spread unknown.
    crit = {**criterion("at_least", members=["a"], against=["b"]), "metric": "examples_per_second"}
    result = verdict(crit, {"a": [5000.0], "b": [100.0]}, None, 16)
    assert result["verdict"] == INCONCLUSIVE
    assert "uncertainty unknown" in result["detail"] and "the seed spread is unknown" in result["detail"]
    assert result["estimates"]["a"]["source"] == "none"
    json.dumps(result, allow_nan=False)  # unknown figures are null, the output stays standard JSON


def test_monotonic_and_best_is_one_of_under_noise():
    rng = np.random.default_rng(5)
    rising = {
        "a": runs(rng, 0.70, 0.01),
        "b": runs(rng, 0.80, 0.01),
        "c": runs(rng, 0.87, 0.01),
        "d": runs(rng, 0.60, 0.01),
    }
    mono = criterion("monotonic", members=["a", "b", "c"], direction="increasing", tolerance=0.01)
    assert verdict(mono, rising)["verdict"] == SUPPORTED
    assert verdict({**mono, "direction": "decreasing"}, rising)["verdict"] == NOT_SUPPORTED
    assert verdict(criterion("best_is_one_of", members=["c", "d"]), rising)["verdict"] == SUPPORTED
    assert verdict(criterion("best_is_one_of", members=["a", "d"]), rising)["verdict"] == NOT_SUPPORTED
    tied = {**rising, "b": runs(rng, 0.87, 0.01)}  # b and c differ by noise only
    assert verdict(criterion("best_is_one_of", members=["c"]), tied)["verdict"] == INCONCLUSIVE
    assert verdict(criterion("best_is_one_of", members=list("abcd")), tied)["verdict"] == SUPPORTED
    # Where lower is better (trm/study/metrics.py), the best is the lowest.
    fastest = criterion("best_is_one_of", members=["d"], metric="step_time_s")
    assert verdict(fastest, rising)["verdict"] == SUPPORTED
    assert verdict({**fastest, "members": ["c"]}, rising)["verdict"] == NOT_SUPPORTED


def test_a_member_without_a_measured_run_is_not_enough_data():
    result = verdict(criterion("at_most", members=["a"], against=["b"]), {"a": [math.nan], "b": [0.8, 0.82]})
    assert result["verdict"] == NO_DATA and "a" in result["detail"]


# ------------------------------------------------------------------------------------------- metric choice


def test_smoke_verdicts_judge_cell_accuracy_where_exact_accuracy_is_zero_throughout():
    zeros = {"a": [0.0, 0.0], "b": [0.0, math.nan]}
    metric, caveat = judged_metric("test_exact_accuracy", zeros, "smoke")
    assert metric == "test_cell_accuracy" and caveat == CELL_CAVEAT.format(metric="test_cell_accuracy")
    assert judged_metric("test_exact_accuracy", zeros, "paper") == ("test_exact_accuracy", "")
    assert judged_metric("test_exact_accuracy", {"a": [0.0], "b": [1 / 16]}, "smoke") == (
        "test_exact_accuracy",
        "",
    )
    assert judged_metric("examples_per_second", {"a": [0.0]}, "smoke") == ("examples_per_second", "")


def test_samples_by_experiment_groups_the_rows_of_each_run():
    import pandas as pd

    table = pd.DataFrame({"id": ["b", "a", "b", "b"], "seed": [0, 0, 1, 2], "m": [0.5, 0.4, 0.6, 0.7]})
    assert samples_by_experiment(table, "m") == {"b": [0.5, 0.6, 0.7], "a": [0.4]}


def test_the_noise_floor_counts_each_run_of_a_shared_config_once():
    import pandas as pd

    # exp01c and exp02a_03 are the same config (one run per seed), ref_paper another; exp01a has one run.
    table = pd.DataFrame(
        {
            "id": ["exp01c"] * 3 + ["exp02a_03"] * 3 + ["ref_paper"] * 2 + ["exp01a"],
            "config_key": ["h"] * 6 + ["r"] * 2 + ["x"],  # the config's hash without train.seed
            "seed": [0, 1, 2] * 2 + [0, 1] + [0],
            "m": [0.50, 0.52, 0.54] * 2 + [0.60, 0.66] + [0.3],
        }
    )
    samples = samples_by_configuration(table, "m", ["exp01c", "exp02a_03", "ref_paper"])
    assert samples == {"h": [0.50, 0.52, 0.54], "r": [0.60, 0.66]}
    assert noise_floor(samples).df == 3  # 2 + 1, not 2 + 2 + 1


def test_the_table_keeps_one_row_per_run_and_gains_each_experiments_summary():
    import pandas as pd

    table = runs_table(
        pd.DataFrame(
            {
                "id": ["b", "b", "b", "a"],
                "config_key": ["h", "h", "h", "x"],
                "seed": [0, 1, 2, 0],
                "test_cell_accuracy": [0.50, 0.52, 0.54, 0.40],
                "examples_per_second": [100.0, 110.0, 120.0, 90.0],
            }
        )
    )
    metrics = ["test_cell_accuracy", "examples_per_second"]
    floors = noise_floors(table, metrics, ["b"])
    assert floors["test_cell_accuracy"].sd == pytest.approx(0.02) and floors["examples_per_second"].df == 2
    out = add_estimates(table, metrics, floors, test_puzzles=16)
    assert len(out) == 4 and list(out["seed"]) == [0, 1, 2, 0]
    b = out[out["id"] == "b"]
    assert list(b["test_cell_accuracy_mean"]) == pytest.approx([0.52] * 3)
    assert list(b["test_cell_accuracy_n"]) == [3, 3, 3]
    assert set(b["test_cell_accuracy_interval"]) == {SEEDS}
    half = 4.303 * 0.02 / math.sqrt(3)
    assert b["test_cell_accuracy_high"].iloc[0] == pytest.approx(0.52 + half, rel=1e-3)
    a = out[out["id"] == "a"].iloc[0]
    assert (
        a["test_cell_accuracy_interval"] == FLOOR_AND_SAMPLING
        and a["examples_per_second_interval"] == FLOOR_ONLY
    )
    assert a["examples_per_second_high"] == pytest.approx(90.0 + 4.303 * 10.0, rel=1e-3)

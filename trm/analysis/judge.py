"""The success criteria of config/groups.yaml judged against the uncertainty of the differences they test
(trm.analysis.uncertainty): `supported` or `not supported` only when the 95% interval of every difference a
criterion reads excludes the other outcome, `inconclusive` (with the difference, its half-width and the seeds per
point that would resolve it) otherwise, `no signal` when the metric is the same for every run read, `not enough
data` when a member has no measured run. docs/statistics.md explains the rule.

The check kinds as claims about differences (d = member - the compared, each member judged, all must hold):
    at_least        d >= margin                         at_most    d <= margin
    within          |d| <= tolerance                    monotonic  each step against `direction` <= tolerance
    best_is_one_of  some candidate is clearly at least every other member (not supported: some other member is
                    clearly above every candidate); at most and below where lower is better (trm/study/metrics.py)
Compared `against` several members, a member is compared with the one of highest mean (its selection is not
corrected for) other than itself: a criterion never compares a member with itself. A member of its own `against` is judged
against the highest of the others, and `within` then reads "at most tolerance below it" (d >= -tolerance): a
member above every other is within 0 of the highest, itself.
Two members whose runs are the same runs (every run of one has a run of the other with the same trained weights,
the summary's weights_sha256, and the same value) measured no difference: the treatment did not act at this
scale, and the difference is `no effect at this scale`, whatever the other seeds' spread.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from trm.analysis.uncertainty import (
    AT_LEAST,
    AT_MOST,
    INCONCLUSIVE,
    NO_DATA,
    NO_EFFECT,
    NO_SIGNAL,
    NOT_SUPPORTED,
    SUPPORTED,
    WITHIN,
    Estimate,
    Judgement,
    NoiseFloor,
    estimate,
    judge,
    no_effect,
    no_signal,
    noise_floor,
)
from trm.study.groups import REFERENCE_GROUP
from trm.study.metrics import CELL_FALLBACK, RUN_METRICS
from trm.study.scale import scale_of

# The metrics with a single run's sampling interval, and the column of a run's sd over the puzzles for those that
# are means of a per-puzzle fraction: the interval comes from it (uncertainty.estimate), Wilson's where it is empty.
TEST_FRACTIONS = tuple(key for key, metric in RUN_METRICS.items() if metric.sampled_over_test_split)
PUZZLE_SD_COLUMNS = {key: metric.puzzle_sd for key, metric in RUN_METRICS.items() if metric.puzzle_sd}
POINT = 0.01  # accuracies are fractions; differences of them are read in points
CELL_CAVEAT = (
    "exact accuracy is 0 for every run of the group at this scale: judged on {metric}, the metric the plots "
    "show; cell accuracy only hints at a trend, it does not measure solved puzzles"
)


def judged_metric(metric: str, group_runs: Mapping[str, Sequence[float]], scale: str) -> tuple[str, str]:
    """(the metric a criterion is judged on, the caveat to print with it). At a local scale (Scale.cell_fallback:
    smoke, mini) an exact accuracy that is 0 or unmeasured for every run of the group is replaced by cell accuracy, as the group's plot does
    (`group_runs`: that exact accuracy's values per member, every run of the group); otherwise `metric`, no
    caveat."""
    fallback = CELL_FALLBACK.get(metric)
    if not scale_of(scale).cell_fallback or fallback is None:
        return metric, ""
    values = [v for runs in group_runs.values() for v in runs]
    if all(v is None or not v == v or v == 0 for v in values):  # v == v is False for NaN
        return fallback, CELL_CAVEAT.format(metric=fallback)
    return metric, ""


def samples_by_experiment(table, metric: str, id_column: str = "id") -> dict[str, list[float]]:
    """One list of the metric's values per experiment id, from a table with one row per run (pandas)."""
    return {str(k): _floats(rows) for k, rows in table.groupby(id_column, sort=False)[metric]}


def samples_by_configuration(
    table, metric: str, ids: Sequence[str], config_column: str = "config_key", run_column: str = "seed"
) -> dict[str, list[float]]:
    """The metric's values per distinct configuration (its seedless key: the replicates of one configuration are
    its samples) of the given experiments, each run once: experiments with equal configs share runs, which the
    noise floor must not count twice (pass it to uncertainty.noise_floor)."""
    rows = table[table["id"].isin(list(ids))].drop_duplicates([config_column, run_column])
    return {str(k): _floats(values) for k, values in rows.groupby(config_column, sort=False)[metric]}


def weights_by_experiment(table, id_column: str = "id", column: str = "weights_sha256") -> dict[str, list]:
    """One list of its runs' weight digests per experiment id, in the order of samples_by_experiment's values
    (None where a run has none)."""
    return {
        str(k): [None if isinstance(w, float) and w != w else str(w) for w in rows]  # w != w: NaN, empty
        for k, rows in table.groupby(id_column, sort=False)[column]
    }


def puzzle_sds(table, metric: str, id_column: str = "id") -> dict[str, float | None]:
    """Per experiment measured by one run, that run's per-puzzle sd of the metric (PUZZLE_SD_COLUMNS; None where
    the run did not record it: fewer than 2 test puzzles); empty for any other metric."""
    column = PUZZLE_SD_COLUMNS.get(metric)
    if column is None:
        return {}
    measured = table[table[metric].notna()]
    sds = {}
    for k, rows in measured.groupby(id_column, sort=False)[column]:
        values = _floats(rows)
        sds[str(k)] = values[0] if len(values) == 1 and math.isfinite(values[0]) else None
    return sds


def _floats(values) -> list[float]:
    """A metric's values as floats; None (a summary's unmeasured value, e.g. epochs to 85% never reached) as NaN."""
    return [math.nan if v is None else float(v) for v in values]


def floor_ids(table) -> list[str]:
    """The experiments whose seeds measure the noise floor: every group's baseline and every reference run (rows
    of `trm aggregate`'s table with `baseline` true or group `reference`)."""
    chosen = table["baseline"].astype(bool) | (table["group"] == REFERENCE_GROUP)
    return list(dict.fromkeys(str(i) for i in table.loc[chosen, "id"]))


def noise_floors(
    table, metrics: Sequence[str], experiments: Sequence[str], run_column: str = "seed"
) -> dict[str, NoiseFloor | None]:
    """Each metric's noise floor, pooled over the distinct configurations of `experiments` (`floor_ids`: the
    baselines and the reference runs) that have 2 or more seeds; None for a metric no such configuration measured."""
    return {
        m: noise_floor(samples_by_configuration(table, m, experiments, run_column=run_column))
        for m in metrics
    }


# Per metric, the columns add_estimates writes: {metric}_mean, _sd, _n, _low, _high, _interval (the source).
SUMMARY_FIELDS = {"mean": "mean", "sd": "sd", "n": "n", "low": "low", "high": "high", "interval": "source"}


def add_estimates(
    table,
    metrics: Sequence[str],
    floors: Mapping[str, NoiseFloor | None],
    test_puzzles: int | None,
    id_column: str = "id",
):
    """The table (one row per run, pandas) with, for each metric, its experiment's mean, sd, n, 95% interval and
    the interval's source repeated on every row of the experiment; the rows stay one per run."""
    out = table.copy()
    for metric in metrics:
        puzzles = sampling_puzzles(metric, test_puzzles)
        sds = puzzle_sds(table, metric, id_column)
        estimates = {
            k: estimate(v, floors.get(metric), puzzles, sds.get(k))
            for k, v in samples_by_experiment(table, metric, id_column).items()
        }
        for suffix, field in SUMMARY_FIELDS.items():
            out[f"{metric}_{suffix}"] = [getattr(estimates[str(k)], field) for k in out[id_column]]
    return out


def sampling_puzzles(metric: str, test_puzzles: int | None) -> int | None:
    """The test puzzles a single run's value is a fraction of, for its sampling interval; None for any other
    metric (throughput, halt steps, training accuracy: no sampling over the test split)."""
    return test_puzzles if metric in TEST_FRACTIONS else None


def is_fraction(metric: str) -> bool:
    """Whether the metric is a fraction (its differences read in points): its unit in trm/study/metrics.py."""
    return RUN_METRICS[metric].unit.startswith("fraction")


def needed_members(criterion: dict, group: dict) -> list[str]:
    """The members whose metric the criterion reads (every member for best_is_one_of)."""
    if criterion["check"] == "best_is_one_of":
        return list(group["members"])
    return list(dict.fromkeys(criterion["members"] + criterion.get("against", [])))


def same_runs(a: Sequence[tuple], b: Sequence[tuple]) -> bool:
    """Whether two members' runs, each (weights digest, value), are the same runs: every run of the one with
    fewer is a run of the other, with the same trained weights and the same value. Runs without a digest are no
    run's."""
    runs_a, runs_b = ({run for run in side if run[0] is not None} for side in (a, b))
    if len(runs_a) < len(a) or len(runs_b) < len(b) or not runs_a or not runs_b:
        return False
    return runs_a <= runs_b or runs_b <= runs_a


class _Judge:
    """Judges a - b for two members, or a member against a fixed figure; `runs`: each member's (weights digest,
    value) per run, to tell that two members' runs are the same (same_runs)."""

    def __init__(self, estimates: dict[str, Estimate], runs: Mapping[str, Sequence[tuple]]) -> None:
        self.estimates = estimates
        self.runs = runs

    def __call__(self, claim: str, bound: float, a: str, b: str | float) -> Judgement:
        if isinstance(b, float):
            return judge(claim, bound, self.estimates[a], b)
        if same_runs(self.runs.get(a, ()), self.runs.get(b, ())):
            return no_effect(claim, bound)
        return judge(claim, bound, self.estimates[a], self.estimates[b])


def compare(criterion: dict, judged: _Judge) -> list[tuple[str, str, Judgement]]:
    """(a, b, judgement of a - b) for every difference the criterion reads, in the criterion's order; never a
    member against itself (the module docstring). `judged(claim, bound, a, b)` judges one (trm.analysis.power
    passes its own, to plan the same differences); `judged.estimates` give the means that pick the compared member."""
    kind = criterion["check"]
    if kind == "monotonic":
        tolerance = criterion.get("tolerance", 0)
        steps = itertools.pairwise(criterion["members"])
        if criterion["direction"] == "increasing":  # a fall from a to b is a - b
            return [(a, b, judged(AT_MOST, tolerance, a, b)) for a, b in steps]
        return [(b, a, judged(AT_MOST, tolerance, b, a)) for a, b in steps]
    claim = {"at_least": AT_LEAST, "at_most": AT_MOST, "within": WITHIN}[kind]
    bound = criterion["tolerance"] if kind == "within" else criterion.get("margin", 0)
    if "value" in criterion:
        value = float(criterion["value"])
        return [(a, f"{value:g}", judged(claim, bound, a, value)) for a in criterion["members"]]
    compared = []
    for a in criterion["members"]:
        others = [m for m in criterion["against"] if m != a]
        b = max(others, key=lambda m: judged.estimates[m].mean)
        # A member of its own `against` list: within the tolerance of the highest of the others, or above it.
        own = claim == WITHIN and a in criterion["against"]
        compared.append((a, b, judged(AT_LEAST, -bound, a, b) if own else judged(claim, bound, a, b)))
    return compared


def _all_of(compared: list[tuple[str, str, Judgement]]) -> str:
    """Not supported when any difference is; otherwise inconclusive when any is; otherwise no effect when a
    treatment did not act; supported when every difference is."""
    verdicts = [j.verdict for _, _, j in compared]
    for outcome in (NOT_SUPPORTED, INCONCLUSIVE, NO_EFFECT):
        if outcome in verdicts:
            return outcome
    return SUPPORTED


def _best_is_one_of(criterion: dict, group: dict, judged: _Judge) -> tuple[str, list]:
    """Best: the highest, or the lowest where lower is better (trm/study/metrics.py)."""
    candidates = criterion["members"]
    others = [m for m in group["members"] if m not in candidates]
    claim = AT_LEAST if RUN_METRICS[criterion["metric"]].higher_is_better else AT_MOST
    pairs = {(c, o): judged(claim, 0, c, o) for c in candidates for o in others}
    compared = [(c, o, j) for (c, o), j in pairs.items()]
    if any(all(pairs[c, o].verdict == SUPPORTED for o in others) for c in candidates):
        return SUPPORTED, compared
    if any(all(pairs[c, o].verdict == NOT_SUPPORTED for c in candidates) for o in others):
        return NOT_SUPPORTED, compared
    if compared and all(j.verdict == NO_EFFECT for _, _, j in compared):
        return NO_EFFECT, compared
    return INCONCLUSIVE, compared


def _plain(x):
    """A figure for JSON: None where it is not finite (unknown, unbounded), so the output stays standard JSON."""
    return x if not isinstance(x, float) or math.isfinite(x) else None


def _estimate_record(s: Estimate) -> dict:
    return {
        "mean": _plain(s.mean),
        "sd": _plain(s.sd),
        "n": s.n,
        "low": _plain(s.low),
        "high": _plain(s.high),
        "source": s.source,
    }


def _comparison(a: str, b: str, j: Judgement) -> dict:
    d = j.difference
    return {
        "a": a,
        "b": b,
        "claim": j.claim,
        "bound": j.bound,
        "difference": _plain(d.value),
        "low": _plain(d.low),
        "high": _plain(d.high),
        "df": _plain(d.df),
        "verdict": j.verdict,
        "seeds_per_point": j.seeds,
    }


def _line(a: str, b: str, j: Judgement, unit: float, unit_name: str) -> str:
    return f"{a} - {b}: {j.text(unit, unit_name)}"


def judge_criterion(
    criterion: dict,
    group: dict,
    samples: Mapping[str, Sequence[float]],
    floor: NoiseFloor | None,
    test_puzzles: int | None = None,
    sds: Mapping[str, float | None] | None = None,
    weights: Mapping[str, Sequence[str | None]] | None = None,
) -> dict:
    """One criterion judged on every run of its members (`samples`: the criterion's metric per member id, one
    value per seed; `floor`: the metric's noise floor; `test_puzzles`: the test split's size, for the sampling
    interval of single runs; `sds`: a one-run member's per-puzzle sd of the metric, `puzzle_sds`; `weights`: the
    weight digests of each member's runs, in the order of `samples`, `weights_by_experiment`). Returns verdict,
    detail (one line), the estimates of the members read and every difference judged, as plain data
    (JSON-ready)."""
    metric = criterion["metric"]
    members = needed_members(criterion, group)
    puzzles = sampling_puzzles(metric, test_puzzles)
    sds = sds or {}
    estimates = {m: estimate(samples.get(m, ()), floor, puzzles, sds.get(m)) for m in members}
    runs = {m: list(zip(weights[m], samples[m], strict=True)) for m in members if weights and m in weights}
    judged = _Judge(estimates, runs)
    result = {
        "metric": metric,
        "estimates": {m: _estimate_record(s) for m, s in estimates.items()},
        "comparisons": [],
    }
    missing = [m for m, s in estimates.items() if s.n == 0]
    if missing:
        return {**result, "verdict": NO_DATA, "detail": f"{metric} not measured: {', '.join(missing)}"}
    if criterion["check"] == "best_is_one_of":
        verdict, compared = _best_is_one_of(criterion, group, judged)
    else:
        compared = compare(criterion, judged)
        verdict = _all_of(compared)
    if verdict != NO_EFFECT and no_signal(samples[m] for m in members):
        value = estimates[members[0]].mean
        return {**result, "verdict": NO_SIGNAL, "detail": f"{metric} is {value:g} for every run read"}
    unit, unit_name = (POINT, "points") if is_fraction(metric) else (1.0, "")
    undecided = [c for c in compared if c[2].verdict == INCONCLUSIVE]
    if verdict == INCONCLUSIVE and undecided:
        # The difference that needs the most seeds (unknown or too many counts as the most) says what it takes.
        a, b, j = max(undecided, key=lambda c: math.inf if c[2].seeds is None else c[2].seeds)
        detail = _line(a, b, j, unit, unit_name)
    elif compared:
        detail = "; ".join(_line(a, b, j, unit, unit_name) for a, b, j in compared)
    else:
        detail = "every member of the group is a candidate"
    return {
        **result,
        "verdict": verdict,
        "detail": detail,
        "comparisons": [_comparison(a, b, j) for a, b, j in compared],
    }

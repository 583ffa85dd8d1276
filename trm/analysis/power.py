"""Power before paying: what a study's planned seeds can decide, printed by the dry run below the plan's cost at the
scales that decide the hypotheses (paper, mini). docs/statistics.md, "Power before paying", explains the method and
its assumptions. For each criterion of config/groups.yaml whose members the plan holds:

- σ, the seed spread of its metric (the sd of one run over seeds): the verdicts' own noise floor (the pooled sd of
  the floor configurations' seeds) in the newest results table of the mini scale that measures one, unless
  those runs sit within SQUEEZED of the metric's ceiling or floor; else PUBLIC_SEED_SD. A metric with neither (a speed, a count of epochs or steps: spread by hardware and schedule, not
  by seed alone) is not assessed;
- each point as the verdicts will estimate it (uncertainty.estimate): n >= 2 seeds whose sample sd is exactly σ,
  or one run with the planned noise floor (σ, at the degrees of freedom the planned floor seeds give) and its
  sampling interval at its widest (50% accuracy);
- each difference the criterion reads (judge.compare: the verdicts' own list) with its interval
  (uncertainty.difference);
- D, its detectable difference: the least distance between the true differences and the criterion's bound at which
  every interval excludes the bound, all together, with probability at least POWER (80%). Each of the k one-sided
  conditions the verdict needs (2 per difference of a `within`) gets power 1 - 20% / k (a union bound), from the
  noncentral t at the fewest degrees of freedom of any variance the interval adds up: Welch-Satterthwaite's, which
  the verdicts use, vary with the seeds drawn and would promise more than they deliver at few seeds;
- decidable as planned when D is at most the criterion's resolution (its margin or tolerance, RESOLUTION where it
  has none); otherwise the fewest seeds per point (each point it reads raised to at least that many) that make D
  at most the resolution, and the runs and accelerator-hours they add (trm/study/costs.py).
"""

from __future__ import annotations

import functools
import math
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import TYPE_CHECKING

from trm.analysis.aggregate import RUN_TABLE_COLUMNS, read_table
from trm.analysis.judge import (
    POINT,
    compare,
    floor_ids,
    is_fraction,
    needed_members,
    samples_by_configuration,
    sampling_puzzles,
)
from trm.analysis.uncertainty import (
    POWER,
    SLACK,
    WITHIN,
    Estimate,
    NoiseFloor,
    achieved_power,
    difference,
    estimate,
    noise_floor,
)
from trm.errors import UserError
from trm.study.groups import REFERENCE_GROUP, load_groups
from trm.study.measured import tables
from trm.study.plan import experiment_of, seedless_hash

if TYPE_CHECKING:
    from trm.study.study import Study

# The scales whose plan states its power. The smoke scale stops short of convergence: the paper recipe's spread says
# nothing about it, and its verdicts say so themselves.
PLANNED_SCALES = ("paper", "mini")
MEASURING_SCALE = "mini"  # the scale whose measured seeds give the spread a plan assumes
# Where the mini scale has measured no spread: public reproductions of the paper's Sudoku-Extreme MLP-T recipe reached
# 87.4, 84.8 and 87.9% (sd 1.7 points, on other hardware and batches), the original README says 87% ± 2.
PUBLIC_SEED_SD = {"test_exact_accuracy": 0.02}
PUBLIC_SOURCE = (
    "assumed: public reproductions of the paper's recipe, 84.8 to 87.9%, and the original's 87% ± 2"
)
RESOLUTION = (
    POINT  # the claims' precision (margins of 1 to 3 points): what a criterion without a bound must resolve
)
# A spread measured where the noise-floor runs sit at a fraction's ceiling or floor is squeezed by it (the mini
# baseline's 3 seeds at 99.6 to 99.7%: sd 0.06 points), and says nothing of a recipe near the middle: not used.
SQUEEZED = 0.05  # their mean within this of 0 or 1
SEEDS_LIMIT = 200  # the most seeds per point looked for
WORST_ACCURACY = 0.5  # where one run's sampling interval is widest


@dataclass(frozen=True)
class Spread:
    """A metric's assumed seed spread (the sd of one run over seeds) and where it comes from, in words."""

    sd: float
    source: str


@dataclass(frozen=True)
class Assessment:
    """One criterion as planned: `criterion` is its group's id and its place in the group's list ("exp01.2");
    `spread` None: not assessed. `detectable` is D (inf where a one-run point has no planned noise floor);
    where it exceeds `resolution`, `seeds` per point would decide it (None: more than SEEDS_LIMIT), adding
    `added[run hash]` = (runs, accelerator-hours each)."""

    criterion: str
    metric: str
    resolution: float
    spread: Spread | None
    detectable: float = math.inf
    seeds: int | None = None
    added: dict[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def decidable(self) -> bool:
        return self.spread is not None and self.detectable <= self.resolution + SLACK


def seed_spread(results_root: str, metric: str) -> Spread | None:
    """The seed spread a plan assumes for `metric`: the noise floor the verdicts would pool from the newest table of
    results_root/mini that measures one (unless its noise-floor runs are squeezed at the ceiling or floor), else the
    public figure; None for a metric that is not a fraction, or has neither."""
    if not is_fraction(metric):
        return None
    squeezed = ""
    for path in tables(os.path.join(results_root, MEASURING_SCALE)):
        try:
            table = read_table(path, RUN_TABLE_COLUMNS)
        except UserError:  # damaged or foreign: an older table may still measure it
            continue
        if metric not in table:
            continue
        samples = samples_by_configuration(table, metric, floor_ids(table))
        if not (floor := noise_floor(samples)):  # as judge.noise_floors pools it
            continue
        mean = sum(v for runs in samples.values() for v in runs) / sum(len(runs) for runs in samples.values())
        if min(mean, 1 - mean) < SQUEEZED:
            squeezed = f"; the mini scale's noise-floor runs in {path} sit at {mean:.1%}, where their spread is squeezed"
            break
        return Spread(floor.sd, f"measured: {floor.runs} seeds of the noise-floor runs in {path}")
    if metric in PUBLIC_SEED_SD:
        return Spread(PUBLIC_SEED_SD[metric], PUBLIC_SOURCE + squeezed)
    return None


@functools.cache
def planned_estimate(seeds: int, sd: float, floor_df: int, puzzles: int | None) -> Estimate | None:
    """A point of `seeds` runs as the verdicts will summarize it, the runs' sample sd exactly `sd`; one run borrows
    a noise floor of `sd` measured at `floor_df` degrees of freedom. None for one run without a floor (floor_df 0):
    the verdicts would judge it on its sampling interval alone, blind to the seed spread."""
    if seeds == 1:
        if floor_df < 1:
            return None
        return estimate([WORST_ACCURACY], NoiseFloor(sd, floor_df, floor_df + 1, ("planned",)), puzzles)
    centred = [i - (seeds - 1) / 2 for i in range(seeds)]
    scale = sd / math.sqrt(sum(c * c for c in centred) / (seeds - 1))
    return estimate([WORST_ACCURACY + c * scale for c in centred])


class _Reader:
    """Stands in for the judge in judge.compare: records each difference a criterion reads (with every planned mean
    equal, a reference of several members is the first other than the member judged) and the one-sided conditions
    its verdict needs."""

    def __init__(self, members: list[str]) -> None:
        self.estimates = {m: SimpleNamespace(mean=0.0) for m in members}  # compare reads only the means
        self.read: list[tuple[str, str | float]] = []
        self.conditions = 0

    def __call__(self, claim: str, bound: float, a: str, b: str | float) -> None:
        self.read.append((a, b))
        self.conditions += 2 if claim == WITHIN else 1


def differences(criterion: dict, group: dict) -> tuple[list[tuple[str, str | float]], int]:
    """Every difference (a, b) the criterion reads, b a member or a fixed figure, and the number of one-sided
    conditions its verdict needs to hold together."""
    if criterion["check"] == "best_is_one_of":  # one candidate clearly ahead of every other member
        others = [m for m in group["members"] if m not in criterion["members"]]
        return [(c, o) for c in criterion["members"] for o in others], len(others)
    reader = _Reader(needed_members(criterion, group))
    compare(criterion, reader)
    return reader.read, reader.conditions


@functools.cache
def detectable_shift(df: float, power: float) -> float:
    """The distance, in standard errors, between a true difference and a bound at which an interval of `df` degrees
    of freedom excludes the bound with probability `power` (uncertainty.achieved_power solved for it)."""
    from scipy import optimize

    high = 1.0
    while achieved_power(high, df) < power:
        high *= 2
    return float(optimize.brentq(lambda shift: achieved_power(shift, df) - power, 0.0, high, xtol=1e-6))


def detectable_difference(
    criterion: dict, group: dict, seeds: Mapping[str, int], sd: float, floor_df: int, puzzles: int | None
) -> float:
    """D of one criterion with `seeds` per point, the seed spread `sd`, the planned noise floor's degrees of
    freedom `floor_df` and the test puzzles a one-run point's sampling interval counts (None: no such interval);
    inf where a one-run point has no noise floor."""
    read, conditions = differences(criterion, group)
    power = 1 - (1 - POWER) / max(conditions, 1)
    worst = 0.0
    for a, b in read:
        sides = [planned_estimate(seeds[m], sd, floor_df, puzzles) for m in (a, b) if isinstance(m, str)]
        if None in sides:
            return math.inf
        d = difference(sides[0], sides[1] if len(sides) == 2 else 0.0)
        fewest = min(df for side in sides for _, df, _ in side.components)
        worst = max(worst, detectable_shift(fewest, power) * d.se)
    return worst


def seeds_to_decide(
    criterion: dict,
    group: dict,
    seeds: Mapping[str, int],
    sd: float,
    floor_df: int,
    puzzles: int | None,
    resolution: float,
) -> int | None:
    """The fewest seeds per point (each point the criterion reads raised to at least that many) that make its D at
    most `resolution`; None past SEEDS_LIMIT. Past one seed D only falls as seeds rise, so a bisection finds it."""
    points = needed_members(criterion, group)

    def enough(n: int) -> bool:
        more = {p: max(n, seeds[p]) for p in points}
        return detectable_difference(criterion, group, more, sd, floor_df, puzzles) <= resolution + SLACK

    if enough(1):
        return 1
    if not enough(SEEDS_LIMIT):
        return None
    low, high = 1, SEEDS_LIMIT  # not enough(low), enough(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def resolution_of(criterion: dict) -> float:
    """What the criterion must resolve: its margin or tolerance, RESOLUTION where it has none (a bound of 0)."""
    key = "tolerance" if criterion["check"] in ("within", "monotonic") else "margin"
    return abs(criterion.get(key, 0)) or RESOLUTION


def planned_floor_df(study: Study, groups: list[dict]) -> int:
    """The degrees of freedom of the noise floor the plan will measure: sum(n - 1) over the distinct configurations
    of the floor experiments (every group's baseline, the reference runs) with 2 or more seeds."""
    baselines = {g["baseline"] for g in groups}
    seeds: dict[str, set[int]] = {}
    for exp in study.plan.values():
        if exp.experiment in baselines or exp.group == REFERENCE_GROUP:
            seeds.setdefault(seedless_hash(exp.config), set()).add(exp.config["train"]["seed"])
    return sum(len(s) - 1 for s in seeds.values() if len(s) >= 2)


def assess(study: Study) -> list[Assessment]:
    """Every criterion of the study's selected groups whose members are all planned, as planned."""
    groups = load_groups(study.groups_path, study.experiments_dir)
    seeds = Counter(experiment_of(run_id) for run_id in study.plan)  # per experiment: its run and replicates
    floor_df = planned_floor_df(study, groups)
    spreads: dict[str, Spread | None] = {}
    found = []
    for group in (g for g in groups if g["id"] in study.selected_groups):
        for number, criterion in enumerate(group["criteria"], start=1):
            metric, points = criterion["metric"], needed_members(criterion, group)
            if not all(p in seeds for p in points):
                continue
            if metric not in spreads:
                spreads[metric] = seed_spread(study.config["results"], metric)
            name, resolution, spread = f"{group['id']}.{number}", resolution_of(criterion), spreads[metric]
            if spread is None:
                found.append(Assessment(name, metric, resolution, spread))
                continue
            figures = (spread.sd, floor_df, sampling_puzzles(metric, study.test_puzzles))
            assessed = Assessment(
                name, metric, resolution, spread, detectable_difference(criterion, group, seeds, *figures)
            )
            if not assessed.decidable:
                needed = seeds_to_decide(criterion, group, seeds, *figures, resolution)
                added = {  # a run shared by two points (equal configs) is counted once
                    study.plan[p].hash: (max(needed - seeds[p], 0), sum(study.costs.hours[p].values()))
                    for p in points
                    if needed is not None
                }
                assessed = replace(assessed, seeds=needed, added=added)
            found.append(assessed)
    return found


def _points(x: float) -> str:
    return f"{x / POINT:.1f}" if math.isfinite(x) else "unknown"


def _hours(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 100 else f"{hours:.3g}"


def _row(found: Assessment, unit: str, width: int) -> str:
    """One criterion's line of the table: id, metric, resolution and D in points, what it takes."""
    resolution, d = _points(found.resolution), _points(found.detectable)
    if found.spread is None:
        resolution, d, verdict = "-", "-", f"not assessed: no seed spread for {found.metric}"
    elif found.decidable:
        verdict = "decidable"
    elif found.seeds is None:
        verdict = f"needs more than {SEEDS_LIMIT} seeds per point"
    else:
        runs = sum(n for n, _ in found.added.values())
        hours = sum(n * h for n, h in found.added.values())
        verdict = f"needs {found.seeds} seeds per point (+{runs} runs, +{_hours(hours)} {unit})"
    return f"    {found.criterion:<{width}}{found.metric:<22}{resolution:>10}{d:>8}   {verdict}"


def report(study: Study) -> str:
    """The plan's power: a line per criterion, then how many are decidable as planned, the spreads assumed and what
    deciding the others would add; empty at a scale that states none, or with no criterion planned."""
    if study.scale not in PLANNED_SCALES or not (found := assess(study)):
        return ""
    unit, width = study.costs.device_hours, max(len(f.criterion) for f in found) + 2
    assessed = [f for f in found if f.spread]
    lines = [
        f"  {'power:':<12}what the planned seeds (replicates.{study.scale}) decide 80% of the time at the verdicts' 95% "
        'intervals (docs/statistics.md, "Power before paying"); D, in points: the least distance of the true '
        "differences from the criterion's bound that they decide",
        f"    {'criterion':<{width}}{'metric':<22}{'resolution':>10}{'D':>8}   as planned",
        *(_row(f, unit, width) for f in found),
    ]
    summary = f"    {sum(f.decidable for f in assessed)} of {len(assessed)} criteria decidable as planned"
    if skipped := len(found) - len(assessed):
        summary += f" ({skipped} more not assessed)"
    spreads = {f.metric: f.spread for f in assessed}
    if spreads:
        summary += ", at a seed spread of " + "; ".join(
            f"{_points(s.sd)} points of {metric} ({s.source})" for metric, s in spreads.items()
        )
    # Each run at the most seeds any of its criteria needs.
    most: dict[str, tuple[int, float]] = {}
    for f in found:
        for run, (n, hours) in f.added.items():
            most[run] = max(most.get(run, (0, hours)), (n, hours))
    if runs := sum(n for n, _ in most.values()):
        hours = sum(n * h for n, h in most.values())
        price = study.config["accelerator"].get("price_per_hour")
        cost = f", ${hours * price:,.0f}" if price is not None else ""
        deciding = sum(f.seeds is not None and not f.decidable for f in assessed)
        summary += (
            f"; deciding the {deciding} that need more seeds: +{runs} runs, +{_hours(hours)} {unit}{cost}"
        )
    return "\n".join([*lines, summary])

"""How sure the study can be of a figure: per-experiment estimates over seeds, the noise floor, the interval of a
difference between two experiments, a claim about that difference judged against it, and the seeds per point a
claim would need. docs/statistics.md explains the choices; trm.analysis.judge applies them to the criteria of
config/groups.yaml.

Every interval is two-sided at CONFIDENCE (95%):
- an experiment with n >= 2 seeds: the mean +- a Student t quantile (n - 1 degrees of freedom) x sd / sqrt(n);
- an experiment with one run: the noise floor (the pooled seed standard deviation of the floor configuration,
  its own degrees of freedom) combined with the sampling interval over the test puzzles when the metric is a
  fraction of them: from the run's per-puzzle standard deviation for a mean of per-puzzle fractions (cell
  accuracy: t interval, puzzles - 1 degrees of freedom), else the Wilson interval; either alone when the other is
  missing. `Estimate.source` says which.
A difference adds the variances of the two means (Welch), its degrees of freedom by Welch-Satterthwaite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95  # two-sided: the verdicts decide at 5%
POWER = 0.80  # the chance a planned number of seeds resolves a difference of the observed size
# More seeds per point than any plan of the study runs: past it, a verdict says seeds will not settle the claim.
MAX_USEFUL_SEEDS = 20
# Accuracies are ratios of puzzle counts: 0.87 - 0.86 must count as equal to a margin of 0.01.
SLACK = 1e-9

# Where an interval came from (Estimate.source). The sampling interval of one run is Wilson's (a binomial over the
# puzzles: exact accuracy, or cell accuracy without a recorded per-puzzle sd) or the t interval of its per-puzzle sd.
SEEDS = "seeds"
FLOOR_AND_SAMPLING = "noise floor + sampling (Wilson)"
FLOOR_AND_PUZZLE_SD = "noise floor + sampling (puzzle sd)"
FLOOR_ONLY = "noise floor"
SAMPLING_ONLY = "sampling only (Wilson)"
PUZZLE_SD_ONLY = "sampling only (puzzle sd)"
NO_INTERVAL = "none"  # one run of a metric that is not a fraction of puzzles, and no noise floor

# Outcomes of a judged claim. trm.analysis.verdicts keeps the same words for its group verdicts.
SUPPORTED = "supported"
NOT_SUPPORTED = "not supported"
INCONCLUSIVE = "inconclusive"
NO_SIGNAL = "no signal"
NO_DATA = "not enough data"
# A treatment whose runs are its reference's own (the same trained weights, the same value): it did not act at this
# scale, so the comparison measures nothing but the spread of the reference's other seeds (trm.analysis.judge).
NO_EFFECT = "no effect at this scale"

# A claim about a difference d = a - b: d >= bound, d <= bound, or |d| <= bound.
AT_LEAST, AT_MOST, WITHIN = "at_least", "at_most", "within"


def t_quantile(df: float, confidence: float = CONFIDENCE) -> float:
    """The two-sided Student t quantile, e.g. 12.706 at 1 degree of freedom, 1.960 at infinity."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    from scipy import stats  # here, not on top: `trm verdicts --help` and `trm plot-group --help` stay fast

    upper = 0.5 + confidence / 2
    return float(stats.norm.ppf(upper) if math.isinf(df) else stats.t.ppf(upper, df))


def wilson_interval(successes: float, trials: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion. Unlike the normal (Wald) interval it never collapses to
    a point at 0 or 1 (0 of 16 puzzles gives [0, 0.194], not [0, 0]) and stays inside [0, 1]."""
    if trials <= 0:
        raise ValueError(f"the number of trials must be positive, got {trials}")
    z = t_quantile(math.inf, confidence)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(centre - half, 0.0), min(centre + half, 1.0)


def puzzles_for_half_width(half_width: float, p: float = 0.5, confidence: float = CONFIDENCE) -> int:
    """Test puzzles whose 95% sampling half-width at accuracy p is at most `half_width` (normal approximation,
    which the Wilson interval matches at these sizes); p = 0.5 is the worst case."""
    z = t_quantile(math.inf, confidence)
    return math.ceil(z * z * p * (1 - p) / (half_width * half_width))


@dataclass(frozen=True)
class NoiseFloor:
    """The seed-to-seed standard deviation of one run, pooled over the experiments measured with several seeds
    (normally the baseline), and the degrees of freedom it was measured with."""

    sd: float
    df: int
    runs: int
    experiments: tuple[str, ...]


def noise_floor(samples: dict[str, Sequence[float]]) -> NoiseFloor | None:
    """Pooled within-experiment standard deviation over the experiments with 2 or more measured runs:
    sqrt(sum((n_i - 1) s_i^2) / sum(n_i - 1)). None when no experiment has 2 runs, or when every such experiment's
    runs read exactly the same value: a spread of 0 is no measurement of the noise (a metric pinned at a bound,
    e.g. an exact accuracy or a train-test gap of 0 for every seed, reads the same whatever the seed) and would
    let a one-run difference be decided with an interval of ± 0."""
    squares, df, runs, used = 0.0, 0, 0, []
    for name, values in samples.items():
        finite = _finite(values)
        if len(finite) >= 2:
            squares += float(np.sum((finite - finite.mean()) ** 2))
            df += len(finite) - 1
            runs += len(finite)
            used.append(name)
    if df == 0 or squares == 0:
        return None
    return NoiseFloor(sd=math.sqrt(squares / df), df=df, runs=runs, experiments=tuple(used))


@dataclass(frozen=True)
class Estimate:
    """One experiment's metric over its runs. `components` are the (variance, degrees of freedom, shared) terms
    whose sum is the variance of `mean`; a difference combines them (Welch-Satterthwaite). `shared` is the noise
    floor a term was estimated from (None for a term of this experiment's own): two runs judged against the same
    floor share one estimate, whose degrees of freedom do not add up."""

    mean: float
    sd: float  # over seeds; NaN below 2 runs
    n: int
    low: float
    high: float
    source: str
    components: tuple[tuple[float, float, NoiseFloor | None], ...] = ()

    @property
    def spread(self) -> float | None:
        """The standard deviation of one run: measured over seeds, else the noise floor's, else unknown (None)."""
        if self.n >= 2:
            return self.sd
        floor = [math.sqrt(v) for v, _, shared in self.components if shared is not None]
        return floor[0] if floor else None


def _finite(values: Iterable[float]) -> np.ndarray:
    array = np.asarray([v for v in values if v is not None], dtype=float)
    return array[np.isfinite(array)]


def estimate(
    values: Iterable[float],
    floor: NoiseFloor | None = None,
    puzzles: int | None = None,
    puzzle_sd: float | None = None,
) -> Estimate:
    """Mean, sd, n and 95% interval of one experiment's runs (NaN or None values are not measured).
    `puzzles`: the test puzzles the metric is a fraction of (exact or cell accuracy), for the sampling interval
    of a single run; None for other metrics. For cell accuracy the puzzle, not the cell, is the unit sampled (cells
    of one puzzle are far from independent): `puzzle_sd`, the single run's standard deviation over the puzzles of
    their fractions, gives the t interval mean +- t(puzzles - 1) sd / sqrt(puzzles); without it (None, NaN, or 0,
    where the t interval would collapse to a point) the Wilson interval, whose binomial variance bounds that of a
    mean of per-puzzle fractions."""
    runs = _finite(values)
    n = len(runs)
    if n == 0:
        return Estimate(math.nan, math.nan, 0, math.nan, math.nan, NO_INTERVAL)
    mean = float(runs.mean())
    if n >= 2:
        sd = float(runs.std(ddof=1))
        half = t_quantile(n - 1) * sd / math.sqrt(n)
        return Estimate(mean, sd, n, mean - half, mean + half, SEEDS, ((sd * sd / n, n - 1, None),))
    components, below, above = [], [], []
    if floor is not None:
        components.append((floor.sd**2, floor.df, floor))
        below.append(t_quantile(floor.df) * floor.sd)
        above.append(below[-1])
    recorded_sd = puzzle_sd is not None and math.isfinite(puzzle_sd) and puzzle_sd > 0
    by_sd = bool(puzzles) and puzzles >= 2 and recorded_sd
    if by_sd:
        se = puzzle_sd / math.sqrt(puzzles)
        components.append((se * se, puzzles - 1, None))
        below.append(t_quantile(puzzles - 1) * se)
        above.append(below[-1])
    elif puzzles:
        low, high = wilson_interval(mean * puzzles, puzzles)
        z = t_quantile(math.inf)
        components.append((((high - low) / (2 * z)) ** 2, math.inf, None))
        below.append(mean - low)
        above.append(high - mean)
    sampling = (FLOOR_AND_PUZZLE_SD, PUZZLE_SD_ONLY) if by_sd else (FLOOR_AND_SAMPLING, SAMPLING_ONLY)
    source = {(True, True): sampling[0], (True, False): FLOOR_ONLY, (False, True): sampling[1]}.get(
        (floor is not None, bool(puzzles)), NO_INTERVAL
    )
    if not components:
        return Estimate(mean, math.nan, 1, math.nan, math.nan, source)
    # The two half-widths add in quadrature on each side; a Wilson side keeps its asymmetry near 0 and 1.
    low, high = mean - math.hypot(*below), mean + math.hypot(*above)
    if puzzles:
        low, high = max(low, 0.0), min(high, 1.0)
    return Estimate(mean, math.nan, 1, low, high, source, tuple(components))


@dataclass(frozen=True)
class Difference:
    """a - b with its 95% interval: se is the standard error, df the Welch-Satterthwaite degrees of freedom."""

    value: float
    se: float
    df: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def difference(a: Estimate, b: Estimate | float) -> Difference:
    """The difference of two experiments' means (b may be a fixed number, e.g. the paper's figure), with the
    Welch interval: variances of the means add, degrees of freedom by Welch-Satterthwaite. A one-run side
    contributes the noise floor and its sampling variance (conservative: both runs saw the same puzzles, which
    makes their sampling errors correlate and the true variance of the difference smaller)."""
    sides = [a] + ([b] if isinstance(b, Estimate) else [])
    value = a.mean - (b.mean if isinstance(b, Estimate) else float(b))
    if any(not side.components for side in sides):  # one run with no floor and no sampling: unknown
        return Difference(value, math.inf, math.nan, -math.inf, math.inf)
    terms = [term for side in sides for term in side.components]
    # Terms of one shared noise floor are one estimate: their variances add, their degrees of freedom do not.
    shared: dict[NoiseFloor, float] = {}
    components = []
    for v, df, floor in terms:
        if floor is None:
            components.append((v, df))
        else:
            shared[floor] = shared.get(floor, 0.0) + v
    components += [(v, floor.df) for floor, v in shared.items()]
    variance = sum(v for v, _ in components)
    if variance == 0:
        return Difference(value, 0.0, math.inf, value, value)
    satterthwaite = sum(v * v / df for v, df in components if not math.isinf(df))
    df = variance * variance / satterthwaite if satterthwaite > 0 else math.inf
    se = math.sqrt(variance)
    half = t_quantile(df) * se
    return Difference(value, se, df, value - half, value + half)


def seeds_per_arm(
    effect: float,
    sd: float,
    arms: int = 2,
    confidence: float = CONFIDENCE,
    power: float = POWER,
    limit: int = MAX_USEFUL_SEEDS,
) -> int | None:
    """Seeds per point for a two-sided t test at 1 - confidence to detect `effect` with probability `power`,
    when one run varies by `sd`: exact (noncentral t) for two arms of equal size or one arm against a fixed
    number. None when more than `limit` would be needed (an effect of 0 never is detected)."""
    if not sd > 0:
        return 2 if effect != 0 else None
    if effect == 0:
        return None
    standardized = abs(effect) / sd
    # The t test never needs fewer runs than the normal approximation: start the search just below it.
    start = max(2, math.floor(normal_seeds_per_arm(effect, sd, arms, confidence, power)))
    for n in range(start, limit + 1):
        if achieved_power(standardized * math.sqrt(n / arms), arms * (n - 1), confidence) >= power:
            return n
    return None


def achieved_power(noncentrality: float, df: float, confidence: float = CONFIDENCE) -> float:
    """The probability that a difference's interval (its t quantile of `df` degrees of freedom, as `difference`
    gives it) excludes a bound lying `noncentrality` standard errors from the true difference: noncentral t, the
    normal at infinite df."""
    from scipy import stats

    critical = t_quantile(df, confidence)
    if math.isinf(df):
        return float(stats.norm.sf(critical - noncentrality) + stats.norm.cdf(-critical - noncentrality))
    # The interval on the bound's wrong side also excludes it; NaN where it underflows (a large shift): 0.
    wrong_side = float(stats.nct.cdf(-critical, df, noncentrality))
    wrong_side = wrong_side if math.isfinite(wrong_side) else 0.0
    return float(stats.nct.sf(critical, df, noncentrality)) + wrong_side


def normal_seeds_per_arm(
    effect: float, sd: float, arms: int = 2, confidence: float = CONFIDENCE, power: float = POWER
) -> float:
    """The closed-form normal approximation arms x (z_(1-alpha/2) + z_power)^2 sd^2 / effect^2, unrounded: what
    `seeds_per_arm` approaches for small effects."""
    from scipy import stats

    z = t_quantile(math.inf, confidence) + float(stats.norm.ppf(power))
    return arms * z * z * sd * sd / (effect * effect)


@dataclass(frozen=True)
class Judgement:
    """A claim about a - b judged on the interval of the difference: verdict, the difference, the bound it was
    held against and, when inconclusive, the seeds per point that would resolve it (None: more than
    MAX_USEFUL_SEEDS, or the spread is unknown)."""

    verdict: str
    claim: str
    bound: float
    difference: Difference
    seeds: int | None = None
    spread: float | None = None

    @property
    def distance(self) -> float:
        """How far the observed difference lies from the nearest value where the claim changes."""
        d = self.difference.value
        if self.claim == WITHIN:
            return abs(abs(d) - self.bound)
        return abs(d - self.bound)

    def text(self, unit: float = 0.01, unit_name: str = "points") -> str:
        """The verdict in words, figures in `unit` (0.01 for accuracies: points), e.g. 'inconclusive: difference
        -2.0 ± 2.7 points (needs <= -1.0); about 12 seeds per point would resolve a difference of this size'."""
        d = self.difference
        if self.verdict == NO_EFFECT:  # no measured difference to give
            return f"{NO_EFFECT}: the same runs (the same trained weights and value), so the treatment did not act"
        unit_name = f" {unit_name}" if unit_name else ""
        needs = {AT_LEAST: ">=", AT_MOST: "<=", WITHIN: "within ±"}[self.claim]
        if math.isfinite(d.half_width):
            figures = f"difference {_number(d.value / unit)} ± {_number(d.half_width / unit)}{unit_name}"
        else:
            figures = f"difference {_number(d.value / unit)}{unit_name}, uncertainty unknown"
        figures += f" (needs {needs} {_number(self.bound / unit)})"
        if self.verdict != INCONCLUSIVE:
            return f"{self.verdict}: {figures}"
        if self.spread is None:
            advice = (
                "the seed spread is unknown: no baseline or reference with 2 or more seeds, or every seed "
                "read the same value"
            )
        elif self.seeds is not None:
            advice = f"about {self.seeds} seeds per point would resolve a difference of this size"
        else:
            advice = (
                f"even {MAX_USEFUL_SEEDS} seeds per point would not resolve it: the difference lies "
                f"{_number(self.distance / unit)}{unit_name} from where the claim changes"
            )
        return f"{INCONCLUSIVE}: {figures}; {advice}"


def _number(x: float) -> str:
    """A figure of a verdict's text: 2 significant digits when small, one decimal when moderate, else whole."""
    if x == 0 or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.2g}" if abs(x) < 0.1 else f"{x:.1f}"


def decide(claim: str, bound: float, d: Difference) -> str:
    """Supported or not supported only when the interval of the difference lies wholly on one side of the claim's
    boundary (for `within`, wholly inside [-bound, bound] or wholly outside it); otherwise inconclusive."""
    low, high = d.low, d.high
    if claim == AT_LEAST:
        holds, fails = low >= bound - SLACK, high < bound - SLACK
    elif claim == AT_MOST:
        holds, fails = high <= bound + SLACK, low > bound + SLACK
    elif claim == WITHIN:
        holds = low >= -bound - SLACK and high <= bound + SLACK
        fails = low > bound + SLACK or high < -bound - SLACK
    else:
        raise ValueError(f"unknown claim {claim!r}: one of {AT_LEAST}, {AT_MOST}, {WITHIN}")
    return SUPPORTED if holds else NOT_SUPPORTED if fails else INCONCLUSIVE


def no_effect(claim: str, bound: float) -> Judgement:
    """The judgement of a claim whose two sides are the same runs: no difference was measured (NaN)."""
    unmeasured = Difference(math.nan, math.nan, math.nan, math.nan, math.nan)
    return Judgement(NO_EFFECT, claim, bound, unmeasured)


def judge(claim: str, bound: float, a: Estimate, b: Estimate | float) -> Judgement:
    """The claim `a - b >= bound` (AT_LEAST), `a - b <= bound` (AT_MOST) or `|a - b| <= bound` (WITHIN) judged on
    the 95% interval of a - b; when inconclusive, the seeds per point that would give 80% power at the observed
    difference's distance from the bound, with the per-run spread of the two sides (their mean variance)."""
    d = difference(a, b)
    verdict = decide(claim, bound, d)
    sides = [a] + ([b] if isinstance(b, Estimate) else [])
    spreads = [s.spread for s in sides]
    spread = None if None in spreads else math.sqrt(sum(s * s for s in spreads) / len(spreads))
    judgement = Judgement(verdict, claim, bound, d, spread=spread)
    if verdict != INCONCLUSIVE or spread is None:
        return judgement
    seeds = seeds_per_arm(judgement.distance, spread, arms=len(sides))
    return Judgement(verdict, claim, bound, d, seeds=seeds, spread=spread)


def no_signal(samples: Iterable[Iterable[float]]) -> bool:
    """True when the metric carries no information: every measured value of every member is the same (a single
    value counts when it is 0, the smoke scale's exact accuracy)."""
    values = np.concatenate([_finite(v) for v in samples] or [np.zeros(0)])
    if len(values) == 0:
        return False
    constant = float(values.max() - values.min()) <= SLACK
    return constant and (len(values) >= 2 or abs(float(values[0])) <= SLACK)

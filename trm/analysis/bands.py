"""The 95% interval of each experiment at each point of a curve: a test-accuracy curve over training
(table-curves.csv, x = epoch) or over test-time supervision steps (table-test-time.csv, x = steps). The plots draw
it as a band around the experiment's mean line (trm/analysis/plots.py).

At each x, an experiment's runs are summarised as the table summarises a final metric (uncertainty.estimate):
over its seeds where it has 2 or more; where it has one, from the noise floor combined with the sampling interval
over the puzzles that evaluation scored (its `count`: a training evaluation scores train.eval_subset puzzles, the
test-time curve the workflow's test_time_subset). The noise floor of a point is measured at that x: the seed spread
of the floor configurations (every group's baseline, the reference runs) at the same epoch or step count,
pooled as the table pools it (judge.noise_floors). Where no floor configuration has 2 seeds at that x (an epoch
only a longer run reaches) the point has no floor, and its interval is the sampling interval alone, its source
`sampling only`, as the table's would be.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from trm.analysis.judge import floor_ids, noise_floors
from trm.analysis.uncertainty import NoiseFloor, estimate
from trm.study.metrics import EVALUATED_PUZZLES, FRACTION_OF_CELLS, FRACTION_OF_PUZZLES, Metric

if TYPE_CHECKING:
    import pandas as pd

# What a point's run needs from the runs table (joined on `run`) for the noise floor: the configuration its seeds
# are replicates of, the seed, and whether the run is a reference (a baseline, or a run of the reference group).
RUN_COLUMNS = ("config_key", "seed", "baseline")
# Units whose single run has a sampling interval over the puzzles scored; for cell accuracy the puzzle is still the
# unit sampled (uncertainty.estimate).
SAMPLED_UNITS = (FRACTION_OF_PUZZLES, FRACTION_OF_CELLS)
BAND_COLUMNS = ("id", "n", "mean", "low", "high", "source")


def _with_runs(points: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """`points` with each run's RUN_COLUMNS from the runs table (the test-time rows' own `baseline` replaced)."""
    runs = table.drop_duplicates("run").set_index("run")[list(RUN_COLUMNS)]
    return points.drop(columns=[c for c in RUN_COLUMNS if c in points]).join(runs, on="run")


def floors_by_x(points: pd.DataFrame, table: pd.DataFrame, x: str, y: str) -> dict[float, NoiseFloor | None]:
    """The noise floor of y at each x: over the seeds of the floor's configurations (`floor_ids`) measured at that x. `points`:
    every group's rows (each group's baseline measures it); `table`: the runs table, one row per run."""
    joined = _with_runs(points, table)
    floor = floor_ids(joined)
    return {value: noise_floors(rows, [y], floor)[y] for value, rows in joined.groupby(x)}


def _puzzles(rows: pd.DataFrame) -> int:
    """The puzzles the point's evaluation scored (the fewest, should its runs differ)."""
    return int(rows[EVALUATED_PUZZLES.key].min())


def point_estimates(
    points: pd.DataFrame, table: pd.DataFrame, x: str, metric: Metric, ids: Iterable[str]
) -> pd.DataFrame:
    """One row per experiment of `ids` and x where it was measured: the number of runs n, the mean and 95% interval
    (low, high) of the metric over them, and the interval's source (uncertainty: SEEDS, FLOOR_AND_SAMPLING, ...)."""
    import pandas as pd

    y = metric.key
    floors = floors_by_x(points, table, x, y)
    sampled = metric.unit in SAMPLED_UNITS
    rows = []
    for (exp, value), at in points[points["id"].isin(list(ids))].groupby(["id", x], sort=True):
        point = estimate(at[y], floors.get(value), _puzzles(at) if sampled else None)
        if point.n == 0 or math.isnan(point.mean):
            continue
        fields = (point.n, point.mean, point.low, point.high, point.source)
        rows.append({"id": exp, x: value, **dict(zip(BAND_COLUMNS[1:], fields, strict=True))})
    return pd.DataFrame(rows, columns=[BAND_COLUMNS[0], x, *BAND_COLUMNS[1:]])

"""The records a run writes to metrics.jsonl: train records over a window of steps and eval records, and the
Tally that sums an evaluation's per-puzzle statistics into an eval record.

JAX-free: the trainer writes these records and the analysis reads them back.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

import numpy as np

from trm import storage
from trm.errors import UserError
from trm.run import layout

# What an evaluation measures of each puzzle after k supervision steps, averaged over the real puzzles
# (trm/train/evaluator.py says what each means). An eval record holds them with "steps" (k) and "count" (puzzles).
EVAL_STATS = (
    "exact_accuracy",
    "accuracy",
    "q_halt_accuracy",
    "mean_halt_step",
    "halted_fraction",
    "halt_exact_accuracy",
    "lm_loss",
    "q_halt_loss",
)


# The statistics whose sample standard deviation over the puzzles an eval record also carries, as
# "{name}_puzzle_sd": the sampling interval of cell accuracy (trm/analysis/uncertainty.py) reads sd / sqrt(count).
SD_STATS = ("accuracy",)


class Tally:
    """The float64 sums of an evaluation so far, per count and statistic, over its first `batches` batches, and
    the sums of squares of the SD_STATS.

    Its record (`to_record`, JSON: a float64 written by Python round-trips exactly) lets a stopped evaluation
    continue where it stopped and end with exactly the figures of an unbroken one. A subclass sums other
    statistics (STATS, SD: the sampled evaluation's, trm/train/sampled.py).
    """

    STATS: tuple[str, ...] = EVAL_STATS
    SD: tuple[str, ...] = SD_STATS

    def __init__(
        self, counts: Sequence[int], batches: int = 0, count: int = 0, sums=None, squares=None
    ) -> None:
        self.counts = tuple(counts)
        self.batches = batches
        self.count = count
        self.sums = np.zeros((len(self.counts), len(self.STATS))) if sums is None else np.asarray(sums)
        self.squares = np.zeros((len(self.counts), len(self.SD))) if squares is None else np.asarray(squares)

    def add(self, stats: dict[int, dict], real: np.ndarray) -> None:
        """One batch's per-row statistics, summed in row order."""
        self.sums += [
            [stats[k][name][real].sum(dtype=np.float64) for name in self.STATS] for k in self.counts
        ]
        self.squares += [
            [np.square(stats[k][name][real], dtype=np.float64).sum() for name in self.SD] for k in self.counts
        ]
        self.count += int(real.sum())
        self.batches += 1

    def results(self) -> list[dict]:
        """One record per count: {"steps": k, "count": puzzles, **EVAL_STATS means, **"{SD_STATS}_sd"}, each sd
        the sample standard deviation over the puzzles (n - 1 in the denominator; None below 2 puzzles)."""
        n = self.count
        return [
            {
                "steps": k,
                "count": n,
                **{name: float(v) / max(n, 1) for name, v in zip(self.STATS, row, strict=True)},
                **{
                    f"{name}_puzzle_sd": _sample_sd(float(row[self.STATS.index(name)]), float(square), n)
                    for name, square in zip(self.SD, squares, strict=True)
                },
            }
            for k, row, squares in zip(self.counts, self.sums, self.squares, strict=True)
        ]

    def to_record(self) -> dict:
        return {
            "counts": list(self.counts),
            "batches": self.batches,
            "count": self.count,
            "sums": self.sums.tolist(),
            "squares": self.squares.tolist(),
        }

    @classmethod
    def from_record(cls, record: dict) -> Tally:
        """The tally `to_record` saved."""
        return cls(record["counts"], record["batches"], record["count"], record["sums"], record["squares"])


def _sample_sd(total: float, squares: float, n: int) -> float | None:
    """The sample standard deviation of n values from their sum and sum of squares (None below 2 values).
    The values are fractions or losses of order 1, summed in float64: the cancellation costs nothing visible."""
    if n < 2:
        return None
    return float(np.sqrt(max(squares - total * total / n, 0.0) / (n - 1)))


def parse_steps(text: str, option: str = "--steps") -> tuple[int, ...]:
    """'16,32' -> (16, 32), sorted and deduplicated; UserError naming `option` on anything but positive
    integers."""
    problem = f"{option} {text!r}: expected comma-separated positive integers, e.g. 16,32,64"
    try:
        counts = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise UserError(problem) from None
    if not counts or min(counts) < 1:
        raise UserError(problem)
    return tuple(sorted(counts))


def results_csv(results: list[dict]) -> str:
    """An evaluation's results (one record per step count) as CSV, one row per count."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(results[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(results)
    return out.getvalue()


class MetricsLog:
    """metrics.jsonl in the run dir, rewritten whole at each flush (GCS objects cannot be appended to).

    Only the writer (process 0) reads or writes the file; on other hosts the log is inert.
    """

    def __init__(self, url: str, resume_step: int, writer: bool = True) -> None:
        self.url = url
        self.writer = writer
        self.records: list[dict] = []
        if writer and storage.exists(url):
            # Drop records written after the checkpoint we resume from: they will be written again. A damaged
            # record cannot be: the run's figures would miss it.
            records = storage.read_json_lines(url, "missing", layout.RETRAIN)
            self.records = [r for r in records if r["step"] <= resume_step]

    def add(self, record: dict) -> None:
        self.records.append(record)

    def flush(self) -> None:
        if self.writer:
            storage.write_text(self.url, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.records))


# A train record's means over the rows its window counted (the training examples that halted in it).
ROW_MEANS = ("accuracy", "exact_accuracy", "q_halt_accuracy", "steps", "steps_variance")


def row_means(sums: dict[str, float]) -> dict[str, float | None]:
    """The ROW_MEANS of a window from its metric sums: the accuracies of the rows that halted in it, and the mean
    and variance of the supervision steps at which they halted. None when no row halted (a window shorter than
    the halt limit, with no early halt): a mean over no row is not 0, and the summary weighs records by `count`."""
    count = sums["count"]
    if count <= 0:
        return dict.fromkeys(ROW_MEANS)
    mean = sums["steps"] / count
    return {
        **{k: sums[k] / count for k in ("accuracy", "exact_accuracy", "q_halt_accuracy")},
        "steps": mean,
        "steps_variance": max(sums["steps_sq"] / count - mean * mean, 0.0),
    }


class MetricWindow:
    """Metric sums of the steps since the last train record.

    Kept as device arrays (no host sync per step) and saved in each checkpoint's record, so a run resumed
    mid-window logs exactly the records an uninterrupted run logs.
    """

    def __init__(self, steps: int = 0, sums: dict[str, float] | None = None) -> None:
        self.steps = steps
        self._parts: list[dict] = [sums] if sums else []

    @classmethod
    def from_record(cls, record: dict) -> MetricWindow:
        """The window a checkpoint's record saved; an empty one for the step-0 checkpoint of imported weights
        (trm/train/weights.py write_run_dir), whose record holds none: no step was trained."""
        saved = record.get("metric_window", {"steps": 0, "sums": None})
        return cls(saved["steps"], saved["sums"])

    def add(self, metrics: dict) -> None:
        self._parts.append(metrics)
        self.steps += 1

    def clear(self) -> None:
        self._parts, self.steps = [], 0

    def sums(self) -> dict[str, float]:
        return {
            k: float(sum(np.asarray(part[k], np.float64) for part in self._parts)) for k in self._parts[0]
        }

    def to_record(self) -> dict:
        return {"steps": self.steps, "sums": self.sums() if self._parts else None}


def best_evaluation(records: list[dict]) -> dict | None:
    """The eval record with the highest test exact accuracy, the latest among equals (so a tie goes to the final
    evaluation on the full test split), without its kind and split; None when there is none.

    Intermediate evaluations run on `train.eval_subset` puzzles: the best of several noisy subset estimates
    leans high, so the record keeps `subset` and `count` (puzzles evaluated) beside its step and epoch.
    """
    evals = [r for r in records if r["kind"] == "eval"]
    if not evals:
        return None
    best = max(reversed(evals), key=lambda r: r["exact_accuracy"])  # max keeps the first of equals
    return {k: v for k, v in best.items() if k not in ("kind", "split")}

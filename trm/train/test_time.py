"""The final evaluation of a run, the last phase of `trm train`: the headline on the whole test split, the
test-time curve on the whole split or on a fixed subset of it.

It runs where the trained weights already are, on every host and device of the training job (data-parallel:
each process feeds its rows, trm/train/evaluator.py), before final.json and _SUCCESS, so a job that reports
success has evaluated its run. The counts are `trm train --test-time-steps` and train.eval_steps; one pass of
max(counts) supervision steps records the figures after each of them.

`trm train --test-time-subset N` (the workflow's test_time_subset) sizes the test-time curve to what it can
resolve. Without it, one pass over the whole test split scores every count. With it, two passes:
  the headline   the whole split to train.eval_steps: final.json's "test", the same figures as without a subset
  the curve      every count on a fixed subset of N groups of the split (a group is a base puzzle with its
                 augmentations; the Sudoku test split has one puzzle per group): the first N of a permutation
                 of the split's groups seeded with SUBSET_SEED, a constant (not train.seed), so every run of
                 every study scores the same puzzles, evaluated in split order. N at least the split's groups
                 is the whole split (one pass).

In the run dir (names in trm/run/layout.py):
  test_time.json           the finished evaluation, the JSON `trm evaluate --out` writes (checkpoint step,
                           weights, batch, one result per count in "results"), with these keys added:
                             "results"          at train.eval_steps the whole split; at the other counts the
                                                curve's rows
                             "evaluated_rows"   {count: {"subset_size", "subset_seed"}} for each of "results":
                                                the subset's groups and seed, both null for the whole split
                             "test_time_subset" {"size", "seed"} of the curve, null when it is the whole split
                             "curve_results"    the curve: every count on the same rows (the subset, or the
                                                whole split), train.eval_steps included
                           written after each pass; what the workflow collects
  test_time.progress.json  an unfinished pass: its float64 sums (and sums of squares) after its first N batches,
                           written by process 0 every PROGRESS_EVERY_S, when the job is stopped (a preemption) and
                           at the end of the pass, before test_time.json (so a failed write of that, a full disk,
                           loses nothing)

A relaunched job continues: results already in test_time.json for the same rows are not evaluated again, and a
pass with the same counts, rows, batch and devices continues after the batches its progress file holds, ending
with exactly the figures of an unbroken pass (the sums are kept in float64, in row order, and JSON round-trips
them).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import jax
import numpy as np

from trm import storage
from trm.data.format import SplitData
from trm.errors import UserError
from trm.run import distributed, layout
from trm.train.evaluator import Evaluator, evaluate
from trm.train.records import Tally

PROGRESS_EVERY_S = 60.0
# The seed of the test-time subset's permutation: a constant of the code, not train.seed nor any run setting, so
# the curves of all runs (and of every study) are measured on the same puzzles.
SUBSET_SEED = 0

# Which rows a result was evaluated on: None (the whole split) or (subset groups, seed).
Rows = tuple[int, int] | None


def subset_groups(num_groups: int, size: int, seed: int = SUBSET_SEED) -> np.ndarray:
    """The groups of a test-time subset, ascending: the first `size` of a `seed`ed permutation of `num_groups`.
    A pure function of its arguments (a smaller subset is part of a larger one)."""
    order = np.random.Generator(np.random.PCG64(seed)).permutation(num_groups)
    return np.sort(order[:size])


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The concatenation of arange(start, end) for each pair."""
    lengths = (ends - starts).astype(np.int64)
    offsets = np.repeat(starts.astype(np.int64) - np.cumsum(lengths) + lengths, lengths)
    return offsets + np.arange(lengths.sum())


def take_groups(split: SplitData, groups: np.ndarray) -> SplitData:
    """The split restricted to `groups` (ascending), each with all its puzzles and their examples, in order."""
    puzzles = _ranges(split.group_indices[groups], split.group_indices[groups + 1])
    examples = _ranges(split.puzzle_indices[puzzles], split.puzzle_indices[puzzles + 1])
    puzzle_sizes = split.puzzle_indices[puzzles + 1] - split.puzzle_indices[puzzles]
    group_sizes = split.group_indices[groups + 1] - split.group_indices[groups]
    return SplitData(
        inputs=np.asarray(split.inputs[examples]),
        labels=np.asarray(split.labels[examples]),
        puzzle_identifiers=split.puzzle_identifiers[puzzles],
        puzzle_indices=np.concatenate([[0], np.cumsum(puzzle_sizes)]).astype(np.int32),
        group_indices=np.concatenate([[0], np.cumsum(group_sizes)]).astype(np.int32),
        metadata={**split.metadata, "total_groups": len(groups), "total_puzzles": len(groups)},
    )


def curve_rows(split: SplitData, subset: int | None) -> Rows:
    """The rows of the test-time curve: None (the whole split) when `subset` is None or covers every group."""
    if subset is None or subset >= _groups(split):
        return None
    return subset, SUBSET_SEED


def rows_record(rows: Rows) -> dict:
    """`rows` as test_time.json's "evaluated_rows" says it: subset size and seed, both null for the whole split."""
    size, seed = rows or (None, None)
    return {"subset_size": size, "subset_seed": seed}


def _rows_of(record: dict) -> Rows:
    if record["subset_size"] is None:
        return None
    return record["subset_size"], record["subset_seed"]


def read_or_redo(url: str) -> dict:
    """The JSON object at `url`, or {} when it is damaged (a crash or a full disk cut it short): what it held is
    evaluated again, and the file rewritten."""
    try:
        value = storage.read_json(url, "missing", "evaluating again")
    except storage.DamagedFile as err:
        print(err, file=sys.stderr)
        return {}
    return value if isinstance(value, dict) else {}


def read_evaluation(run_dir: str, checkpoint_step: int) -> dict[tuple[Rows, int], dict]:
    """The results of the run's test_time.json by (rows, count), if it evaluated the checkpoint of
    `checkpoint_step`."""
    url = layout.path(run_dir, layout.TEST_TIME)
    if not storage.exists(url):
        return {}
    summary = read_or_redo(url)
    if summary.get("checkpoint_step") != checkpoint_step:
        return {}
    evaluated_rows = summary["evaluated_rows"]
    done = {(_rows_of(evaluated_rows[str(r["steps"])]), r["steps"]): r for r in summary["results"]}
    curve = summary["test_time_subset"]
    for result in summary["curve_results"]:
        done.setdefault((None if curve is None else (curve["size"], curve["seed"]), result["steps"]), result)
    return done


def _progress_key(
    counts: tuple[int, ...], rows: Rows, checkpoint_step: int, batch_size: int, devices: int
) -> dict:
    """What a saved tally must match to be continued: the same rows, batched and split over devices the same
    way."""
    return {
        "counts": list(counts),
        "rows": rows_record(rows),
        "checkpoint_step": checkpoint_step,
        "batch_size": batch_size,
        "devices": devices,
    }


def _saved_tally(run_dir: str, key: dict) -> Tally:
    """The tally of a stopped pass with the same key, else a fresh one. Every host reads the file; they must
    agree on where to continue (the stopped job's process 0 wrote it)."""
    url = layout.path(run_dir, layout.TEST_TIME_PROGRESS)
    saved = read_or_redo(url) if storage.exists(url) else {}
    tally = Tally.from_record(saved["tally"]) if saved.get("key") == key else Tally(key["counts"])
    distributed.check_hosts_agree(f"where the evaluation in {url} continues", f"batch {tally.batches}")
    return tally


def run_test_time_evaluation(
    evaluator: Evaluator,
    weights: tuple,
    split: SplitData,
    *,
    run_dir: str,
    counts: tuple[int, ...],
    batch_size: int,
    summary: dict,
    writer: bool,
    stop: Callable[[int], bool],
    heartbeat: Callable[[], None] = lambda: None,
    headline: int | None = None,
    subset: int | None = None,
) -> dict[int, dict] | None:
    """The results per count for every one of `counts`, evaluating only those not in the run's test_time.json
    yet, and write test_time.json (`summary` + the results, after each pass); None when `stop(n)` said to stop
    after the pass's batch that was the n-th this call evaluated, or continued from (the progress is saved). With `subset` groups (fewer than the split's) the count
    `headline` is the whole split's and every count is also scored on the subset (the curve); otherwise every
    count is the whole split's. `evaluator` is any Evaluator of the model (its compiled step is reused);
    `weights` from its put_weights; `summary` holds checkpoint_step and how the run was evaluated."""
    counts = tuple(sorted(set(counts)))
    curve = curve_rows(split, subset)
    if curve is not None and headline not in counts:
        raise ValueError(f"the headline count {headline} is not one of the counts {counts}")
    passes = [(None, counts)] if curve is None else [(None, (headline,)), (curve, counts)]
    checkpoint_step = summary["checkpoint_step"]
    done = read_evaluation(run_dir, checkpoint_step)
    last = 0  # the n of `stop(n)` rises from pass to pass: a multi-host preemption sync point needs that
    for rows, pass_counts in passes:
        missing = tuple(count for count in pass_counts if (rows, count) not in done)
        distributed.check_hosts_agree("the test-time counts left to evaluate", f"{rows}: {missing}")
        if missing:
            key = _progress_key(missing, rows, checkpoint_step, batch_size, jax.device_count())
            rows_split = split if rows is None else take_groups(split, subset_groups(_groups(split), *rows))

            def pass_stop(batches: int, first: int = last) -> bool:
                nonlocal last
                last = first + batches
                return stop(last)

            results = _evaluate_pass(
                evaluator, weights, rows_split, key, run_dir, writer, pass_stop, heartbeat
            )
            if results is None:
                return None
            done.update({(rows, result["steps"]): result for result in results})
        if writer:
            _write(run_dir, summary, batch_size, counts, headline, curve, done)
    return {count: done[_result_rows(count, headline, curve), count] for count in counts}


def _groups(split: SplitData) -> int:
    return len(split.group_indices) - 1


def _result_rows(count: int, headline: int | None, curve: Rows) -> Rows:
    """The rows of "results" at `count`: the whole split at the headline count, else the curve's."""
    return None if count == headline else curve


class SavedProgress:
    """A resumable pass's tally, written with its key to `url` by the writer process: every PROGRESS_EVERY_S
    seconds, when the job is stopped, and at the end (before the results, so a failed write of those costs no
    evaluation again). Shared by the test-time curve and the sampled recursion (trm/train/final_evaluation.py)."""

    def __init__(
        self,
        url: str,
        key: dict,
        tally,
        writer: bool,
        stop: Callable[[int], bool],
        heartbeat: Callable[[], None],
    ) -> None:
        self.url, self.key, self.tally, self.writer = url, key, tally, writer
        self.stop, self.heartbeat = stop, heartbeat
        self.saved_batches, self.last_write = tally.batches, time.time()

    def save(self) -> None:
        storage.write_text(self.url, json.dumps({"key": self.key, "tally": self.tally.to_record()}))
        self.last_write = time.time()

    def after_batch(self, tally) -> bool:
        """The evaluation's per-batch callback: True when the job is stopping (its progress then saved)."""
        stopping = self.stop(tally.batches)  # a collective on several hosts: every process calls it
        self.heartbeat()
        if self.writer and (stopping or time.time() - self.last_write >= PROGRESS_EVERY_S):
            self.save()
        return stopping

    def finish(self) -> None:
        """After a completed pass: save what this process evaluated beyond the saved tally."""
        if self.writer and self.tally.batches > self.saved_batches:
            self.save()


def _evaluate_pass(
    evaluator: Evaluator,
    weights: tuple,
    split: SplitData,
    key: dict,
    run_dir: str,
    writer: bool,
    stop: Callable[[int], bool],
    heartbeat: Callable[[], None],
) -> list[dict] | None:
    """One pass over `split` at key["counts"], continuing a saved tally with the same key; None when stopped."""
    tally = _saved_tally(run_dir, key)
    progress = SavedProgress(
        layout.path(run_dir, layout.TEST_TIME_PROGRESS), key, tally, writer, stop, heartbeat
    )
    if tally.batches:
        print(f"test-time evaluation continues after batch {tally.batches}", file=sys.stderr)
    where = "the whole test split" if key["rows"]["subset_size"] is None else f"{_groups(split)} test groups"
    print(
        f"test-time evaluation of step counts {','.join(map(str, key['counts']))} on {where}", file=sys.stderr
    )
    results = evaluate(
        evaluator.with_counts(key["counts"]),
        weights,
        split,
        key["batch_size"],
        progress=True,
        tally=tally,
        after_batch=progress.after_batch,
    )
    if results is not None:
        progress.finish()
    return results


def _write(
    run_dir: str,
    summary: dict,
    batch_size: int,
    counts: tuple[int, ...],
    headline: int | None,
    curve: Rows,
    done: dict[tuple[Rows, int], dict],
) -> None:
    """test_time.json: `summary`, and the results evaluated so far (module docstring)."""
    have = [count for count in counts if (_result_rows(count, headline, curve), count) in done]
    evaluation = {**summary, "devices": jax.device_count(), "batch_size": batch_size}
    evaluation["results"] = [done[_result_rows(count, headline, curve), count] for count in have]
    evaluation["evaluated_rows"] = {
        str(count): rows_record(_result_rows(count, headline, curve)) for count in have
    }
    evaluation["test_time_subset"] = None if curve is None else {"size": curve[0], "seed": curve[1]}
    evaluation["curve_results"] = [done[curve, count] for count in counts if (curve, count) in done]
    url = layout.path(run_dir, layout.TEST_TIME)
    try:
        storage.write_text(url, json.dumps(evaluation, indent=2) + "\n")
    except UserError as err:
        raise UserError(
            f"{err}; the evaluation is saved: a rerun writes {url} without evaluating again"
        ) from None

"""A run's final evaluation, the last phase of `trm train`: the deterministic passes (test_time.json,
trm/train/test_time.py), then, with `trm train --test-time-trajectories`, the sampled recursion
(trm/train/sampled.py): every test-time step count x every K of the trajectories, at one noise sigma and seed, on
the rows of the test-time curve (the test_time_subset puzzles, or the whole split).

In the run dir (names in trm/run/layout.py):
  sampled.json           {"checkpoint_step", "sigma", "seed", "rows": {"subset_size", "subset_seed"}, "batch_size",
                         "devices", "results": one record per K and count (trm/train/sampled.py's figures, with
                         "steps", "trajectories", "sigma", "seed", "count")}, written after each K's pass
  sampled.progress.json  an unfinished pass's sums, as test_time.progress.json: a relaunched job continues after
                         the batches it holds and ends with exactly the figures of an unbroken pass

A K already in sampled.json for the same checkpoint, rows, sigma, seed and counts is not evaluated again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence

import jax

from trm import storage
from trm.data.format import SplitData
from trm.run import distributed, layout
from trm.train.evaluator import Evaluator
from trm.train.sampled import SampledEvaluator, SampledTally, describe, evaluate_sampled
from trm.train.sampling import Sampling
from trm.train.test_time import (
    SavedProgress,
    curve_rows,
    read_or_redo,
    rows_record,
    run_test_time_evaluation,
    subset_groups,
    take_groups,
)


def run_final_evaluation(
    evaluator: Evaluator,
    weights: tuple,
    split: SplitData,
    *,
    counts: tuple[int, ...],
    headline: int,
    subset: int | None,
    sampling: Sampling | None,
    summary: dict,
    stop: Callable[[int], bool],
    **passes,
) -> dict | None:
    """The whole test split's figures at `headline` (train.eval_steps), or None if stopped: run_test_time_evaluation
    at `counts` and `headline`, on `subset` groups when there are `counts`, then with `sampling`
    run_sampled_evaluation at `counts` (or `headline` alone) on the same rows. `passes`: run_dir, batch_size,
    writer, heartbeat (both take them)."""
    subset = subset if counts else None
    results = run_test_time_evaluation(
        evaluator,
        weights,
        split,
        counts=(*counts, headline),
        summary={
            **summary,
            "split": "test",
            "subset": None,
        },  # the whole test split (`subset`: trm evaluate's)
        stop=stop,
        headline=headline,
        subset=subset,
        **passes,
    )
    if results is None or sampling is None:
        return None if results is None else results[headline]
    # The stop points continue after the deterministic passes' (fewer batches than twice the puzzles): a
    # multi-host preemption sync point must rise from call to call.
    after = 2 * len(split.inputs)
    sampled = run_sampled_evaluation(
        evaluator,
        weights,
        split,
        sampling=sampling,
        counts=counts or (headline,),
        checkpoint_step=summary["checkpoint_step"],
        stop=lambda batches: stop(after + batches),
        subset=subset,
        **passes,
    )
    return None if sampled is None else results[headline]


def read_sampled(run_dir: str) -> dict:
    """The run's sampled.json, or {} when it has none (or a damaged one: evaluated again)."""
    url = layout.path(run_dir, layout.SAMPLED)
    return read_or_redo(url) if storage.exists(url) else {}


def run_sampled_evaluation(
    evaluator: Evaluator,
    weights: tuple,
    split: SplitData,
    *,
    run_dir: str,
    sampling: Sampling,
    counts: Sequence[int],
    batch_size: int,
    checkpoint_step: int,
    writer: bool,
    stop: Callable[[int], bool],
    heartbeat: Callable[[], None] = lambda: None,
    subset: int | None = None,
) -> list[dict] | None:
    """The records of every K of `sampling` at every one of `counts` on the curve's rows (`subset` groups of
    `split`, or all of it), evaluating only the Ks not in the run's sampled.json yet; None when `stop(n)` said
    to stop after the n-th batch this call evaluated, or continued from (the progress is saved). `evaluator`
    and `weights` as for run_test_time_evaluation."""
    counts = tuple(sorted(set(counts)))
    rows = curve_rows(split, subset)
    groups = len(split.group_indices) - 1
    rows_split = split if rows is None else take_groups(split, subset_groups(groups, *rows))
    setting = {
        "checkpoint_step": checkpoint_step,
        "sigma": float(sampling.sigma),
        "seed": sampling.seed,
        "rows": rows_record(rows),
        "counts": list(counts),
    }
    saved = read_sampled(run_dir)
    results = saved["results"] if all(saved.get(k) == v for k, v in setting.items()) else []
    done = {record["trajectories"] for record in results}
    missing = [k for k in sampling.trajectories if k not in done]
    distributed.check_hosts_agree("the trajectories left to sample", f"{setting}: {missing}")
    base = (
        SampledEvaluator(evaluator.with_counts(counts), missing[0], sampling.sigma, sampling.seed)
        if missing
        else None
    )
    last = 0
    for k in missing:
        key = {**setting, "trajectories": k, "batch_size": batch_size, "devices": jax.device_count()}

        def pass_stop(batches: int, first: int = last) -> bool:
            nonlocal last
            last = first + batches
            return stop(last)

        sampled = base.with_trajectories(k)
        describe(sampled, len(rows_split.inputs))
        records = _sampled_pass(sampled, weights, rows_split, key, run_dir, writer, pass_stop, heartbeat)
        if records is None:
            return None
        results = [*results, *records]
        if writer:
            summary = {**setting, "batch_size": batch_size, "devices": jax.device_count(), "results": results}
            storage.write_text(layout.path(run_dir, layout.SAMPLED), json.dumps(summary, indent=2) + "\n")
    order = {k: i for i, k in enumerate(sampling.trajectories)}
    return sorted(
        (r for r in results if r["trajectories"] in order),
        key=lambda r: (order[r["trajectories"]], r["steps"]),
    )


def _sampled_pass(
    sampled: SampledEvaluator,
    weights: tuple,
    split: SplitData,
    key: dict,
    run_dir: str,
    writer: bool,
    stop: Callable[[int], bool],
    heartbeat: Callable[[], None],
) -> list[dict] | None:
    """One K's pass, continuing a saved tally with the same key; None when stopped (its progress saved)."""
    url = layout.path(run_dir, layout.SAMPLED_PROGRESS)
    saved = read_or_redo(url) if storage.exists(url) else {}
    tally = (
        SampledTally.from_record(saved["tally"]) if saved.get("key") == key else SampledTally(sampled.counts)
    )
    distributed.check_hosts_agree(f"where the evaluation in {url} continues", f"batch {tally.batches}")
    if tally.batches:
        print(f"sampled evaluation continues after batch {tally.batches}", file=sys.stderr)
    progress = SavedProgress(url, key, tally, writer, stop, heartbeat)
    records = evaluate_sampled(
        sampled, weights, split, key["batch_size"], tally=tally, after_batch=progress.after_batch
    )
    if records is not None:
        progress.finish()
    return records

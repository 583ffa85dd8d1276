"""The final evaluation of a run, the last phase of `trm train`: the whole test split at every test-time count.

It runs where the trained weights already are, on every host and device of the training job (data-parallel:
each process feeds its rows, trm/train/evaluator.py), before final.json and _SUCCESS, so a job that reports
success has evaluated its run. The counts are `trm train --test-time-steps` and train.eval_steps: one pass of
max(counts) supervision steps on every test puzzle records the figures after each of them, so the trainer's
final evaluation (final.json's "test", at train.eval_steps) and the test-time scaling come from the same pass.

In the run dir (names in trm/run/layout.py):
  test_time.json           the finished evaluation, the JSON `trm evaluate --out` writes (checkpoint step,
                           weights, batch, one result per count); what the workflow collects
  test_time.progress.json  an unfinished pass: its float64 sums after its first N batches, written by process 0
                           every PROGRESS_EVERY_S, when the job is stopped (a preemption) and at the end of the
                           pass, before test_time.json (so a failed write of that, a full disk, loses nothing)

A relaunched job continues: counts already in test_time.json are not evaluated again, and a pass with the same
counts, batch and devices continues after the batches its progress file holds, ending with exactly the figures
of an unbroken pass (the sums are kept in float64, in row order, and JSON round-trips them).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import jax

from trm import storage
from trm.data.format import SplitData
from trm.errors import UserError
from trm.run import distributed, layout
from trm.train.evaluator import Evaluator, Tally, evaluate

PROGRESS_EVERY_S = 60.0


def read_evaluation(run_dir: str, checkpoint_step: int) -> dict[int, dict]:
    """The results per count of the run's test_time.json, if it evaluated the checkpoint of `checkpoint_step`."""
    url = layout.path(run_dir, layout.TEST_TIME)
    if not storage.exists(url):
        return {}
    summary = json.loads(storage.read_text(url))
    if summary["checkpoint_step"] != checkpoint_step:
        return {}
    return {result["steps"]: result for result in summary["results"]}


def _progress_key(counts: tuple[int, ...], checkpoint_step: int, batch_size: int, devices: int) -> dict:
    """What a saved tally must match to be continued: rows are batched and split over devices the same way."""
    return {
        "counts": list(counts),
        "checkpoint_step": checkpoint_step,
        "batch_size": batch_size,
        "devices": devices,
    }


def _saved_tally(run_dir: str, key: dict) -> Tally:
    """The tally of a stopped pass with the same key, else a fresh one. Every host reads the file; they must
    agree on where to continue (the stopped job's process 0 wrote it)."""
    url = layout.path(run_dir, layout.TEST_TIME_PROGRESS)
    saved = json.loads(storage.read_text(url)) if storage.exists(url) else {}
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
) -> dict[int, dict] | None:
    """The results per count for every one of `counts` on the whole of `split`, evaluating only those not in the
    run's test_time.json yet, and write test_time.json (`summary` + "results"); None when `stop(n)` said to stop
    after batch n (the progress is saved). `evaluator` is any Evaluator of the model (its compiled step is
    reused); `weights` from its put_weights; `summary` holds checkpoint_step and how the run was evaluated."""
    checkpoint_step = summary["checkpoint_step"]
    done = read_evaluation(run_dir, checkpoint_step)
    missing = tuple(count for count in sorted(set(counts)) if count not in done)
    distributed.check_hosts_agree("the test-time counts left to evaluate", str(missing))
    if missing:
        key = _progress_key(missing, checkpoint_step, batch_size, jax.device_count())
        tally = _saved_tally(run_dir, key)
        saved_batches = tally.batches
        progress_url = layout.path(run_dir, layout.TEST_TIME_PROGRESS)
        last_write = time.time()

        def save_progress() -> None:
            storage.write_text(progress_url, json.dumps({"key": key, "tally": tally.to_record()}))

        def after_batch(tally: Tally) -> bool:
            nonlocal last_write
            stopping = stop(tally.batches)  # a collective on several hosts: every process calls it
            heartbeat()
            if writer and (stopping or time.time() - last_write >= PROGRESS_EVERY_S):
                save_progress()
                last_write = time.time()
            return stopping

        if tally.batches:
            print(f"test-time evaluation continues after batch {tally.batches}", file=sys.stderr)
        print(f"test-time evaluation of step counts {','.join(map(str, missing))}", file=sys.stderr)
        results = evaluate(
            evaluator.with_counts(missing),
            weights,
            split,
            batch_size,
            progress=True,
            tally=tally,
            after_batch=after_batch,
        )
        if results is None:
            return None
        if writer and tally.batches > saved_batches:
            save_progress()  # first: a failed write of the results below then costs no evaluation again
        done.update({result["steps"]: result for result in results})
    evaluation = {**summary, "devices": jax.device_count(), "batch_size": batch_size}
    evaluation["results"] = [done[count] for count in sorted(done)]
    if writer:
        url = layout.path(run_dir, layout.TEST_TIME)
        try:
            storage.write_text(url, json.dumps(evaluation, indent=2) + "\n")
        except UserError as err:
            raise UserError(
                f"{err}; the evaluation is saved: a rerun writes {url} without evaluating again"
            ) from None
    return done

"""Summarise a finished run, read from its run dir, as the local file of its results that the results table reads.

    trm summarize RUN_DIR --test-time-steps 16,32 --output results/smoke/runs/exp01a.json

RUN_DIR is a gs://, file:// URL or a local path. Only a run whose _SUCCESS marker exists is summarised, and the
output is written in one piece at the end, so a local summary means the run finished. A run whose final evaluation
lacks one of --test-time-steps is refused too (exit 2): the workflow then relaunches its job, and the trainer
evaluates only the missing counts. Experiments sharing a run (one config hash) each get the same summary.

The summary holds what identifies the run and what it measured, not its config (the table reads that from the run's
job file, RESULTS/SCALE/jobs/<hash>.json, trm/launch/job.py: its one copy outside the run dir): the config hash
(final.json's, which names that file and the run dir), the devices that trained it, a digest of the weights it
finished with (equal only for runs that trained bit-identically: the verdicts see a treatment that did not act),
then its metrics, computed with the run dir's config.json (trm/study/metrics.py says what each means): the final
figures are the trainer's last evaluation on the full test split (EMA weights when EMA is on); the best_test_*
figures are its best evaluation (final.json `best_test`), usually on a subset. Train-side figures come from
metrics.jsonl: mean halt steps, train exact accuracy and the halt-step variance are taken over the rows (training
examples that halted) that the train records of the last evaluation interval counted, each record weighted by its
count (a record that counted none adds nothing); throughput is the median over train records after the first
(which includes compilation). The wall time is the run's over all its attempts (final.json, which the trainer
keeps from status.json), not that of the job that collected it. `curve` is the test accuracy of each evaluation
during training; `test_time` the final evaluation (test_time.json, from the checkpoint the run finished with) at
each --test-time-steps count; with --test-time-trajectories, `sampled` the final evaluation's sampled recursion
(sampled.json) at each of those counts and trajectories, at --test-time-noise (refused, exit 2, when it lacks one:
the workflow relaunches the job, which samples only what is missing), and the sampled_* metrics from it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics

from trm import storage
from trm.errors import UserError, number
from trm.run import layout
from trm.run.state import read_run
from trm.study.metrics import SAMPLED_METRICS, SUMMARY_METRICS, TARGET_ACCURACY, TEST_TIME_METRICS
from trm.train.sampling import DEFAULT_SIGMA, Sampling

# The keys of a summary (what `summarize` returns): the table refuses a summary without one of them.
SUMMARY_KEYS = ("config_hash", "devices", "weights_sha256", *SUMMARY_METRICS, "curve", "test_time")


def select_counts(evaluation: dict, counts: tuple[int, ...], source: str) -> list[dict]:
    """The results of `evaluation` (a test_time.json) at `counts`, in that order; UserError naming the missing
    ones."""
    by_count = {result["steps"]: result for result in evaluation["results"]}
    missing = [count for count in counts if count not in by_count]
    if missing:
        raise UserError(
            f"{source}: the run's final evaluation has step counts {','.join(map(str, sorted(by_count)))}, not "
            f"{','.join(map(str, missing))}: rerun its job (it evaluates only the missing counts), or delete the "
            "run dir's _SUCCESS and rerun `trm train`"
        )
    return [by_count[count] for count in counts]


def select_sampled(
    run_dir: str, final: dict, counts: tuple[int, ...], sampling: Sampling | None
) -> list[dict]:
    """The sampled.json records of `sampling` at `counts` (K by K, count by count); [] without sampling. UserError
    (the job samples again) when one is missing, or the file is another checkpoint's or noise's."""
    if sampling is None:
        return []
    source = layout.path(run_dir, layout.SAMPLED)
    saved = storage.read_json(
        source, "missing: rerun the run's job, which samples the final checkpoint", REEVALUATE
    )
    if saved.get("checkpoint_step") != final["steps"] or saved.get("sigma") != sampling.sigma:
        raise UserError(
            f"{source}: samples step {saved.get('checkpoint_step')} at noise {saved.get('sigma')}, not step "
            f"{final['steps']} at {sampling.sigma}: rerun the run's job, which samples again"
        )
    by_key = {(r["trajectories"], r["steps"]): r for r in saved["results"]}
    wanted = [(k, count) for k in sampling.trajectories for count in counts]
    if missing := [key for key in wanted if key not in by_key]:
        raise UserError(
            f"{source}: no (trajectories, steps) {', '.join(map(str, missing))}: rerun the run's job, which samples "
            "only what is missing"
        )
    return [{key: by_key[pair][key] for key in SAMPLED_METRICS} for pair in wanted]


def sampled_metrics(sampled: list[dict]) -> dict:
    """The run's sampled_* metrics: at the largest K, after the first count (None without sampling)."""
    rules = ("q", "vote", "oracle")
    if not sampled:
        return {f"sampled_{rule}_exact_accuracy": None for rule in rules}
    top = max(r["trajectories"] for r in sampled)
    first = min((r for r in sampled if r["trajectories"] == top), key=lambda r: r["steps"])
    return {f"sampled_{rule}_exact_accuracy": first[f"{rule}_exact_accuracy"] for rule in rules}


def _counted(records: list[dict]) -> tuple[list[dict], int]:
    """The train records that counted a row (an example that halted in their window), and the rows they count.
    A record of a window in which no example halted (a window shorter than the halt limit, with no early halt)
    measured no row: its figures are null (0 from trainers before this one) and carry no weight."""
    counted = [r for r in records if r["count"] > 0]
    return counted, sum(r["count"] for r in counted)


def _row_mean(records: list[dict], key: str) -> float | None:
    """The mean of `key` over every row counted in `records` (each record's figure is the mean over its `count`
    rows, so records weigh by their counts); None when no row was counted."""
    counted, count = _counted(records)
    return sum(r["count"] * r[key] for r in counted) / count if count else None


def _pooled_variance(records: list[dict]) -> float | None:
    """Variance of the halt steps over all rows counted in `records` (train records with count, steps and
    steps_variance); None when no row was counted."""
    counted, count = _counted(records)
    if not count:  # no record, or no row halted in these windows (short runs of few puzzles)
        return None
    mean = _row_mean(counted, "steps")
    second = sum(r["count"] * (r["steps_variance"] + r["steps"] ** 2) for r in counted) / count
    return max(second - mean * mean, 0.0)


def weights_digest(final: dict) -> str | None:
    """One digest of the weights a run finished with: of final.json's params_sha256 and ema_sha256 (null without
    EMA). Equal for two runs only when they trained bit-identically; None when final.json has no digest."""
    if final.get("params_sha256") is None:
        return None
    weights = f"{final['params_sha256']} {final.get('ema_sha256')}"
    return hashlib.sha256(weights.encode()).hexdigest()[:16]


def run_metrics(
    config: dict, records: list[dict], final: dict, status: dict | None = None, sampled: list[dict] = ()
) -> dict:
    """The metrics of SUMMARY_METRICS of one run, from its config, metrics.jsonl records and final.json; the wall
    time of a run finished by a trainer that did not record it in final.json from its status.json (`status`); the
    sampled_* ones from its `sampled` records (`select_sampled`)."""
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    interval = config["train"]["eval_interval"]
    last_interval = [r for r in train if r["epoch"] > final["epochs"] - interval] or train[-1:]
    rates = [r["examples_per_s"] for r in train[1:]] or [r["examples_per_s"] for r in train]
    examples_per_second = statistics.median(rates) if rates else None
    reached = [r["epoch"] for r in evals if r["exact_accuracy"] >= TARGET_ACCURACY]
    test, best = final["test"], final["best_test"]
    train_exact = _row_mean(last_interval, "exact_accuracy")
    return {
        "test_exact_accuracy": test["exact_accuracy"],
        "best_test_exact_accuracy": best["exact_accuracy"],
        "best_test_epoch": best["epoch"],
        "best_test_puzzles": best["count"],
        "test_cell_accuracy": test["accuracy"],
        "test_cell_accuracy_puzzle_sd": test["accuracy_puzzle_sd"],
        "train_exact_accuracy": train_exact,
        "train_test_gap": None if train_exact is None else train_exact - test["exact_accuracy"],
        "mean_halt_steps": _row_mean(last_interval, "steps"),
        "halt_steps_variance": _pooled_variance(last_interval),
        "examples_per_second": examples_per_second,
        "step_time_s": config["train"]["global_batch_size"] / examples_per_second
        if examples_per_second
        else None,
        "epochs_to_85pct": min(reached) if reached else None,
        "steps": final["steps"],
        "epochs": final["epochs"],
        # Every attempt's, from the run's own records: not the time of whichever job collected it.
        "wall_time_s": final["wall_time_s"] if "wall_time_s" in final else (status or {}).get("elapsed_s"),
        **sampled_metrics(sampled),
    }


MISSING = "missing from a finished run (the trainer writes it before _SUCCESS)"
# What to do about a damaged file of a finished run's evaluation: its job evaluates the last checkpoint again.
REEVALUATE = (
    "rerun the run's job (snakemake, or the same `trm train`): it evaluates the last checkpoint again and "
    "rewrites it, without training"
)


def _status(run_dir: str) -> dict | None:
    """status.json, where a trainer older than final.json's wall_time_s kept the run's elapsed time (None when
    absent or unreadable: the wall time is then not measured)."""
    return read_run(run_dir).status or None  # its reader takes a damaged marker for none


def summarize(run_dir: str, test_time_steps: tuple[int, ...], sampling: Sampling | None = None) -> dict:
    """The summary of a finished run (see the module docstring); UserError if it has not finished, or if its
    final evaluation lacks one of `test_time_steps` or evaluates another checkpoint than the one it finished with."""
    if not layout.finished(run_dir):
        raise UserError(
            f"{run_dir}: the run has not finished (no {layout.SUCCESS} marker); its job trains it"
        )
    config = storage.read_json(layout.path(run_dir, layout.CONFIG), MISSING, layout.RETRAIN)
    records = storage.read_json_lines(layout.path(run_dir, layout.METRICS), MISSING, layout.RETRAIN)
    final = storage.read_json(layout.path(run_dir, layout.FINAL), MISSING, REEVALUATE)
    status = None if "wall_time_s" in final else _status(run_dir)
    source = layout.path(run_dir, layout.TEST_TIME)
    evaluation = storage.read_json(source, MISSING, REEVALUATE)
    if evaluation["checkpoint_step"] != final["steps"]:
        raise UserError(
            f"{source}: evaluates the checkpoint of step {evaluation['checkpoint_step']}, but the run finished at "
            f"step {final['steps']}: delete it and rerun the run's job, which evaluates the last checkpoint"
        )
    test_time = select_counts(evaluation, test_time_steps, source)
    sampled = select_sampled(run_dir, final, test_time_steps, sampling)
    summary = {
        "config_hash": final["config_hash"],
        "devices": final["devices"],  # of the job that trained it (launch.per_experiment may differ)
        "weights_sha256": weights_digest(final),
        **run_metrics(config, records, final, status, sampled),
        "curve": [
            {
                "epoch": r["epoch"],
                "count": r["count"],
                "test_exact_accuracy": r["exact_accuracy"],
                "test_cell_accuracy": r["accuracy"],
            }
            for r in records
            if r["kind"] == "eval"
        ],
        "test_time": [{key: result[key] for key in TEST_TIME_METRICS} for result in test_time],
    }
    return {**summary, "sampled": sampled} if sampled else summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="run directory URL (gs://, file:// or a local path)")
    parser.add_argument(
        "--test-time-steps",
        required=True,
        help="comma-separated supervision step counts the run's final evaluation must have, e.g. 16,32",
    )
    parser.add_argument(
        "--test-time-trajectories",
        default="",
        help="comma-separated trajectories per puzzle the run's sampled evaluation must have (default: none)",
    )
    parser.add_argument(
        "--test-time-noise",
        type=number(float, minimum=0),
        default=DEFAULT_SIGMA,
        help="the noise sd of that sampled evaluation (default %(default)s)",
    )
    parser.add_argument("--output", required=True, help="JSON file to write (a local path or a URL)")


def main(args: argparse.Namespace) -> int:
    from trm.train.records import parse_steps  # not at the top: the workflow reads summaries without numpy

    steps = parse_steps(args.test_time_steps, "--test-time-steps")
    trajectories = args.test_time_trajectories
    sampling = None
    if trajectories:
        sampling = Sampling(parse_steps(trajectories, "--test-time-trajectories"), args.test_time_noise)
    summary = summarize(args.run_dir, steps, sampling)
    storage.write_text(args.output, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(f"summarised {args.run_dir} -> {args.output}")
    return 0

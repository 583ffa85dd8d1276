"""Summarise one finished run (its collected config.json, metrics.jsonl and final.json) as one JSON record.

    trm run-metrics LOCAL_RUN_DIR --test-time eval/exp01a-steps.json --output eval/exp01a.json

The test figures are the trainer's final evaluation on the full test split (EMA weights when EMA is on); the
best_test_* figures are the run's best evaluation (`best_evaluation`, kept in final.json), usually on a subset.
`test_time` holds the run's `trm evaluate` results (--test-time): test accuracy after each evaluated number of
supervision steps, from the run's last checkpoint (refused if that is not the checkpoint the run finished with).
Train-side figures come from metrics.jsonl: mean halt steps and train exact accuracy average the train records of
the last evaluation interval, and the halt-step variance pools their rows; throughput is the median over train
records after the first (which includes compilation). A figure the run did not measure is null, e.g. raw-weight
accuracy.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from trm import storage
from trm.errors import UserError
from trm.run import layout
from trm.train.records import EVAL_STATS, best_evaluation

TARGET_ACCURACY = 0.85  # contrib01's "epochs to 85%"
# The per-step-count figures of `trm evaluate` kept for the table: all but the losses.
TEST_TIME_FIELDS = ("steps", *(name for name in EVAL_STATS if not name.endswith("_loss")))


def _read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pooled_variance(records: list[dict]) -> float | None:
    """Variance of the halt steps over all rows counted in `records` (train records with count, steps and
    steps_variance); None when a record lacks it (a run from a version that did not measure it)."""
    if not records or any(r.get("steps_variance") is None for r in records):
        return None
    count = sum(r["count"] for r in records)
    if count <= 0:
        return None
    mean = sum(r["count"] * r["steps"] for r in records) / count
    second = sum(r["count"] * (r["steps_variance"] + r["steps"] ** 2) for r in records) / count
    return max(second - mean * mean, 0.0)


def summarize_run(run_dir: str | Path, test_time_path: str | Path) -> dict:
    """The metrics of one run as a flat mapping (see the module docstring); floats or None, plus lists."""
    run_dir = Path(run_dir)
    try:
        final = json.loads((run_dir / layout.FINAL).read_text())
        config = json.loads((run_dir / layout.CONFIG).read_text())
        records = _read_records(run_dir / layout.METRICS)
    except FileNotFoundError as err:
        raise UserError(f"{run_dir}: not a collected run ({err.filename} missing)") from None
    try:
        test_time = json.loads(Path(test_time_path).read_text())
    except FileNotFoundError:
        raise UserError(f"{test_time_path}: missing (the run's `trm evaluate` output)") from None
    if test_time["checkpoint_step"] != final["steps"]:
        raise UserError(
            f"{test_time_path}: evaluates the checkpoint of step {test_time['checkpoint_step']}, but the run "
            f"in {run_dir} finished at step {final['steps']}"
        )
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    interval = config["train"]["eval_interval"]
    last_interval = [r for r in train if r["epoch"] > final["epochs"] - interval] or train[-1:]
    rates = [r["examples_per_s"] for r in train[1:]] or [r["examples_per_s"] for r in train]
    examples_per_second = statistics.median(rates) if rates else None
    reached = [r["epoch"] for r in evals if r["exact_accuracy"] >= TARGET_ACCURACY]
    test = final["test"]
    best = final.get("best_test") or best_evaluation(records)  # final.json of older runs lacks it
    train_exact = statistics.fmean(r["exact_accuracy"] for r in last_interval) if last_interval else None
    return {
        "config_hash": final["config_hash"],
        "devices": final["devices"],  # of the job that trained it (launch.per_experiment may differ)
        "steps": final["steps"],
        "epochs": final["epochs"],
        "test_exact_accuracy": test["exact_accuracy"],
        "best_test_exact_accuracy": best["exact_accuracy"],
        "best_test_epoch": best["epoch"],
        "best_test_puzzles": best["count"],
        "test_cell_accuracy": test["accuracy"],
        "test_exact_accuracy_raw": None,
        "train_exact_accuracy": train_exact,
        "train_test_gap": None if train_exact is None else train_exact - test["exact_accuracy"],
        "mean_halt_steps": statistics.fmean(r["steps"] for r in last_interval) if last_interval else None,
        "halt_steps_variance": _pooled_variance(last_interval),
        "examples_per_second": examples_per_second,
        "step_time_s": config["train"]["global_batch_size"] / examples_per_second
        if examples_per_second
        else None,
        "epochs_to_85pct": min(reached) if reached else None,
        "curve": [
            {
                "epoch": r["epoch"],
                "test_exact_accuracy": r["exact_accuracy"],
                "test_cell_accuracy": r["accuracy"],
            }
            for r in evals
        ],
        "test_time": [{key: result[key] for key in TEST_TIME_FIELDS} for result in test_time["results"]],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="local folder holding config.json, metrics.jsonl and final.json")
    parser.add_argument(
        "--test-time", required=True, help="the run's `trm evaluate` JSON (accuracy per supervision steps)"
    )
    parser.add_argument("--output", required=True, help="JSON file to write")


def main(args: argparse.Namespace) -> int:
    summary = summarize_run(args.run_dir, args.test_time)
    storage.write_text(args.output, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return 0

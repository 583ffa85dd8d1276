"""Summarise one finished run (its collected config.json, metrics.jsonl and final.json) as one JSON record.

    trm run-metrics LOCAL_RUN_DIR --output results/smoke/eval/exp01a.json

The test figures are the trainer's final evaluation on the full test split (EMA weights when EMA is on).
Train-side figures come from metrics.jsonl: mean halt steps and train exact accuracy average the train records of
the last evaluation interval; throughput is the median over train records after the first (which includes
compilation). A figure the run did not measure is null, e.g. raw-weight accuracy or the halt-step variance.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from trm.errors import UserError

TARGET_ACCURACY = 0.85  # contrib01's "epochs to 85%"


def _read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize_run(run_dir: str | Path) -> dict:
    """The metrics of one run as a flat mapping (see the module docstring); floats or None."""
    run_dir = Path(run_dir)
    try:
        final = json.loads((run_dir / "final.json").read_text())
        config = json.loads((run_dir / "config.json").read_text())
        records = _read_records(run_dir / "metrics.jsonl")
    except FileNotFoundError as err:
        raise UserError(f"{run_dir}: not a collected run ({err.filename} missing)") from None
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    interval = config["train"]["eval_interval"]
    last_interval = [r for r in train if r["epoch"] > final["epochs"] - interval] or train[-1:]
    rates = [r["examples_per_s"] for r in train[1:]] or [r["examples_per_s"] for r in train]
    examples_per_second = statistics.median(rates) if rates else None
    reached = [r["epoch"] for r in evals if r["exact_accuracy"] >= TARGET_ACCURACY]
    test = final["test"]
    train_exact = statistics.fmean(r["exact_accuracy"] for r in last_interval) if last_interval else None
    return {
        "config_hash": final["config_hash"],
        "steps": final["steps"],
        "epochs": final["epochs"],
        "test_exact_accuracy": test["exact_accuracy"],
        "best_test_exact_accuracy": max([test["exact_accuracy"]] + [r["exact_accuracy"] for r in evals]),
        "test_cell_accuracy": test["accuracy"],
        "test_exact_accuracy_raw": None,
        "train_exact_accuracy": train_exact,
        "train_test_gap": None if train_exact is None else train_exact - test["exact_accuracy"],
        "mean_halt_steps": statistics.fmean(r["steps"] for r in last_interval) if last_interval else None,
        "halt_steps_variance": None,
        "examples_per_second": examples_per_second,
        "step_time_s": config["train"]["global_batch_size"] / examples_per_second
        if examples_per_second
        else None,
        "epochs_to_85pct": min(reached) if reached else None,
        "curve": [{"epoch": r["epoch"], "test_exact_accuracy": r["exact_accuracy"]} for r in evals],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="local folder holding config.json, metrics.jsonl and final.json")
    parser.add_argument("--output", required=True, help="JSON file to write")


def main(args: argparse.Namespace) -> int:
    summary = summarize_run(args.run_dir)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return 0

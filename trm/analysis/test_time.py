"""Write a run's test-time evaluation at the requested step counts as JSON and CSV, from its collected copy.

    trm collect-evaluation results/smoke/runs/exp01a/test_time.json --steps 16,32 --out eval/exp01a-steps.json

The evaluation itself ran on the training job's hosts as its last phase (`trm train --test-time-steps`,
trm/train/test_time.py); this only selects its results at --steps, so the workflow's controller needs no JAX.
The output is the JSON `trm evaluate --out` writes (the same fields), and a CSV beside it with one row per count.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trm import storage
from trm.errors import UserError
from trm.train.records import parse_steps, results_csv


def select_counts(evaluation: dict, counts: tuple[int, ...], source: str) -> dict:
    """`evaluation` (a test_time.json) with only the results at `counts`; UserError naming the missing ones."""
    by_count = {result["steps"]: result for result in evaluation["results"]}
    missing = [count for count in counts if count not in by_count]
    if missing:
        raise UserError(
            f"{source}: the run's final evaluation has step counts {','.join(map(str, sorted(by_count)))}, not "
            f"{','.join(map(str, missing))}. Evaluate them with `trm evaluate --checkpoint RUN_DIR --steps ...`, "
            "or delete the run dir's _SUCCESS and rerun its job: the trainer then evaluates only the missing counts"
        )
    return {**evaluation, "results": [by_count[count] for count in counts]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "test_time", help="a run's test_time.json (collected by `trm collect-run`, or its URL)"
    )
    parser.add_argument("--steps", required=True, help="comma-separated supervision step counts to keep")
    parser.add_argument("--out", required=True, help="JSON file to write (the CSV beside it)")


def main(args: argparse.Namespace) -> int:
    counts = parse_steps(args.steps)
    if not storage.exists(args.test_time):
        raise UserError(
            f"{args.test_time}: missing (written by `trm train --test-time-steps` when it finishes)"
        )
    evaluation = select_counts(json.loads(storage.read_text(args.test_time)), counts, args.test_time)
    out = Path(args.out)
    storage.write_text(str(out.with_suffix(".csv")), results_csv(evaluation["results"]))
    storage.write_text(str(out), json.dumps(evaluation, indent=2) + "\n")  # last: the CSV is complete
    return 0

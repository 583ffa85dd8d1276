"""Copy a finished run's small files from its run dir (gs://, file:// or a path) into a local folder.

    trm collect-run RUN_URL LOCAL_DIR [--test-time-steps 16,32]

Only a run whose _SUCCESS marker exists is collected: config.json, metrics.jsonl, test_time.json, then
final.json last, so a local final.json means the run finished. The checkpoints stay in the run dir. With
--test-time-steps, a run whose final evaluation lacks one of those counts is refused too (the workflow then
relaunches it: the trainer evaluates only the missing counts).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trm import storage
from trm.analysis.test_time import select_counts
from trm.errors import UserError
from trm.run import layout
from trm.train.records import parse_steps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="run directory URL (gs://, file:// or a local path)")
    parser.add_argument(
        "local_dir",
        help="local folder to copy config.json, metrics.jsonl, test_time.json and final.json into",
    )
    parser.add_argument(
        "--test-time-steps",
        default="",
        help="comma-separated step counts the run's final evaluation must have",
    )


def collect_run(run_dir: str, local_dir: str | Path, test_time_steps: tuple[int, ...] = ()) -> None:
    """Copy layout.COLLECTED from a finished run; a UserError if the run has no _SUCCESS marker or its final
    evaluation lacks one of `test_time_steps`."""
    if not layout.finished(run_dir):
        raise UserError(f"{run_dir}: the run has not finished (no _SUCCESS marker)")
    evaluation = layout.path(run_dir, layout.TEST_TIME)
    if not storage.exists(evaluation):
        raise UserError(
            f"{evaluation}: missing (a run finished by an older version): delete {layout.path(run_dir, layout.SUCCESS)} "
            "and rerun its job, which then only evaluates it"
        )
    select_counts(json.loads(storage.read_text(evaluation)), test_time_steps, evaluation)
    local = Path(local_dir)
    for name in layout.COLLECTED:
        storage.write_bytes(str(local / name), storage.read_bytes(layout.path(run_dir, name)))


def main(args: argparse.Namespace) -> int:
    steps = parse_steps(args.test_time_steps, "--test-time-steps") if args.test_time_steps else ()
    collect_run(args.run_dir, args.local_dir, steps)
    print(f"collected {args.run_dir} -> {args.local_dir}")
    return 0

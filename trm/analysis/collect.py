"""Copy a finished run's small files from its run dir (gs://, file:// or a path) into a local folder.

    trm collect-run RUN_URL LOCAL_DIR

Only a run whose _SUCCESS marker exists is collected: config.json, metrics.jsonl, then final.json last, so a
local final.json means the run finished. The checkpoints stay in the run dir.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from trm import storage
from trm.errors import UserError
from trm.run import layout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="run directory URL (gs://, file:// or a local path)")
    parser.add_argument(
        "local_dir", help="local folder to copy config.json, metrics.jsonl and final.json into"
    )


def collect_run(run_dir: str, local_dir: str | Path) -> None:
    """Copy layout.COLLECTED from a finished run; a UserError if the run has no _SUCCESS marker."""
    if not layout.finished(run_dir):
        raise UserError(f"{run_dir}: the run has not finished (no _SUCCESS marker)")
    local = Path(local_dir)
    local.mkdir(parents=True, exist_ok=True)
    for name in layout.COLLECTED:
        fd, tmp = tempfile.mkstemp(dir=local, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as stream:
            stream.write(storage.read_bytes(layout.path(run_dir, name)))
        os.replace(tmp, local / name)


def main(args: argparse.Namespace) -> int:
    collect_run(args.run_dir, args.local_dir)
    print(f"collected {args.run_dir} -> {args.local_dir}")
    return 0

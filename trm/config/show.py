"""Resolve, validate and print a run configuration: config/base.yaml <- experiment <- --set overrides.

Examples:
  trm config exp06_f                               # resolved config of an experiment, as canonical JSON
  trm config exp06_f --set train.epochs=25000 --hash # the 12-digit hash that names its run
  trm config my_overrides.yaml --output run/config.json
  trm config run/config.json --resolved            # check a resolved config written to a run directory
  trm config --list                                # every experiment id
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trm import storage
from trm.config import load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "experiment", nargs="?", help="experiment id or override file (default: the baseline alone)"
    )
    load.add_overrides_argument(parser)
    parser.add_argument(
        "--resolved", action="store_true", help="the file is a complete resolved config: use no base"
    )
    parser.add_argument("--hash", action="store_true", help="print only the config hash")
    parser.add_argument("--output", help="write the resolved config to this file instead of stdout")
    parser.add_argument("--list", action="store_true", help="list the experiment ids and exit")


def main(args: argparse.Namespace) -> int:
    if args.list:
        print("\n".join(load.experiment_ids()))
        return 0
    path = args.experiment
    if path is not None and load.EXPERIMENT_ID.match(path) and not Path(path).exists():
        path = load.experiment_path(path)
    base = None if args.resolved else load.BASE_CONFIG
    config = load.load_config(path, args.overrides, base=base)
    text = load.config_hash(config) + "\n" if args.hash else load.dump_config(config)
    if args.output:
        storage.write_text(args.output, text)
    else:
        sys.stdout.write(text)
    return 0

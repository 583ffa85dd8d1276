"""Resolve, validate and print a run configuration: config/base.yaml <- experiment <- --set overrides.

Examples:
  trm config exp06_f                               # resolved config of an experiment, as canonical JSON
  trm config exp06_f --hash                        # the 12-digit hash of its config as written (paper scale)
  trm config exp06_f --scale smoke --hash          # the config the smoke study trains: its hash names the run dir
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
from trm.errors import UserError
from trm.study.plan import config_at_scale
from trm.study.scale import SCALES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "experiment", nargs="?", help="experiment id or override file (default: the baseline alone)"
    )
    load.add_overrides_argument(parser)
    parser.add_argument(
        "--resolved", action="store_true", help="the file is a complete resolved config: use no base"
    )
    parser.add_argument(
        "--scale",
        choices=SCALES,
        help="the config the study trains at this scale (trm/study/scale.py), whose hash names its run dir "
        "(STORAGE/<scale>/runs/<hash>); default: as written, which is the paper scale",
    )
    parser.add_argument("--hash", action="store_true", help="print only the config hash")
    parser.add_argument("--output", help="write the resolved config to this file instead of stdout")
    parser.add_argument("--list", action="store_true", help="list the experiment ids and exit")


def main(args: argparse.Namespace) -> int:
    if args.scale and args.resolved:
        raise UserError(f"--scale {args.scale}: a resolved config is already at its scale; drop --scale")
    if args.list:
        print("\n".join(load.experiment_ids()))
        return 0
    path = args.experiment
    if path is not None and load.EXPERIMENT_ID.match(path) and not Path(path).exists():
        path = load.experiment_path(path)
    base = None if args.resolved else load.BASE_CONFIG
    config = load.load_config(path, args.overrides, base=base)
    if args.scale:
        config = config_at_scale(config, args.scale, str(path or load.BASE_CONFIG))
    text = load.config_hash(config) + "\n" if args.hash else load.dump_config(config)
    if args.output:
        storage.write_text(args.output, text)
    else:
        sys.stdout.write(text)
    return 0

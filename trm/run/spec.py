"""A run on the command line: `--config`, `--set`, `--data` and `--run-dir`, defined once and resolved once.

`trm train` takes these arguments, and `trm launch` takes them after `--` with the trainer's other options. The
command that gets them resolves the config once; the launcher then writes it to the run dir, and every host trains
that file with the hash the launcher's job carries (`--config-hash`; trm/launch/job.py), so no host resolves or
hashes the config again. A `{config_hash}` in --run-dir becomes the resolved config's hash.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from trm.config import add_config_arguments, config_hash, resolve_config_arguments
from trm.errors import UserError


@dataclass(frozen=True)
class Run:
    """What one run trains: its resolved config (and hash), its dataset and its run dir."""

    config: dict
    config_hash: str
    data: str
    run_dir: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--data", required=True, help="URL of the staged dataset (gs://, file:// or a path)")
    parser.add_argument(
        "--run-dir",
        required=True,
        help="URL of the run directory (created if missing); {config_hash} is replaced by the config's hash",
    )
    parser.add_argument(
        "--config-hash",
        help="the config's hash as the launcher's job file carries it (trm launch sets it; default: computed); "
        "checked against the run dir's config.json",
    )


def resolve(args: argparse.Namespace) -> Run:
    """The run of parsed `add_arguments` arguments, its config resolved."""
    config = resolve_config_arguments(args)
    digest = args.config_hash or config_hash(config)
    return Run(config, digest, args.data, args.run_dir.replace("{config_hash}", digest))


def split(train_args: list[str]) -> tuple[Run, list[str]]:
    """The run that `trm train train_args` trains, resolved, and the trainer's other arguments, unparsed."""
    parser = argparse.ArgumentParser(prog="trm train", add_help=False)
    add_arguments(parser)
    try:
        known, rest = parser.parse_known_args(train_args)
    except SystemExit:  # argparse has printed what is missing
        raise UserError(f"training arguments {train_args}: need --config, --data and --run-dir") from None
    return resolve(known), rest

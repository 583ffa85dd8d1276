"""A run on the command line: `--config`, `--set`, `--data` and `--run-dir`, defined once and resolved once.

`trm train` takes these arguments, and so does `trm launch` by hand (without a job file): its parser parses them
once, and the command that gets them resolves the config once. The launcher then writes it to the run dir, and
every host trains that file with the hash the launcher's job carries (`--config-hash`; trm/launch/job.py), so no
host resolves or hashes the config again. A `{config_hash}` in --run-dir becomes the resolved config's hash.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from trm.config import add_config_arguments, config_hash, resolve_config_arguments


@dataclass(frozen=True)
class Run:
    """What one run trains: its resolved config (and hash), its dataset and its run dir."""

    config: dict
    config_hash: str
    data: str
    run_dir: str


def add_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """The run's arguments; `required=False` where a command may take its run from elsewhere (`trm launch --job`)."""
    add_config_arguments(parser, required)
    parser.add_argument(
        "--data", required=required, help="URL of the staged dataset (gs://, file:// or a path)"
    )
    parser.add_argument(
        "--run-dir",
        required=required,
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

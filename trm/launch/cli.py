"""Start `trm train` on every host of a job and wait for all of them.

    trm launch --backend local --hosts 2 --devices-per-host 2 -- --config C --data D --run-dir R

Everything after `--` is passed to `trm train` on each host unchanged. The exit code is 0 when every host
finished, 42 when the job was preempted (run the same command again to resume), otherwise the first failing
host's code. Backends:
  local   H processes on this machine with D CPU devices each (tests, laptops, the workflow's default)
"""

from __future__ import annotations

import argparse
import importlib

from trm.errors import UserError

# name -> module defining `launch(args, train_args) -> int`. Each backend is one module; add new ones here.
BACKENDS: dict[str, str] = {"local": "trm.launch.local"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="local", help="where hosts run")
    parser.add_argument("--hosts", type=int, default=1, help="number of hosts (processes), default 1")
    parser.add_argument("--devices-per-host", type=int, default=1, help="devices of each host, default 1")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of `trm train`")


def main(args: argparse.Namespace) -> int:
    train_args = list(args.train_args)
    if train_args[:1] == ["--"]:
        train_args = train_args[1:]
    if not train_args:
        raise UserError("no training arguments: trm launch [options] -- --config C --data D --run-dir R")
    if args.hosts < 1:
        raise UserError(f"--hosts {args.hosts}: must be >= 1")
    if args.devices_per_host < 1:
        raise UserError(f"--devices-per-host {args.devices_per_host}: must be >= 1")
    backend = importlib.import_module(BACKENDS[args.backend])
    return backend.launch(args, train_args)

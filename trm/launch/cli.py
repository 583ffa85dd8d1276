"""Start `trm train` on every host of a job and wait for all of them.

    trm launch --backend local --hosts 2 --devices-per-host 2 -- --config C --data D --run-dir R

    trm launch --backend tpu-vm --tpu-slice trm-v4-64-a --tpu-zone us-central2-b --tpu-create \\
        --tpu-code-url gs://BUCKET/code -- --config C --data gs://... --run-dir gs://...

Everything after `--` is passed to `trm train` on each host (the tpu-vm backend resolves the config first and
ships it to the hosts). The exit code is 0 when every host finished, 42 when the job was preempted (run the
same command again to resume), otherwise a failure. Backends:
  local   H processes on this machine with D CPU devices each (tests, laptops, the workflow's default)
  tpu-vm  every host of a Cloud TPU slice, relaunched after preemptions (trm/launch/tpu_vm.py, docs/tpu.md)
"""

from __future__ import annotations

import argparse
import importlib

from trm.errors import UserError

# name -> module defining `launch(args, train_args) -> int`. Each backend is one module; add new ones here.
BACKENDS: dict[str, str] = {"local": "trm.launch.local", "tpu-vm": "trm.launch.tpu_vm"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="local", help="where hosts run")
    parser.add_argument("--hosts", type=int, default=1, help="number of hosts (processes), default 1")
    parser.add_argument("--devices-per-host", type=int, default=1, help="devices of each host, default 1")
    _add_tpu_arguments(parser)
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of `trm train`")


def _add_tpu_arguments(parser: argparse.ArgumentParser) -> None:
    tpu = parser.add_argument_group("tpu-vm backend (docs/tpu.md)")
    tpu.add_argument(
        "--tpu-slice",
        action="append",
        default=[],
        metavar="NAME",
        help="a slice of the pool (repeatable); each job locks one free slice",
    )
    tpu.add_argument("--tpu-zone", help="zone of the slices, e.g. us-central2-b")
    tpu.add_argument("--tpu-project", help="Google Cloud project (default: gcloud's configured one)")
    tpu.add_argument(
        "--tpu-create",
        action="store_true",
        help="create a missing or preempted slice through a queued resource of the same name",
    )
    tpu.add_argument(
        "--tpu-delete-after", action="store_true", help="delete the queued resource when the job ends"
    )
    tpu.add_argument("--tpu-accelerator-type", default="v4-64", help="slice type to create (default v4-64)")
    tpu.add_argument(
        "--tpu-runtime-version",
        default="tpu-ubuntu2204-base",
        help="TPU VM image to create (default %(default)s)",
    )
    tpu.add_argument(
        "--tpu-provisioning",
        choices=["spot", "reserved", "on-demand"],
        default="spot",
        help="how created slices are paid for (default spot)",
    )
    tpu.add_argument("--tpu-code-url", help="gs:// folder of the code wheels, one per code version")
    tpu.add_argument("--tpu-python", default="python3", help="Python 3.11 on the TPU hosts (default python3)")
    tpu.add_argument(
        "--tpu-install-dependencies",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pip-install the pinned dependencies (with jax[tpu]) on the hosts with each new code version",
    )
    tpu.add_argument(
        "--tpu-lock-dir",
        default="~/.cache/trm/tpu-locks",
        help="controller folder of the per-slice lock files (default %(default)s)",
    )
    tpu.add_argument("--tpu-poll-seconds", type=float, default=30.0, help="state poll interval (default 30)")
    tpu.add_argument(
        "--tpu-stale-after",
        type=float,
        default=600.0,
        help="seconds without a trainer heartbeat before a host counts as lost (default 600)",
    )
    tpu.add_argument(
        "--tpu-start-timeout",
        type=float,
        default=1800.0,
        help="seconds the trainers may take to report after a start (default 1800)",
    )
    tpu.add_argument(
        "--tpu-provision-timeout",
        type=float,
        default=24 * 3600.0,
        help="seconds to wait for a slice to become ready (default one day)",
    )
    tpu.add_argument(
        "--tpu-stop-grace",
        type=int,
        default=120,
        help="seconds a stopped trainer may take to checkpoint before it is killed (default 120)",
    )
    tpu.add_argument(
        "--tpu-max-relaunches", type=int, default=10, help="relaunches after preemptions (default 10)"
    )


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

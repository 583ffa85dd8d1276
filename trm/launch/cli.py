"""Start `trm train` on every host of a job and wait for all of them.

    trm launch --backend local --hosts 2 --devices-per-host 2 -- --config C --data D --run-dir R [--set K=V ...]

    trm launch --backend tpu-vm --tpu-slices trm-v4-64-a --tpu-create --tpu-code-url gs://BUCKET/code \\
        -- --config C --data gs://... --run-dir gs://...

After `--` come the arguments of `trm train`. The launcher resolves the run once (trm/run/spec.py), refuses a batch
the job's devices cannot split, writes the resolved config to RUN_DIR/config.json, and starts every host's trainer
on that file with the other arguments unchanged. The workflow passes a config it resolved already. Before writing
anything in the run dir it takes the run's lease (trm/run/lease.py): a second launcher of the same run fails with
one line naming the holder. The exit code is 0 when every host finished, 42 when the job was preempted (run the
same command again to resume), otherwise a failure. Backends:
  local   H processes on this machine with D CPU devices each (tests, laptops, the workflow's default)
  tpu-vm  every host of a Cloud TPU slice, relaunched after preemptions (trm/launch/tpu_vm.py, docs/tpu.md);
          its settings default to config/config.yaml's launch.tpu (trm/launch/tpu_options.py)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib

from trm.config import batch_split_problem
from trm.errors import UserError
from trm.launch import tpu_options
from trm.run import layout, spec
from trm.run.lease import Lease

# name -> module defining `check(args, run)` (bad settings, before anything is written) and
# `launch(args, run, host_args, lease_lost) -> int`, which stops the job's trainers at once when the threading.Event
# `lease_lost` is set (another launcher took the run over). Each backend is one module; add new ones here.
BACKENDS: dict[str, str] = {"local": "trm.launch.local", "tpu-vm": "trm.launch.tpu_vm"}
# Trainer arguments the launcher sets itself on every host.
RESERVED_ARGS = ("--coordinator", "--num-processes", "--process-id", "--distributed-auto")
EXIT_LEASE_LOST = 1  # another launcher took the run over while this one trained it (it says so on stdout)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="local", help="where hosts run")
    parser.add_argument("--hosts", type=int, default=1, help="number of hosts (processes), default 1")
    parser.add_argument("--devices-per-host", type=int, default=1, help="devices of each host, default 1")
    tpu_options.add_arguments(parser)
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
    reserved = [arg for arg in train_args if arg.split("=")[0] in RESERVED_ARGS]
    if reserved:
        raise UserError(f"{reserved[0]}: the launcher sets the multi-host options itself")
    run, other_args = spec.split(train_args)
    if problem := batch_split_problem(run.config["train"], args.hosts * args.devices_per_host):
        raise UserError(f"{problem} (--hosts {args.hosts} x --devices-per-host {args.devices_per_host})")
    backend = importlib.import_module(BACKENDS[args.backend])
    backend.check(args, run)
    lease = Lease(run.run_dir, args.tpu_stale_after_seconds, log)
    # A finished run needs no lease: nothing trains it again.
    with contextlib.nullcontext() if layout.finished(run.run_dir) else lease.held():
        layout.claim(run.run_dir, run.config)  # what every host trains
        code = backend.launch(args, run, [*run.trainer_arguments(), *other_args], lease.lost)
    return EXIT_LEASE_LOST if lease.lost.is_set() else code


def log(message: str) -> None:
    print(f"[launch] {message}", flush=True)

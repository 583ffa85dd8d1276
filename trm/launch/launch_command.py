"""Start `trm train` on every host of a job and wait for all of them (of a canary's job file, `trm canary`).

    trm launch --job results/smoke/jobs/HASH.json [-- --log-every 10]
    trm launch --hosts 2 --devices-per-host 2 --config C --data D --run-dir R [--set K=V ...] [-- --log-every 10]

A job file (trm/launch/job.py) holds everything about one run: its resolved config and hash, the dataset, the
run dir, the test-time steps and the launch settings (backend, hosts, devices per host, the tpu-vm backend's
settings). The workflow writes one per distinct run, RESULTS/SCALE/jobs/<hash>.json (also on a dry run:
`snakemake -n --config experiments=[exp01a]` writes exp01a's), and its train rule runs `trm launch --job FILE`.
After `--` may come `trm train` options that are not part of the run (--log-every, --cache-dir, --wandb), passed
to every host as they are. By hand, the second form launches on the local backend: it takes the run's arguments of
`trm train` (--config, --set, --data, --run-dir, --test-time-steps, --test-time-subset; trm/train/train_command.py
`add_run_arguments`), resolves the config once into the job a job file would hold, and launches that job as
`--job` does.

The launcher refuses a batch the job's devices cannot split and a run dir bound to another dataset than the job's
(RUN_DIR/data.json: trm/train/run_data.py), writes the run's config to RUN_DIR/config.json and
starts every host's trainer on that copy with the hash the job carries. Before writing anything in the run dir
it takes the run's lease (trm/run/lease.py): a second launcher of the same run fails with one line naming the
holder. The exit code is 0 when every host finished, 42 when the job was preempted (run the same command again
to resume), otherwise a failure. SIGINT or SIGTERM stops every host through its checkpoint (exit 42 locally,
128 + the signal on tpu-vm); a job of the workflow stops the same way when Snakemake dies
(trm/run/lifetime.py). Backends:
  local   H processes on this machine with D CPU devices each (tests, laptops, the workflow's default), or D
          of its NVIDIA GPUs each (launch.platform gpu or auto; --platform by hand; profiles/gpu)
  tpu-vm  every host of a Cloud TPU slice, relaunched after preemptions (trm/launch/tpu_vm.py, docs/tpu.md);
          its settings are the job file's `tpu` (the workflow's launch.tpu, trm/launch/tpu_options.py)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
from dataclasses import replace

from trm import storage
from trm.config import batch_split_problem
from trm.errors import UserError, number
from trm.launch import tpu_options
from trm.launch.job import Job, read_job
from trm.platform import LOCAL_PLATFORMS
from trm.run import layout, spec
from trm.run.lease import Lease
from trm.run.lifetime import watch_controller
from trm.train.run_data import check_resumed_data
from trm.train.train_command import add_run_arguments, final_evaluation

# name -> module defining `check(job)` (bad settings, before anything is written) and
# `launch(job, host_args, lease_lost) -> int`, which stops the job's trainers at once when the threading.Event
# `lease_lost` is set (another launcher took the run over). Each backend is one module; add new ones here.
BACKENDS: dict[str, str] = {"local": "trm.launch.local", "tpu-vm": "trm.launch.tpu_vm"}
# Trainer arguments the launcher sets itself on every host.
RESERVED_ARGS = ("--coordinator", "--num-processes", "--process-id", "--distributed-auto")
# The run's arguments (`add_run_arguments`), by their names in the parsed arguments: what a job file gives, so they
# come with no --job, and never after `--`.
RUN_ARGS = {
    "--config": "config",
    "--config-hash": "config_hash",
    "--set": "overrides",
    "--data": "data",
    "--run-dir": "run_dir",
    "--test-time-steps": "test_time_steps",
    "--test-time-subset": "test_time_subset",
    "--test-time-trajectories": "test_time_trajectories",
    "--test-time-noise": "test_time_noise",
}
EXIT_LEASE_LOST = 1  # another launcher took the run over while this one trained it (it says so on stdout)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", help="a job file (see above; the workflow's RESULTS/SCALE/jobs/<hash>.json)")
    parser.add_argument(
        "--hosts", type=number(int, minimum=1), help="without --job: number of hosts (processes), default 1"
    )
    parser.add_argument(
        "--devices-per-host",
        type=number(int, minimum=1),
        help="without --job: devices of each host, default 1",
    )
    parser.add_argument(
        "--platform",
        choices=LOCAL_PLATFORMS,
        help="without --job: what the hosts run on (cpu, the default; gpu: the machine's NVIDIA GPUs; auto)",
    )
    add_run_arguments(
        parser.add_argument_group("without --job: the run, as `trm train` takes it"), required=False
    )
    parser.add_argument(
        "train_args",
        nargs=argparse.REMAINDER,
        help="-- then trainer options that are not the run's (e.g. --log-every)",
    )


def main(args: argparse.Namespace) -> int:
    train_args = list(args.train_args)
    if train_args[:1] == ["--"]:
        train_args = train_args[1:]
    reserved = [arg for arg in train_args if arg.split("=")[0] in RESERVED_ARGS]
    if reserved:
        raise UserError(f"{reserved[0]}: the launcher sets the multi-host options itself")
    if run_args := [arg for arg in train_args if arg.split("=")[0] in RUN_ARGS]:
        where = f"the job file {args.job} gives the run" if args.job else "the run's arguments come before --"
        raise UserError(f"{run_args[0]}: {where}; after -- only trainer options")
    if args.job:
        shape = {
            "--hosts": args.hosts,
            "--devices-per-host": args.devices_per_host,
            "--platform": args.platform,
        }
        if given := [flag for flag, value in shape.items() if value is not None]:
            raise UserError(f"{', '.join(given)}: the job file {args.job} gives the job's shape")
        if given := [flag for flag, name in RUN_ARGS.items() if getattr(args, name) not in (None, "", [])]:
            raise UserError(f"{', '.join(given)}: the job file {args.job} gives the run")
        job = read_job(args.job)
    else:
        job = _job_by_hand(args)
    if problem := batch_split_problem(job.run.config["train"], job.devices):
        raise UserError(f"{problem} (hosts {job.hosts} x devices_per_host {job.devices_per_host})")
    if job.backend not in BACKENDS:
        raise UserError(f"{args.job}: backend {job.backend!r}: one of {', '.join(sorted(BACKENDS))}")
    backend = importlib.import_module(BACKENDS[job.backend])
    backend.check(job)
    check_resumed_data(
        job.run.run_dir, job.run.data
    )  # before the lease: nothing written in another's run dir
    lease = Lease(job.run.run_dir, job.tpu["stale_after_seconds"], log)
    # A finished run needs no lease: nothing trains it again. A canary runs each time it is launched.
    finished = job.kind == "train" and layout.finished(job.run.run_dir)
    with contextlib.nullcontext() if finished else lease.held():
        layout.claim(job.run.run_dir, job.run.config, job.run.config_hash)  # what every host trains
        if job.kind == "canary":
            # What an earlier canary left (page, checkpoint, markers) must not pass for this one's.
            for name in (layout.CANARY, layout.CHECKPOINTS, layout.STATUS, layout.SUCCESS, layout.LAUNCH):
                storage.remove(layout.path(job.run.run_dir, name))
        watch_controller()  # a workflow's job: stop (as on SIGTERM) if Snakemake is killed
        code = backend.launch(job, [*job.host_arguments(), *train_args], lease.lost)
    return EXIT_LEASE_LOST if lease.lost.is_set() else code


def _job_by_hand(args: argparse.Namespace) -> Job:
    """The local job of `--hosts`, `--devices-per-host`, `--platform` and the run's arguments, its config resolved
    once: the job its job file would hold."""
    hosts = 1 if args.hosts is None else args.hosts
    devices_per_host = 1 if args.devices_per_host is None else args.devices_per_host
    if missing := [
        flag for flag in ("--config", "--data", "--run-dir") if getattr(args, RUN_ARGS[flag]) is None
    ]:
        raise UserError(
            f"no {', '.join(missing)}: trm launch --job FILE, or trm launch --config C --data D --run-dir R"
        )
    steps, subset, sampling = final_evaluation(args)
    tpu = tpu_options.launcher_settings(tpu_options.defaults())
    platform = args.platform or "cpu"
    job = Job(spec.resolve(args), steps, "local", hosts, devices_per_host, tpu, subset, platform)
    if sampling is None:
        return job
    return replace(job, test_time_trajectories=sampling.trajectories, test_time_noise=sampling.sigma)


def log(message: str) -> None:
    print(f"[launch] {message}", flush=True)

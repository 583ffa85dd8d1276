"""The tpu-vm backend: one training job on all hosts of a Cloud TPU slice, babysat until it finishes.

Run on the controller (the machine running Snakemake), one launcher per job:

 1. Take a slice from the pool (`--tpu-slice`, repeatable): a lock file per slice on the controller means two
    jobs never share one. With `--tpu-create` a missing slice is created through a queued resource (spot,
    reserved or on-demand), and with `--tpu-delete-after` deleted when the job ends.
 2. Ship the code: a wheel of this checkout's exact sources, in storage under its version (built and uploaded
    only when missing), installed on every host once per version (trm/launch/wheel.py, tpu_host.py).
 3. Write the run's resolved config to RUN_DIR/config.json: every host fetches and trains that one config.
 4. Start `trm train` detached on all hosts (`gcloud compute tpus tpu-vm ssh --worker=all`), with TRM_SLICE.
 5. Poll the run's markers (trm/run/state.py) and the slice's state. When the slice is preempted or a host
    is lost (stale heartbeat), recreate the slice (create mode) or wait for it (pool), and relaunch: the
    trainer resumes from the latest checkpoint. At most `--tpu-max-relaunches` times. Starting that fails
    twice in a row on a slice that stays READY (a broken install) fails the job instead.
 6. SIGTERM or SIGINT (Snakemake cancelling the job) stops the trainer on every host (it checkpoints first),
    marks the run cancelled and exits 128 + signal.

Exit codes: 0 the run finished (RUN_DIR/_SUCCESS), 1 it failed, 42 it was still preempted after the last
relaunch (rerun to resume). Every step is logged with a timestamp on stdout (the Snakemake job log).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trm import storage
from trm.config import BASE_CONFIG, config_hash, load_config
from trm.errors import UserError
from trm.launch import gcloud, tpu_host, wheel
from trm.run import layout
from trm.run import state as runstate
from trm.run.state import EXIT_PREEMPTED

EXIT_FAILED = 1
SSH_TIMEOUT_S = 1800.0  # installing the dependencies on a fresh slice takes minutes
# Starting on a slice that stays READY failed this many times in a row: a broken install or start (a missing
# Python, a bad wheel), not a preemption, so the job fails instead of spending its relaunches.
MAX_START_FAILURES_ON_READY_SLICE = 2
CLOCK_SKEW_S = 30.0  # controller and hosts stamp times with their own clocks
# Trainer arguments the launcher sets itself on every host.
RESERVED_ARGS = ("--coordinator", "--num-processes", "--process-id", "--distributed-auto")


@dataclass(frozen=True)
class TpuOptions:
    """The tpu-vm settings of `trm launch` (see trm/launch/cli.py for each flag's meaning)."""

    slices: tuple[str, ...]
    where: gcloud.Location
    create: bool
    delete_after: bool
    accelerator_type: str
    runtime_version: str
    provisioning: str
    code_url: str
    python: str
    install_dependencies: bool
    lock_dir: Path
    poll_s: float
    stale_after_s: float
    start_timeout_s: float
    provision_timeout_s: float
    stop_grace_s: int
    max_relaunches: int


def options_from_args(args: argparse.Namespace) -> TpuOptions:
    """Check every tpu-vm flag; a bad value is a UserError naming the flag."""
    if not args.tpu_slice:
        raise UserError("--backend tpu-vm needs at least one --tpu-slice NAME (the pool of slices to use)")
    if not args.tpu_zone:
        raise UserError("--backend tpu-vm needs --tpu-zone (e.g. us-central2-b)")
    for name in args.tpu_slice:
        gcloud.check(name, gcloud.NAME, "--tpu-slice")
    gcloud.check(args.tpu_zone, gcloud.ZONE, "--tpu-zone")
    if args.tpu_project:
        gcloud.check(args.tpu_project, gcloud.PROJECT, "--tpu-project")
    gcloud.check(args.tpu_accelerator_type, gcloud.ACCELERATOR, "--tpu-accelerator-type")
    gcloud.check(args.tpu_runtime_version, gcloud.RUNTIME, "--tpu-runtime-version")
    if not args.tpu_code_url or not _is_gcs(storage.check_url(args.tpu_code_url, "--tpu-code-url")):
        raise UserError(f"--tpu-code-url {args.tpu_code_url!r}: must be a gs:// URL the TPU hosts can read")
    for flag, value in (
        ("--tpu-poll-seconds", args.tpu_poll_seconds),
        ("--tpu-stale-after", args.tpu_stale_after),
        ("--tpu-start-timeout", args.tpu_start_timeout),
        ("--tpu-provision-timeout", args.tpu_provision_timeout),
    ):
        if value <= 0:
            raise UserError(f"{flag} {value}: must be > 0 seconds")
    if args.tpu_max_relaunches < 0 or args.tpu_stop_grace < 0:
        raise UserError("--tpu-max-relaunches and --tpu-stop-grace must be >= 0")
    return TpuOptions(
        slices=tuple(args.tpu_slice),
        where=gcloud.Location(args.tpu_zone, args.tpu_project or None),
        create=args.tpu_create,
        delete_after=args.tpu_delete_after,
        accelerator_type=args.tpu_accelerator_type,
        runtime_version=args.tpu_runtime_version,
        provisioning=args.tpu_provisioning,
        code_url=args.tpu_code_url,
        python=args.tpu_python,
        install_dependencies=args.tpu_install_dependencies,
        lock_dir=Path(os.path.expanduser(args.tpu_lock_dir)),
        poll_s=args.tpu_poll_seconds,
        stale_after_s=args.tpu_stale_after,
        start_timeout_s=args.tpu_start_timeout,
        provision_timeout_s=args.tpu_provision_timeout,
        stop_grace_s=args.tpu_stop_grace,
        max_relaunches=args.tpu_max_relaunches,
    )


@dataclass(frozen=True)
class Job:
    """What every host trains: the resolved config, where it lives, and the trainer's other arguments."""

    config: dict
    config_hash: str
    run_dir: str
    host_args: list[str]  # `trm train` arguments after `--config FILE`


def _is_gcs(url: str) -> bool:
    return url.partition("://")[0] in storage.GCS_SCHEMES


def resolve_job(train_args: list[str]) -> Job:
    """Resolve the config of `trm train train_args` here, so the hosts need no repository and agree on it."""
    parser = argparse.ArgumentParser(prog="trm launch --backend tpu-vm -- ", add_help=False)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--data", required=True)
    parser.add_argument("--run-dir", required=True)
    try:
        known, rest = parser.parse_known_args(train_args)
    except SystemExit:
        raise UserError(f"training arguments {train_args}: need --config, --data and --run-dir") from None
    reserved = [arg for arg in rest if arg.split("=")[0] in RESERVED_ARGS]
    if reserved:
        raise UserError(f"{reserved[0]}: the tpu-vm backend sets the multi-host options itself")
    for flag, url in (("--data", known.data), ("--run-dir", known.run_dir)):
        if not _is_gcs(storage.check_url(url, flag)):
            raise UserError(f"{flag} {url}: the tpu-vm backend needs a gs:// URL (TPU hosts share no files)")
    base = None if known.config.endswith(".json") else BASE_CONFIG
    config = load_config(known.config, known.set, base=base)
    digest = config_hash(config)
    run_dir = known.run_dir.replace("{config_hash}", digest)
    return Job(config, digest, run_dir, ["--data", known.data, "--run-dir", run_dir, *rest])


def log(message: str) -> None:
    print(f"[tpu-vm {time.strftime('%Y-%m-%d %H:%M:%S')}] {message}", flush=True)


class Cancelled(Exception):
    """SIGTERM or SIGINT reached the launcher."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def _raise_cancelled(signum: int, _frame) -> None:
    # Further signals are ignored from here: stopping the hosts must not be interrupted halfway.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Cancelled(signum)


@contextlib.contextmanager
def acquire_slice(options: TpuOptions) -> Iterator[str]:
    """Lock a free slice of the pool for this job (waiting while all are taken); yields its name."""
    options.lock_dir.mkdir(parents=True, exist_ok=True)
    waiting_since = None
    while True:
        for name in options.slices:
            handle = open(options.lock_dir / f"{options.where.zone}-{name}.lock", "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                handle.seek(0)
                handle.truncate()
                handle.write(f"{os.getpid()}\n")
                handle.flush()
                yield name
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        if waiting_since is None:
            waiting_since = time.time()
            log(f"every slice of the pool {list(options.slices)} is in use by another job; waiting")
        time.sleep(options.poll_s)


class Babysitter:
    """One job on one slice: start it, watch it, relaunch it after preemptions (see the module docstring)."""

    def __init__(self, options: TpuOptions, job: Job, slice_name: str) -> None:
        self.options = options
        self.job = job
        self.slice = slice_name
        self.attempt = 0
        self.started = False  # trainers may be running on the hosts
        self.start_failures = 0  # in a row, on a slice that stayed READY

    # ------------------------------------------------------------------------------------------- gcloud

    def _run(self, argv: list[str], what: str, timeout: float = SSH_TIMEOUT_S) -> subprocess.CompletedProcess:
        log(f"{what}: {' '.join(argv[:6])} ...")
        done = gcloud.run(argv, timeout)
        for line in (done.stdout + done.stderr).splitlines():
            print(f"    {line}", flush=True)
        return done

    def _ssh(self, script: str, what: str) -> bool:
        done = self._run(gcloud.ssh_all(self.slice, self.options.where, script), what)
        if done.returncode != 0:
            log(f"{what} failed with exit code {done.returncode}")
        return done.returncode == 0

    def _node_state(self) -> str | None:
        return gcloud.state(gcloud.describe_node(self.slice, self.options.where))

    def mark(self, state: str, message: str = "") -> None:
        runstate.write_launch(self.job.run_dir, state, self.slice, self.attempt, message)
        log(f"launch state {state}{': ' + message if message else ''}")

    # ------------------------------------------------------------------------------------------- slice

    def _wait_for(self, describe: list[str], wanted: str, what: str) -> None:
        deadline = time.time() + self.options.provision_timeout_s
        last = object()
        while True:
            state = gcloud.state(describe)
            if state != last:
                log(f"{what} is {state or 'not found'}")
                last = state
            if state == wanted:
                return
            if self.options.create and state in gcloud.QR_GONE:
                raise _SliceLost(f"{what} is {state}")
            if time.time() > deadline:
                raise UserError(f"{what} not {wanted} after {self.options.provision_timeout_s:.0f} s")
            time.sleep(self.options.poll_s)

    def ensure_slice(self) -> None:
        """Return once the slice is READY: created or recreated (create mode) or waited for (pool mode)."""
        where = self.options.where
        if not self.options.create:
            self._wait_for(gcloud.describe_node(self.slice, where), gcloud.NODE_READY, f"slice {self.slice}")
            return
        qr_state = gcloud.state(gcloud.describe_queued_resource(self.slice, where))
        node_state = self._node_state()
        if qr_state is not None and (
            qr_state in gcloud.QR_GONE or node_state not in (None, gcloud.NODE_READY)
        ):
            # A preempted spot slice comes back only by deleting and recreating its queued resource.
            log(f"queued resource {self.slice} is {qr_state}, slice {node_state}: deleting it to recreate")
            self._run(gcloud.delete_queued_resource(self.slice, where), "delete queued resource")
            self._wait_gone()
            qr_state = None
        if qr_state is None:
            argv = gcloud.create_queued_resource(
                self.slice,
                self.slice,
                where,
                self.options.accelerator_type,
                self.options.runtime_version,
                self.options.provisioning,
            )
            if self._run(argv, "create queued resource", timeout=300).returncode != 0:
                raise UserError(f"could not create queued resource {self.slice} (see the log above)")
            self.started = False
        describe = gcloud.describe_queued_resource(self.slice, where)
        self._wait_for(describe, gcloud.QR_ACTIVE, f"queued resource {self.slice}")
        self._wait_for(gcloud.describe_node(self.slice, where), gcloud.NODE_READY, f"slice {self.slice}")

    def _wait_gone(self) -> None:
        deadline = time.time() + self.options.provision_timeout_s
        while gcloud.state(gcloud.describe_queued_resource(self.slice, self.options.where)) is not None:
            if time.time() > deadline:
                raise UserError(f"queued resource {self.slice} still exists after deletion")
            time.sleep(self.options.poll_s)

    def delete_slice(self) -> None:
        self._run(gcloud.delete_queued_resource(self.slice, self.options.where), "delete queued resource")

    # ------------------------------------------------------------------------------------------- the job

    def start(self, version: str, wheel_url: str) -> bool:
        """Install the code on every host (once per version) and start the trainers; False if a step failed."""
        setup = tpu_host.setup_script(
            version,
            wheel_url,
            wheel.wheel_name(version),
            self.options.python,
            self.options.install_dependencies,
        )
        if not self._ssh(setup, f"install code {version} on every host"):
            return False
        self.started = True
        script = tpu_host.start_script(
            version,
            layout.path(self.job.run_dir, layout.CONFIG),
            self.job.config_hash,
            self.job.host_args,
            self.slice,
            self.options.python,
            self.options.stop_grace_s,
        )
        return self._ssh(script, "start trm train on every host")

    def stop(self) -> None:
        """Stop the trainers on every host (they checkpoint on SIGTERM); tolerates a vanished slice."""
        if self.started:
            self._ssh(tpu_host.stop_script(self.options.stop_grace_s), "stop trm train on every host")
            self.started = False

    def watch(self, since: float) -> tuple[str, str]:
        """Poll until the run ends or the job must be relaunched: ("finished"|"failed"|"relaunch", why)."""
        options = self.options
        while True:
            time.sleep(options.poll_s)
            run = runstate.read_run(self.job.run_dir, stale_after_s=options.stale_after_s)
            if run.state == "finished":
                return "finished", ""
            node = self._node_state()
            if node != gcloud.NODE_READY:
                return "relaunch", f"slice {self.slice} is {node or 'gone'}"
            status = run.status
            if status.get("updated_at", 0) < since - CLOCK_SKEW_S:  # nothing yet from this attempt's trainers
                if time.time() - since > options.start_timeout_s:
                    return (
                        "relaunch",
                        f"no status from the trainers {options.start_timeout_s:.0f} s after start",
                    )
                continue
            if status.get("state") == "failed":
                return "failed", status.get("error", "the trainer failed")
            if status.get("state") == "preempted":
                return "relaunch", "the trainers stopped early (preemption notice); checkpoint saved"
            if run.state == "lost":
                return "relaunch", f"a host is lost: {run.detail}"

    def run(self) -> int:
        """The whole job; returns the launcher's exit code."""
        options = self.options
        version, wheel_url = wheel.ensure_uploaded(options.code_url)
        log(f"code {version} at {wheel_url}")
        while True:
            self.attempt += 1
            if runstate.read_run(self.job.run_dir).state == "finished":
                log(f"{self.job.run_dir} already finished")
                return 0
            self.mark("queued", f"waiting for slice {self.slice}")
            try:
                self.ensure_slice()
            except _SliceLost as lost:
                outcome, why = "relaunch", str(lost)
            else:
                self.mark("starting", f"starting trm train on every host of {self.slice}")
                since = time.time()
                if self.start(version, wheel_url):
                    self.start_failures = 0
                    self.mark("running")
                    outcome, why = self.watch(since)
                else:
                    outcome, why = self._start_failed()
            if outcome == "finished":
                self.mark("finished")
                return 0
            self.stop()
            if outcome == "failed":
                self.mark("failed", why)
                return EXIT_FAILED
            if self.attempt > options.max_relaunches:
                self.mark("failed", f"{why}; gave up after {options.max_relaunches} relaunches")
                return EXIT_PREEMPTED
            self.mark("preempted", f"{why}; relaunching (attempt {self.attempt + 1})")

    def _start_failed(self) -> tuple[str, str]:
        """A failed start on a slice that is gone or not READY was a preemption; on a READY slice, a broken
        install or start script, retried once (a transient download error) before the job fails."""
        node = self._node_state()
        if node != gcloud.NODE_READY:
            return "relaunch", f"starting on the hosts failed; slice {self.slice} is {node or 'gone'}"
        self.start_failures += 1
        if self.start_failures >= MAX_START_FAILURES_ON_READY_SLICE:
            return "failed", (
                f"starting on the hosts of {self.slice} failed {self.start_failures} times in a row while the "
                "slice was READY: the install or start script fails (see the hosts' output above)"
            )
        return "relaunch", "starting on the hosts failed (the slice is READY: retrying once)"


class _SliceLost(Exception):
    """The slice's queued resource failed or was suspended while we waited for it."""


def launch(args: argparse.Namespace, train_args: list[str]) -> int:
    """Entry point of the registry in trm/launch/cli.py."""
    options = options_from_args(args)
    job = resolve_job(train_args)
    log(
        f"run {job.run_dir} (config {job.config_hash}), slices {list(options.slices)} in {options.where.zone}"
    )
    layout.claim(job.run_dir, job.config)  # what every host trains
    previous = {sig: signal.signal(sig, _raise_cancelled) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with acquire_slice(options) as name:
            log(f"slice {name} is ours for this job")
            sitter = Babysitter(options, job, name)
            try:
                return sitter.run()
            except Cancelled as cancelled:
                log(f"cancelled by signal {cancelled.signum}: stopping the trainers on every host")
                sitter.stop()
                sitter.mark("cancelled", f"signal {cancelled.signum}")
                return 128 + cancelled.signum
            finally:
                if options.create and options.delete_after:
                    sitter.delete_slice()
    except Cancelled as cancelled:  # while waiting for a free slice
        log(f"cancelled by signal {cancelled.signum} before a slice was free")
        return 128 + cancelled.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

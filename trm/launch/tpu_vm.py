"""The tpu-vm backend: one training job on all hosts of a Cloud TPU slice, babysat until it finishes.

Run on the controller (the machine running Snakemake), one launcher per job, after trm/launch/cli.py has written
the run's resolved config to RUN_DIR/config.json (every host trains that file, read from storage):

 1. Take a slice from the pool (`--tpu-slices A,B`): a lock file per slice on the controller means two
    jobs never share one. With `--tpu-create` a missing slice is created through a queued resource (spot,
    reserved or on-demand), and with `--tpu-delete-after` deleted when the job ends.
 2. Ship the code: a wheel of this checkout's exact sources, in storage under its version (built and uploaded
    only when missing), installed on every host once per version (trm/launch/wheel.py, tpu_host.py).
 3. Start `trm train` detached on all hosts (`gcloud compute tpus tpu-vm ssh --worker=all`), with TRM_SLICE.
 4. Poll the run's markers (trm/run/state.py) and the slice's state. When the slice is preempted or a host
    is lost (stale heartbeat), recreate the slice (create mode) or wait for it (pool), and relaunch: the
    trainer resumes from the latest checkpoint. At most `--tpu-max-relaunches` times. Starting that fails
    twice in a row on a slice that stays READY (a broken install) fails the job instead.
 5. SIGTERM or SIGINT (Snakemake cancelling the job) stops the trainer on every host (it checkpoints first),
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

from trm import storage
from trm.errors import UserError
from trm.launch import gcloud, tpu_host, tpu_options, wheel
from trm.launch.tpu_options import TpuOptions
from trm.run import state as runstate
from trm.run.spec import Run
from trm.run.state import EXIT_PREEMPTED

EXIT_FAILED = 1
SSH_TIMEOUT_S = 1800.0  # installing the dependencies on a fresh slice takes minutes
# Starting on a slice that stays READY failed this many times in a row: a broken install or start (a missing
# Python, a bad wheel), not a preemption, so the job fails instead of spending its relaunches.
MAX_START_FAILURES_ON_READY_SLICE = 2
CLOCK_SKEW_S = 30.0  # controller and hosts stamp times with their own clocks


def _is_gcs(url: str) -> bool:
    return url.partition("://")[0] in storage.GCS_SCHEMES


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
        time.sleep(options.poll_seconds)


class Babysitter:
    """One job on one slice: start it, watch it, relaunch it after preemptions (see the module docstring)."""

    def __init__(self, options: TpuOptions, run: Run, host_args: list[str], slice_name: str) -> None:
        self.options = options
        self.run_dir = run.run_dir
        self.config_hash = run.config_hash
        self.host_args = host_args  # `trm train` arguments: the run dir's resolved config, data, run dir, ...
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
        runstate.write_launch(self.run_dir, state, self.slice, self.attempt, message)
        log(f"launch state {state}{': ' + message if message else ''}")

    # ------------------------------------------------------------------------------------------- slice

    def _wait_for(self, describe: list[str], wanted: str, what: str) -> None:
        deadline = time.time() + self.options.provision_timeout_seconds
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
                raise UserError(f"{what} not {wanted} after {self.options.provision_timeout_seconds:.0f} s")
            time.sleep(self.options.poll_seconds)

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
        deadline = time.time() + self.options.provision_timeout_seconds
        while gcloud.state(gcloud.describe_queued_resource(self.slice, self.options.where)) is not None:
            if time.time() > deadline:
                raise UserError(f"queued resource {self.slice} still exists after deletion")
            time.sleep(self.options.poll_seconds)

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
            self.config_hash,
            self.host_args,
            self.slice,
            self.options.python,
            self.options.stop_grace_seconds,
        )
        return self._ssh(script, "start trm train on every host")

    def stop(self) -> None:
        """Stop the trainers on every host (they checkpoint on SIGTERM); tolerates a vanished slice."""
        if self.started:
            self._ssh(tpu_host.stop_script(self.options.stop_grace_seconds), "stop trm train on every host")
            self.started = False

    def watch(self, since: float) -> tuple[str, str]:
        """Poll until the run ends or the job must be relaunched: ("finished"|"failed"|"relaunch", why)."""
        options = self.options
        while True:
            time.sleep(options.poll_seconds)
            run = runstate.read_run(self.run_dir, stale_after_s=options.stale_after_seconds)
            if run.state == "finished":
                return "finished", ""
            node = self._node_state()
            if node != gcloud.NODE_READY:
                return "relaunch", f"slice {self.slice} is {node or 'gone'}"
            status = run.status
            if status.get("updated_at", 0) < since - CLOCK_SKEW_S:  # nothing yet from this attempt's trainers
                if time.time() - since > options.start_timeout_seconds:
                    return (
                        "relaunch",
                        f"no status from the trainers {options.start_timeout_seconds:.0f} s after start",
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
            if runstate.read_run(self.run_dir).state == "finished":
                log(f"{self.run_dir} already finished")
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


def check(args: argparse.Namespace, run: Run) -> None:
    """Refuse bad tpu-vm settings and run URLs the hosts cannot reach, before anything is written or started."""
    tpu_options.from_arguments(args)
    for flag, url in (("--data", run.data), ("--run-dir", run.run_dir)):
        if not _is_gcs(storage.check_url(url, flag)):
            raise UserError(f"{flag} {url}: the tpu-vm backend needs a gs:// URL (TPU hosts share no files)")


def launch(args: argparse.Namespace, run: Run, host_args: list[str]) -> int:
    """Entry point of the registry in trm/launch/cli.py."""
    options = tpu_options.from_arguments(args)
    log(f"run {run.run_dir} (config {run.config_hash}), slices {list(options.slices)} in {options.zone}")
    previous = {sig: signal.signal(sig, _raise_cancelled) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with acquire_slice(options) as name:
            log(f"slice {name} is ours for this job")
            sitter = Babysitter(options, run, host_args, name)
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

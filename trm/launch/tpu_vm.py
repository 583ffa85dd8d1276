"""The tpu-vm backend: one training job on all hosts of a Cloud TPU slice, babysat until it finishes.

A canary's job (trm/launch/job.py) runs the same way: its hosts run `trm canary`, which writes the markers a
trainer does (status.json, _SUCCESS on a go; "failed" on a no-go). Run on the controller (the machine running
Snakemake), one launcher per job, after trm/launch/launch_command.py has written
the run's resolved config to RUN_DIR/config.json (every host trains that file, read from storage):

 1. Take a slice from the pool (the job file's `tpu.slices`; trm/launch/slice_pool.py): a lock file per slice on the
    controller means two jobs never share one. With `tpu.create` a missing slice is created through a queued
    resource (spot, reserved or on-demand), and with `tpu.delete_after` deleted when the job ends. The
    cloud's states and errors are read in trm/launch/tpu_slice.py and gcloud.py.
 2. Ship the code: a wheel of this checkout's exact sources, in storage under its version (built and uploaded
    only when missing), installed on every host into a Python 3.11 venv made by uv, once per slice and wheel
    (trm/launch/wheel.py, tpu_host.py). A failed set-up fails the job with the hosts' log tail.
 3. Start `trm train` detached on all hosts (`gcloud compute tpus tpu-vm ssh --worker=all`), with TRM_SLICE
    and the distributed start explicit: the coordinator is worker 0's address from the slice's describe, the
    process id each host's worker number from its metadata server.
 4. Poll the run's markers (trm/run/state.py) and the slice's state. When the slice is preempted or a host
    is lost (stale heartbeat), recreate the slice (create mode) or wait for it (pool), and relaunch: the
    trainer resumes from the latest checkpoint. At most `tpu.max_relaunches` times. An ssh start that fails
    twice in a row on a slice that stays READY fails the job instead.
 5. SIGTERM or SIGINT (Snakemake cancelling the job, or Snakemake gone: trm/run/lifetime.py) stops the
    trainer on every host (it checkpoints first), marks the run cancelled and exits 128 + signal. A launcher
    killed outright leaves its trainers running on the slice; the next launch of the run takes that slice first
    and its start script stops them (SIGTERM through the hosts' PID file, SIGKILL after stop_grace_seconds)
    before starting the trainers that resume from their checkpoint.
 6. The run's lease (trm/run/lease.py) is this launcher's for the whole job, across every relaunch and slice
    recreation. Should another launcher take it over (this one silent longer than stale_after_seconds), the
    trainers are killed at once, without a checkpoint or marker, and the job fails: the run is the other's.

Exit codes: 0 the run finished (RUN_DIR/_SUCCESS), 1 it failed, 42 it was still preempted after the last
relaunch (rerun to resume). Every step is logged with a timestamp on stdout (the Snakemake job log).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time

from trm import storage
from trm.errors import UserError
from trm.launch import gcloud, local, slice_pool, tpu_host, tpu_options, wheel
from trm.launch.job import Job
from trm.launch.tpu_options import TpuOptions
from trm.launch.tpu_slice import Slice, SliceLost
from trm.run import state as runstate
from trm.run.spec import Run
from trm.run.state import EXIT_PREEMPTED

EXIT_FAILED = 1
SSH_TIMEOUT_S = 1800.0  # installing the dependencies on a fresh slice takes minutes
# Starting on a slice that stays READY failed this many times in a row (ssh itself failing, not the set-up):
# not a preemption, so the job fails instead of spending its relaunches.
MAX_START_FAILURES_ON_READY_SLICE = 2


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


class Babysitter:
    """One job on one slice: start it, watch it, relaunch it after preemptions (see the module docstring)."""

    def __init__(
        self,
        options: TpuOptions,
        run: Run,
        host_args: list[str],
        slice_name: str,
        hosts: int,
        lease_lost: threading.Event,
        command: str = "train",
    ) -> None:
        self.options = options
        self.command = command  # the `trm` command of the hosts: train, or canary (Job.host_command)
        self.run_dir = run.run_dir
        self.config_hash = run.config_hash
        self.host_args = host_args  # `trm train` arguments: the run dir's resolved config, data, run dir, ...
        self.slice = slice_name
        self.cloud = Slice(slice_name, options, log)
        self.hosts = hosts
        self.attempt = 0
        self.started = False  # trainers may be running on the hosts
        self.start_failures = 0  # in a row, on a slice that stayed READY
        self.setup_error = ""
        self.lease_lost = lease_lost  # set when another launcher took the run over

    # ------------------------------------------------------------------------------------------- gcloud

    def _run(self, argv: list[str], what: str, timeout: float = SSH_TIMEOUT_S) -> subprocess.CompletedProcess:
        log(f"{what}: {' '.join(argv[:6])} ...")
        done = gcloud.run(argv, timeout)
        for line in (done.stdout + done.stderr).splitlines():
            print(f"    {line}", flush=True)
        return done

    def _ssh(self, script: str, what: str) -> subprocess.CompletedProcess:
        done = self._run(gcloud.ssh_all(self.slice, self.options.where, script), what)
        if done.returncode != 0:
            log(f"{what} failed with exit code {done.returncode}")
        return done

    def mark(self, state: str, message: str = "") -> None:
        runstate.write_launch(self.run_dir, state, self.slice, self.attempt, message)
        log(f"launch state {state}{': ' + message if message else ''}")

    # ------------------------------------------------------------------------------------------- the job

    def coordinator(self, node: gcloud.Resource) -> tuple[str, int]:
        """Worker 0's address and the coordinator port, and the number of hosts, from the slice's describe."""
        endpoints = node.endpoints
        if len(endpoints) != self.hosts or not all(endpoints):
            raise UserError(
                f"slice {self.slice} has {len(endpoints)} hosts ({endpoints}); the job wants --hosts {self.hosts}"
            )
        port = self.options.coordinator_port or local.free_port()  # 0: a free port here (the tests' hosts)
        return f"{endpoints[0]}:{port}", len(endpoints)

    def start(self, code: tuple[str, str, str], node: gcloud.Resource) -> str:
        """Set up every host (once per slice and wheel) and start the trainers: "ok", "setup" (the set-up
        failed: the job fails) or "ssh" (a step failed otherwise)."""
        version, wheel_url, sha256 = code
        o = self.options
        key = tpu_host.setup_key(sha256, o.python, o.install_dependencies, o.uv_version)
        setup = tpu_host.setup_script(
            key, wheel_url, wheel.wheel_name(version), o.python, o.install_dependencies, o.uv_version
        )
        done = self._ssh(setup, f"set up code {version} on every host")
        if tpu_host.SETUP_FAILED in done.stdout:
            tail = done.stdout[done.stdout.index(tpu_host.SETUP_FAILED) :]
            self.setup_error = tail.strip()[-2000:]
            return "setup"
        if done.returncode != 0:
            return "ssh"
        self.started = True
        coordinator, processes = self.coordinator(node)
        script = tpu_host.start_script(
            self.config_hash,
            self.host_args,
            self.slice,
            coordinator,
            processes,
            o.stop_grace_seconds,
            self.command,
        )
        return "ok" if self._ssh(script, "start trm train on every host").returncode == 0 else "ssh"

    def stop(self, grace_s: int | None = None) -> None:
        """Stop the trainers on every host (they checkpoint on SIGTERM, killed after `grace_s`, by default
        stop_grace_seconds); tolerates a vanished slice."""
        if self.started:
            grace_s = self.options.stop_grace_seconds if grace_s is None else grace_s
            self._ssh(tpu_host.stop_script(grace_s), "stop trm train on every host")
            self.started = False

    def _status_mark(self) -> tuple[float | None, int | None]:
        """status.json's `updated_at` and `attempt` as the trainers last wrote them (None, None before any)."""
        status = runstate.read_run(self.run_dir).status
        return status.get("updated_at"), status.get("attempt")

    def watch(self, since: float, before: tuple[float | None, int | None]) -> tuple[str, str]:
        """Poll until the run ends, the job must be relaunched or the lease is lost:
        ("finished"|"failed"|"relaunch"|"lost", why). `before` is status.json's stamp and attempt read before
        this attempt's start. A status still stamped so, or still of that attempt, is an earlier attempt's: the
        "preempted" of a quick relaunch on the same slice, or of the trainers a killed launcher left there, which
        this attempt's start script stops (each new trainer counts the attempt up), would otherwise stop the new
        trainers at once or cost a relaunch."""
        options = self.options
        while True:
            if self.lease_lost.wait(options.poll_seconds):
                return "lost", "another launcher took the run over"
            run = runstate.read_run(self.run_dir, stale_after_s=options.stale_after_seconds)
            if run.state == "finished":
                return "finished", ""
            health, detail = self.cloud.health()
            if health == "lost":
                return "relaunch", detail
            if health != "ok":  # unknown (the cloud does not answer) or REPAIRING: keep watching the markers
                log(f"slice {self.slice}: {health} ({detail}); watching the run's markers")
            status = run.status
            stamp_before, attempt_before = before
            earlier = status.get("updated_at") == stamp_before or (
                attempt_before is not None and status.get("attempt") == attempt_before
            )
            if earlier:  # nothing yet from this attempt's trainers
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
            if run.state == "lost" and health != "repairing":  # repairing: wait (bounded) first
                return "relaunch", f"a host is lost: {run.detail}"

    def run(self) -> int:
        """The whole job; returns the launcher's exit code."""
        options = self.options
        code = wheel.ensure_uploaded(options.code_url)
        log(f"code {code[0]} at {code[1]}")
        while True:
            if self.lease_lost.is_set():  # the run is another launcher's: kill ours, write nothing more
                self.stop(grace_s=0)
                return EXIT_FAILED
            self.attempt += 1
            if runstate.read_run(self.run_dir).state == "finished":
                log(f"{self.run_dir} already finished")
                return 0
            self.mark("queued", f"waiting for slice {self.slice}")
            try:
                node = self.cloud.ensure_ready()
                self.coordinator(node)  # the slice's shape matches the job's
            except SliceLost as lost:
                self.started = False
                outcome, why = "relaunch", str(lost)
            except (
                UserError
            ) as err:  # FAILED queued resource, timeouts, permissions, a slice of another shape
                self.mark("failed", str(err))
                return EXIT_FAILED
            else:
                self.mark("starting", f"starting trm train on every host of {self.slice}")
                since, before = time.time(), self._status_mark()
                started = self.start(code, node)
                if started == "ok":
                    self.start_failures = 0
                    self.mark("running")
                    try:
                        outcome, why = self.watch(since, before)
                    except UserError as err:  # a permanent cloud error (permissions revoked, ...)
                        outcome, why = "failed", str(err)
                elif started == "setup" and self.cloud.health()[0] != "lost":  # lost: preempted meanwhile
                    outcome, why = (
                        "failed",
                        f"the set-up failed on the hosts of {self.slice}:\n{self.setup_error}",
                    )
                else:
                    outcome, why = self._start_failed()
            if outcome == "finished":
                self.mark("finished")
                return 0
            if outcome == "lost":
                continue  # stopped at the top of the loop
            self.stop()
            if outcome == "failed":
                self.mark("failed", why)
                return EXIT_FAILED
            if self.attempt > options.max_relaunches:
                self.mark("failed", f"{why}; gave up after {options.max_relaunches} relaunches")
                return EXIT_PREEMPTED
            self.mark("preempted", f"{why}; relaunching (attempt {self.attempt + 1})")

    def _start_failed(self) -> tuple[str, str]:
        """A failed start on a slice that is gone or not READY was a preemption; on a READY slice, ssh or the
        start script failing, retried once before the job fails."""
        health, detail = self.cloud.health()
        if health == "lost":
            return "relaunch", f"starting on the hosts failed; {detail}"
        self.start_failures += 1
        if self.start_failures >= MAX_START_FAILURES_ON_READY_SLICE:
            return "failed", (
                f"starting on the hosts of {self.slice} failed {self.start_failures} times in a row while the "
                "slice was READY: ssh or the start script fails (see the hosts' output above)"
            )
        return "relaunch", "starting on the hosts failed (the slice is READY: retrying once)"


def check(job: Job) -> None:
    """Refuse bad tpu-vm settings and run URLs the hosts cannot reach, before anything is written or started."""
    tpu_options.check(job.tpu, _job_setting)
    for key, url in (("data", job.run.data), ("run_dir", job.run.run_dir)):
        if not _is_gcs(storage.check_url(url, f"the job's {key}")):
            raise UserError(
                f"the job's {key} {url}: the tpu-vm backend needs a gs:// URL (TPU hosts share no files)"
            )


def _job_setting(key: str) -> str:
    return f"the job's tpu.{key}"


def _last_slice_first(slices: tuple[str, ...], run: Run) -> tuple[str, ...]:
    """The pool with the run's last slice first: after a killed launcher its trainers may still run there, and
    the next start on that slice stops them through their PID file (they save a checkpoint) before it resumes."""
    last = runstate.read_run(run.run_dir).launch.get("slice")
    return (last, *(name for name in slices if name != last)) if last in slices else slices


def launch(job: Job, host_args: list[str], lease_lost: threading.Event) -> int:
    """Entry point of the registry in trm/launch/launch_command.py."""
    options, run = tpu_options.check(job.tpu, _job_setting), job.run
    log(f"run {run.run_dir} (config {run.config_hash}), slices {list(options.slices)} in {options.zone}")
    previous = {sig: signal.signal(sig, _raise_cancelled) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        pool = slice_pool.acquire_slice(
            _last_slice_first(options.slices, run), options.zone, options.lock_dir, options.poll_seconds, log
        )
        with pool as name:
            log(f"slice {name} is ours for this job")
            sitter = Babysitter(options, run, host_args, name, job.hosts, lease_lost, job.host_command)
            try:
                return sitter.run()
            except Cancelled as cancelled:
                log(f"cancelled by signal {cancelled.signum}: stopping the trainers on every host")
                sitter.stop()
                sitter.mark("cancelled", f"signal {cancelled.signum}")
                return 128 + cancelled.signum
            finally:
                if options.create and options.delete_after:
                    sitter.cloud.delete()
    except Cancelled as cancelled:  # while waiting for a free slice
        log(f"cancelled by signal {cancelled.signum} before a slice was free")
        return 128 + cancelled.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

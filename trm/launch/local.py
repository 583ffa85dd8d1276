"""The local backend: a multi-host job as H processes on this machine, each with D CPU devices (or D GPUs).

Each process runs `trm train <train args>` (`trm canary` of a canary job) with JAX_PLATFORMS=cpu,
JAX_NUM_CPU_DEVICES=D (on GPUs, with `launch.platform` gpu or auto: JAX_PLATFORMS=cuda and its own D GPUs in
CUDA_VISIBLE_DEVICES), malloc on huge pages (MALLOC_HUGE_PAGES), on CPUs without LLVM's expensive passes
(CPU_COMPILE_FLAG) and, for H > 1, the coordinator 127.0.0.1:<free port>, its process id and short failure
timeouts in TRM_* variables (see trm/run/distributed.py); H = 1 is a plain single-process run. Output is
streamed line by line with a "[host i]" prefix. When a host fails, the others still running FAILED_GRACE_S
later are killed. SIGTERM and SIGINT are forwarded to every host as SIGTERM (a preemption notice: all hosts save
at one step and exit 42). A host that this SIGTERM ends before its trainer took the signal over counts as
stopped (42), not failed; hosts still running STOP_GRACE_S after it are killed (they resume from their previous
checkpoint). The hosts lead their own session and get SIGTERM when the launcher dies, however it dies
(trm/run/lifetime.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trm.errors import UserError
from trm.platform import local_platform, visible_gpus
from trm.run import distributed
from trm.run.lifetime import ENV_LAUNCHER_PID
from trm.run.state import EXIT_PREEMPTED

if TYPE_CHECKING:
    from trm.launch.job import Job

# Short on purpose: on one machine a silent host is dead, and tests must not wait minutes for it.
LOCAL_TIMEOUTS = {
    distributed.ENV_HEARTBEAT_TIMEOUT: "10",
    distributed.ENV_SHUTDOWN_TIMEOUT: "10",
    distributed.ENV_INIT_TIMEOUT: "60",
}
PREEMPTED_GRACE_S = 60.0  # how long the other hosts may take to follow one that stopped with code 42
# How long the other hosts may take to exit on their own after one failed, before they are killed. Hosts that fail
# in setup for one reason (a missing dataset) exit moments apart, and process 0 writes status.json's "failed" with
# the reason; killed at once, it could lose that race to another host. A host blocked in a collective on the
# failed one is killed after the grace.
FAILED_GRACE_S = 10.0
# How long the hosts may take to save and exit after a stop request (the tpu-vm default stop_grace_seconds);
# then they are killed, and resume from their previous checkpoint.
STOP_GRACE_S = 120.0
# glibc's malloc hands XLA:CPU's large per-step buffers back to the kernel after every step, and the next step
# faults them in again page by page (the smoke baseline: 42,700 page faults and 0.07 s of system time in a
# 0.215 s step). With transparent huge pages requested for malloc's own mappings the step faults 300 pages
# and takes 0.15-0.20 s; a hidden-128 float32 step 0.42-0.43 s -> 0.31-0.36 s. Results do not change.
# Needs glibc >= 2.35 and transparent huge pages set to "madvise" or "always" (elsewhere it is ignored).
MALLOC_HUGE_PAGES = ("glibc.malloc.hugetlb", "1")
# XLA:CPU's LLVM spends compile time in passes that matter little to a tiny model's step; with them off, the
# smoke baseline (two threads) compiles its train step in 7.0 s instead of 8.0 and runs in 34.9 s instead of
# 38.7, with a byte-identical final.json (XLA does not reassociate floating-point ops, so the passes do not
# change results). Those are our earlier 2-core machine's figures; on a 2-core AVX-512 one the whole smoke study
# gained about 1% (docs/statistics.md).
CPU_COMPILE_FLAG = "--xla_llvm_disable_expensive_passes=true"


def one_thread_per_job(environ=os.environ) -> None:
    """Give every job started from this process (Snakemake's jobs inherit its environment) an XLA CPU thread pool
    of one thread per device (NPROC=1): Snakemake runs --cores jobs side by side, and a pool per job as wide as
    the machine oversubscribes the cores (measured, one smoke job beside another: 54 CPU-s with the default pool,
    44 with one thread). A user's own NPROC is kept."""
    environ.setdefault(distributed.ENV_XLA_CPU_THREADS, "1")


def with_tunable(tunables: str, name: str, value: str) -> str:
    """A GLIBC_TUNABLES value ("name=value:name=value") with `name` set to `value` unless it already sets it."""
    entries = [entry for entry in tunables.split(":") if entry]
    if any(entry.partition("=")[0] == name for entry in entries):
        return tunables
    return ":".join([*entries, f"{name}={value}"])


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def host_environment(
    base: dict[str, str], hosts: int, devices: int, index: int, port: int, gpus: list[str] | None = None
) -> dict[str, str]:
    """The environment of host `index`: its devices (`devices` CPU devices, or with `gpus`, the machine's GPUs
    to share out, its own `devices` of them) and, for several hosts, how to reach the coordinator."""
    env = dict(base)
    env["GLIBC_TUNABLES"] = with_tunable(env.get("GLIBC_TUNABLES", ""), *MALLOC_HUGE_PAGES)
    if gpus is None:
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_NUM_CPU_DEVICES"] = str(devices)
        if "xla_llvm_disable_expensive_passes" not in env.get("XLA_FLAGS", ""):
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {CPU_COMPILE_FLAG}".strip()
    else:
        env["JAX_PLATFORMS"] = "cuda"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[index * devices : (index + 1) * devices])
        env.pop("JAX_NUM_CPU_DEVICES", None)
    env["PYTHONUNBUFFERED"] = "1"
    for name in (distributed.ENV_DISTRIBUTED, distributed.ENV_COORDINATOR):
        env.pop(name, None)
    if hosts == 1:
        env.pop(distributed.ENV_NUM_PROCESSES, None)
        env.pop(distributed.ENV_PROCESS_ID, None)
        return env
    env[distributed.ENV_COORDINATOR] = f"127.0.0.1:{port}"
    env[distributed.ENV_NUM_PROCESSES] = str(hosts)
    env[distributed.ENV_PROCESS_ID] = str(index)
    for name, value in LOCAL_TIMEOUTS.items():
        env.setdefault(name, value)
    return env


def _stream(index: int, proc: subprocess.Popen, lock: threading.Lock) -> None:
    for line in proc.stdout:
        with lock:
            sys.stdout.write(f"[host {index}] {line}")
            sys.stdout.flush()


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N -> 128 + N, as shells do


def host_gpus(
    platform: str, hosts: int, devices_per_host: int, environ=os.environ, dev: Path = Path("/dev")
) -> list[str] | None:
    """The GPUs to share out among the hosts for `launch.platform` (None: the hosts run on the CPU); a UserError
    when the machine has fewer than the job needs."""
    if local_platform(platform, dev) == "cpu":
        return None
    gpus = visible_gpus(environ, dev)
    if len(gpus) < hosts * devices_per_host:
        raise UserError(
            f"the job needs {hosts} hosts x {devices_per_host} GPUs, and this machine shows {len(gpus)} "
            f"({', '.join(gpus) or 'none'}): lower launch.hosts or launch.devices_per_host"
        )
    return gpus


def run_hosts(
    hosts: int,
    devices_per_host: int,
    train_args: list[str],
    lease_lost: threading.Event | None = None,
    platform: str = "cpu",
    trm_command: str = "train",
) -> int:
    """Run `trm <trm_command> train_args` on `hosts` local processes; 0 if all succeed, 42 if preempted, else a
    failure."""
    gpus = host_gpus(platform, hosts, devices_per_host)
    port = free_port()
    command = [sys.executable, "-m", "trm.cli", trm_command, *train_args]
    environ = dict(os.environ)
    envs = [host_environment(environ, hosts, devices_per_host, index, port, gpus) for index in range(hosts)]
    return run_processes([command] * hosts, envs, lease_lost)


def run_processes(
    commands: list[list[str]], envs: list[dict[str, str]], lease_lost: threading.Event | None = None
) -> int:
    """Run one process per host, stream their output with a host prefix and supervise them (see module doc).
    When `lease_lost` is set (another launcher took the run over) every host is killed at once, without a
    checkpoint: the run's new launcher resumes it from the last one.

    Returns 0 if all succeed, 42 if they stopped on a preemption notice, else the first failing host's code.
    """
    lock = threading.RLock()  # re-entrant: the signal handler below may run while the main thread prints
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    stopping = threading.Event()

    def forward(signum, _frame):
        stopping.set()
        with lock:
            print(f"[launch] signal {signum}: asking every host to save and stop", flush=True)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for index, (command, env) in enumerate(zip(commands, envs, strict=True)):
            if stopping.is_set():
                break
            proc = subprocess.Popen(  # from the main thread: the hosts' parent-death signal is tied to it
                command,
                env={**env, ENV_LAUNCHER_PID: str(os.getpid())},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,  # a terminal's Ctrl-C reaches the launcher only; it forwards SIGTERM
            )
            procs.append(proc)
            thread = threading.Thread(target=_stream, args=(index, proc, lock), daemon=True)
            thread.start()
            threads.append(thread)
        codes, first_failure = _supervise(procs, lock, stopping, lease_lost)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for thread in threads:
            thread.join(timeout=5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    with lock:
        print(f"[launch] host exit codes: {codes}", flush=True)
    if first_failure is not None:
        return codes[first_failure]
    if any(c not in (0, EXIT_PREEMPTED) for c in codes):  # killed while lingering after a preemption
        return next(c for c in codes if c not in (0, EXIT_PREEMPTED))
    return EXIT_PREEMPTED if EXIT_PREEMPTED in codes else 0


def _host_code(proc: subprocess.Popen, stopping: threading.Event) -> int | None:
    """A host's exit code as a shell shows it (None while it runs); 42 for one our forwarded SIGTERM ended."""
    code = proc.poll()
    if code == -signal.SIGTERM and stopping.is_set():  # stopped before its trainer took over the signal
        return EXIT_PREEMPTED
    return None if code is None else _exit_code(code)


def _supervise(
    procs: list[subprocess.Popen],
    lock: threading.Lock,
    stopping: threading.Event,
    lease_lost: threading.Event | None,
) -> tuple[list[int], int | None]:
    """Wait for every host; kill the others when they linger after one failed (FAILED_GRACE_S), after a preemption
    or after a stop request, and at once when the lease is lost.

    Returns every host's exit code and the index of the first host that failed (None if none did).
    """
    first_failure: int | None = None
    failed_at: float | None = None
    preempted_at: float | None = None
    stop_requested_at: float | None = None
    while any(p.poll() is None for p in procs):
        if stopping.is_set() and stop_requested_at is None:
            stop_requested_at = time.time()
        for index, proc in enumerate(procs):
            code = _host_code(proc, stopping)
            if code is None or code == 0:
                continue
            if code == EXIT_PREEMPTED:
                preempted_at = preempted_at or time.time()
            elif first_failure is None:
                first_failure, failed_at = index, time.time()
                with lock:
                    print(
                        f"[launch] host {index} failed with code {code}: stopping the others (killed if still "
                        f"running in {FAILED_GRACE_S:.0f} s)",
                        flush=True,
                    )
        failed = failed_at is not None and time.time() - failed_at > FAILED_GRACE_S
        lingering = preempted_at is not None and time.time() - preempted_at > PREEMPTED_GRACE_S
        overdue = stop_requested_at is not None and time.time() - stop_requested_at > STOP_GRACE_S
        if overdue and any(p.poll() is None for p in procs):
            with lock:
                print(
                    f"[launch] hosts still running {STOP_GRACE_S:.0f} s after the stop request: killed",
                    flush=True,
                )
        lost = lease_lost is not None and lease_lost.is_set()
        if failed or lingering or overdue or lost:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        time.sleep(0.1)
    return [_host_code(p, stopping) for p in procs], first_failure


def check(job: Job) -> None:
    """Before the lease (registry of trm/launch/launch_command.py): the machine has the devices `job.platform`
    asks for. Any storage URL works for processes on this machine."""
    host_gpus(job.platform, job.hosts, job.devices_per_host)


def launch(job: Job, train_args: list[str], lease_lost: threading.Event) -> int:
    """Entry point of the registry in trm/launch/launch_command.py."""
    return run_hosts(job.hosts, job.devices_per_host, train_args, lease_lost, job.platform, job.host_command)

"""Ctrl-C, SIGINT and SIGTERM to the workflow's Snakemake: every running job stops now, through its checkpoint.

Snakemake 9.27 alone (snakemake/scheduling/job_scheduler.py, executors/local.py): SIGTERM sets a "graceful" flag
and waits until the running jobs *finish* (hours of training), then fails with "At least one job did not complete
successfully"; SIGINT raises KeyboardInterrupt in the scheduler, which then waits for the running jobs without
signalling them. Only a terminal's Ctrl-C reached them, because it goes to the whole foreground process group.

`install()`, called from the workflow's `onstart` (which runs after Snakemake installed its own SIGTERM handler),
makes SIGINT and SIGTERM do what a terminal's Ctrl-C does: each job's processes in Snakemake's process group get
SIGINT (a training job's launcher then asks its trainers to save a checkpoint and exit 42; its trainers lead
their own session, see trm/run/lifetime.py), and Snakemake takes its KeyboardInterrupt path, which waits for
the jobs to end and releases its lock. A second signal only repeats the SIGINT to the jobs. `exit_if_interrupted()`,
from `onerror`, then says what happened and exits 128 + the signal's number. Snakemake's `--no-hooks` skips both.

Python runs a signal handler only in the main thread, and only once that thread wakes. The kernel may deliver a
signal to any thread of Snakemake (its job threads wait on their processes); the main thread, waiting for a job
to end, would then run the handler only when the job ends: for a training job, at the end of its run. So the jobs
are stopped by a thread of ours that wakes on every signal (`signal.set_wakeup_fd`), whichever thread got it;
the main thread's handler only raises KeyboardInterrupt.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from trm.run.lifetime import ENV_CONTROLLER_PID

_received: list[int] = []  # every SIGINT/SIGTERM seen, in order
_lock = threading.Lock()
_first_seen = threading.Event()
_raised = False
# How long the main thread's handler waits for the watcher before stopping the jobs itself.
WATCHER_GRACE_S = 0.5


def install() -> None:
    """Make SIGINT and SIGTERM stop every running job of this Snakemake process (see the module docstring), and
    name this process to the jobs' launchers, which stop if it dies (trm/run/lifetime.py)."""
    os.environ[ENV_CONTROLLER_PID] = str(os.getpid())
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C-level handler must never block on a full pipe
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd,), name="interrupt-watch", daemon=True).start()


def _watch(read_fd: int) -> None:
    """Stop the jobs as soon as a signal arrives: the C-level handler writes each signal's number to the pipe."""
    while True:
        for signum in os.read(read_fd, 64):
            if signum in (signal.SIGINT, signal.SIGTERM):
                _stop_jobs(signum)


def _stop_jobs(signum: int) -> None:
    with _lock:
        first = not _received
        _received.append(signum)
    jobs = job_processes()
    for pid in jobs:
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    _first_seen.set()
    name = signal.Signals(signum).name
    if first:
        print(
            f"\n{name}: stopping the running jobs ({len(jobs)} processes get SIGINT); training jobs save a "
            "checkpoint first. Wait for them: rerunning the same command resumes.",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(f"{name}: already stopping; waiting for the jobs to save and exit", file=sys.stderr, flush=True)


def _interrupt(signum: int, _frame) -> None:
    """The main thread's handler: Snakemake's KeyboardInterrupt path, once. The watcher has normally stopped the
    jobs already; if it did not (another library took the wakeup fd), this handler does."""
    global _raised
    if not _first_seen.wait(WATCHER_GRACE_S):
        _stop_jobs(signum)
    if not _raised:
        _raised = True
        raise KeyboardInterrupt


def job_processes(root: int | None = None) -> list[int]:
    """The descendants of process `root` (this one) in its process group: those a terminal's Ctrl-C reaches."""
    root = os.getpid() if root is None else root
    group = os.getpgid(root)
    children: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        pid = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(pid)  # stat fields 4 (ppid) and 5 (process group)
        groups[pid] = int(fields[2])
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        if groups[pid] == group:
            found.append(pid)
    return sorted(found)


def exit_if_interrupted() -> None:
    """After a signal handled by `install`: one line on what to do, and exit 128 + the signal's number."""
    if not _received:
        return
    name = signal.Signals(_received[0]).name
    print(
        f"Interrupted by {name}: the jobs above that stopped were interrupted, not failed (training jobs saved a "
        "checkpoint and exited 42). Rerun the same command to resume them.",
        file=sys.stderr,
        flush=True,
    )
    sys.exit(128 + _received[0])

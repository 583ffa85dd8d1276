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
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from trm.run.lifetime import ENV_CONTROLLER_PID

_received: list[int] = []


def install() -> None:
    """Make SIGINT and SIGTERM stop every running job of this Snakemake process (see the module docstring), and
    name this process to the jobs' launchers, which stop if it dies (trm/run/lifetime.py)."""
    os.environ[ENV_CONTROLLER_PID] = str(os.getpid())
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)


def _interrupt(signum: int, _frame) -> None:
    first = not _received
    _received.append(signum)
    jobs = job_processes()
    for pid in jobs:
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    name = signal.Signals(signum).name
    if first:
        print(
            f"\n{name}: stopping the running jobs ({len(jobs)} processes get SIGINT); training jobs save a "
            "checkpoint first. Wait for them: rerunning the same command resumes.",
            file=sys.stderr,
            flush=True,
        )
        raise KeyboardInterrupt
    print(f"{name}: already stopping; waiting for the jobs to save and exit", file=sys.stderr, flush=True)


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

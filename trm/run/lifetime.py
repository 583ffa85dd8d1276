"""How a training job's processes end together: the workflow's controller, the job's launcher, its trainers.

- Controller -> launcher: SIGINT and SIGTERM to Snakemake reach every running job (trm/study/interrupts.py). A
  launcher whose controller is gone (Snakemake SIGKILLed) stops as if it had received SIGTERM
  (`watch_controller`; the workflow names its controller in TRM_CONTROLLER_PID).
- Launcher -> trainers: a local launcher's trainers lead their own session (a terminal's Ctrl-C reaches the
  launcher only, which forwards SIGTERM), and get SIGTERM from the kernel when their launcher dies, however it
  dies (`die_with_launcher`: PR_SET_PDEATHSIG, Linux). SIGTERM is the trainer's stop path: it saves a
  checkpoint and exits 42, so a killed launcher loses nothing and leaves nothing running.

A TPU host's trainer is started detached on a remote VM (trm/launch/tpu_host.py): the kernel cannot tie it to
the controller. There a restarted launcher stops the previous trainer through the host's PID file (SIGTERM,
SIGKILL after stop_grace_seconds) before it starts the next one, which resumes from the checkpoint.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

ENV_LAUNCHER_PID = "TRM_LAUNCHER_PID"  # set by the local launcher for its trainers
ENV_CONTROLLER_PID = "TRM_CONTROLLER_PID"  # set by the workflow (Snakemake's pid) for its jobs
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
CONTROLLER_POLL_S = 1.0


def die_with_launcher(environ: dict[str, str] = os.environ) -> None:
    """In a trainer started by a local launcher: get SIGTERM when the launcher dies (even by SIGKILL).

    The signal comes when the launcher thread that started this process ends: the launcher starts its hosts from
    its main thread. A launcher that died before this call already gets the same signal here.
    """
    launcher = environ.get(ENV_LAUNCHER_PID)
    if not launcher or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(launcher):
        os.kill(os.getpid(), signal.SIGTERM)


def _running_since(pid: int) -> str | None:
    """The start time (clock ticks after boot) of process `pid` if it runs (not a zombie), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    state, start_time = fields[0], fields[19]  # stat fields 3 and 22; the command name may hold spaces
    return None if state in ("Z", "X") else start_time


def watch_controller(environ: dict[str, str] = os.environ, poll_s: float = CONTROLLER_POLL_S) -> None:
    """In a launcher started by the workflow: SIGTERM this process once the controller is gone (SIGKILLed).

    The start time tells the controller from a later process that got its pid. Linux only (/proc).
    """
    controller = environ.get(ENV_CONTROLLER_PID)
    if not controller or not Path("/proc/self/stat").exists():
        return
    pid = int(controller)
    since = _running_since(pid)

    def watch() -> None:
        while since is not None and _running_since(pid) == since:
            time.sleep(poll_s)
        print(f"[launch] the workflow's controller (pid {pid}) is gone: stopping this job", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="controller-watch", daemon=True).start()

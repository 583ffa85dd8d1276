"""A run's state, from the markers in its run dir: what `trm status` shows and the TPU launcher polls.

Nothing is guessed; every state comes from a file some process wrote:

  status.json   the trainer (process 0): its state, progress and a heartbeat (`updated_at`), written at start,
                with every checkpoint, at the end, and at least every HEARTBEAT_S while training; "failed" with
                the error when it fails, also before training starts (`mark_setup_failed`).
  launch.json   the launcher of a job: waiting for a slice, starting the workers, relaunching after a preemption,
                failed or cancelled, with the slice's name.
  _SUCCESS      the trainer, last of all: the run finished.

`read_run` combines them. A trainer that says "running" but whose heartbeat is older than `stale_after_s` is
"lost": its hosts died without a word (a killed VM, a hang), and the launcher or a rerun must restart it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field

from trm import storage
from trm.config import config_hash
from trm.run import layout

# Exit code of a trainer, and of a job, that stopped early with a checkpoint: run it again to resume.
EXIT_PREEMPTED = 42
HEARTBEAT_S = 60.0  # the trainer refreshes its heartbeat at least this often while it trains

# What the trainer writes in status.json.
TRAINER_STATES = ("running", "preempted", "failed", "finished")
# What a launcher writes in launch.json.
LAUNCHER_STATES = ("queued", "starting", "running", "preempted", "failed", "cancelled", "finished")
# What `read_run` reports.
RUN_STATES = (
    "queued",
    "starting",
    "running",
    "lost",
    "preempted",
    "failed",
    "cancelled",
    "finished",
    "unknown",
)


def _now() -> float:
    return time.time()


def write_status(run_dir: str, status: dict) -> None:
    """Write status.json (the trainer's process 0 only), stamping the heartbeat `updated_at`."""
    if status.get("state") not in TRAINER_STATES:
        raise ValueError(f"trainer state {status.get('state')!r} is not one of {TRAINER_STATES}")
    record = {**status, "updated_at": _now()}
    storage.write_text(layout.path(run_dir, layout.STATUS), json.dumps(record, sort_keys=True))


def mark_setup_failed(run_dir: str, config: dict, error: str, writer: bool) -> None:
    """status.json "failed" with `error` for a trainer that failed before training, so `trm status` and the
    launchers see the reason at once rather than a run dir without a status. Only the writer (process 0) writes,
    and only in a run dir holding this config's config.json (never in another config's run dir). The previous
    status's fields are kept (a resumed run's progress); a failure to write is reported, not raised over `error`."""
    if not writer:
        return
    try:
        if layout.stored_config_hash(run_dir) != config_hash(config):
            return
        previous = _read_json(layout.path(run_dir, layout.STATUS)) or {}
        fields = {
            "config_hash": config_hash(config),
            "slice": os.environ.get("TRM_SLICE") or previous.get("slice"),
        }
        write_status(run_dir, {**previous, **fields, "state": "failed", "error": error[:2000]})
    except Exception as marker_err:  # storage may be what failed
        print(f"could not write status.json: {marker_err}", file=sys.stderr)


def write_launch(run_dir: str, state: str, slice_name: str | None, attempt: int, message: str = "") -> None:
    """Write launch.json: the launcher's view of the job (waiting for a slice, relaunching, cancelled...)."""
    if state not in LAUNCHER_STATES:
        raise ValueError(f"launcher state {state!r} is not one of {LAUNCHER_STATES}")
    record = {
        "state": state,
        "slice": slice_name,
        "attempt": attempt,
        "message": message,
        "updated_at": _now(),
    }
    storage.write_text(layout.path(run_dir, layout.LAUNCH), json.dumps(record, sort_keys=True))


def _read_json(url: str) -> dict | None:
    """The JSON object at `url`; None when the file is missing or unreadable (half-written by a dying host)."""
    try:
        value = json.loads(storage.read_text(url))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


@dataclass
class RunState:
    """One run as `trm status` shows it. `status` and `launch` are the raw markers (empty when absent)."""

    run_dir: str
    state: str
    detail: str = ""
    status: dict = field(default_factory=dict)
    launch: dict = field(default_factory=dict)
    heartbeat_age_s: float | None = None

    @property
    def slice_name(self) -> str | None:
        """The slice of the newer marker: a relaunch may have moved the run to another slice."""
        markers = sorted((self.status, self.launch), key=lambda m: m.get("updated_at", 0), reverse=True)
        return next((m["slice"] for m in markers if m.get("slice")), None)


def run_state(
    status: dict | None, launch: dict | None, finished: bool, now: float, stale_after_s: float | None = None
) -> tuple[str, str, float | None]:
    """(state, detail, heartbeat age) from the markers; the rules are the module docstring's. Without
    `stale_after_s` no heartbeat counts as lost (the launcher's and `trm status`'s threshold:
    launch.tpu.stale_after_seconds)."""
    status, launch = status or {}, launch or {}
    age = now - status["updated_at"] if "updated_at" in status else None
    if finished:
        return "finished", "", age
    launch_state = launch.get("state")
    launch_newer = launch.get("updated_at", 0) > status.get("updated_at", 0)
    # The launcher speaks for the job when it is newer than the trainer: it saw a preemption, is waiting for a
    # slice, is starting the workers of a relaunch, gave up, or was cancelled.
    if launch_state in ("failed", "cancelled") and launch_newer:
        return launch_state, launch.get("message", ""), age
    trainer_state = status.get("state")
    if trainer_state == "failed":
        return "failed", status.get("error", ""), age
    if launch_state in ("queued", "starting", "preempted") and launch_newer:
        return launch_state, launch.get("message", ""), age
    if trainer_state in ("running", "finished"):  # "finished" but no _SUCCESS yet: the last markers are due
        if age is not None and stale_after_s is not None and age > stale_after_s:
            return "lost", f"no heartbeat for {age:.0f} s", age
        return "running", "", age
    if trainer_state == "preempted":
        return "preempted", "checkpoint saved; resumes when relaunched", age
    if launch_state in ("queued", "starting", "running"):
        return launch_state if launch_state != "running" else "starting", launch.get("message", ""), age
    return "unknown", "no status.json", age


def read_run(run_dir: str, now: float | None = None, stale_after_s: float | None = None) -> RunState:
    """The state of the run in `run_dir` (any storage URL), read from its markers."""
    status = _read_json(layout.path(run_dir, layout.STATUS))
    launch = _read_json(layout.path(run_dir, layout.LAUNCH))
    finished = layout.finished(run_dir)
    state, detail, age = run_state(status, launch, finished, _now() if now is None else now, stale_after_s)
    if status is None and state == "unknown" and storage.exists(layout.path(run_dir, layout.STATUS)):
        detail = f"{layout.STATUS} is not a JSON object: half-written by a dying host, or damaged"
    return RunState(run_dir, state, detail, status or {}, launch or {}, age)


class TrainerStatus:
    """status.json as the trainer keeps it: progress, latest evaluation and heartbeat. Inert on hosts other
    than process 0. Elapsed time and the first start carry over from the previous attempt's file on resume.

    `elapsed_s` is the run's wall time over all its attempts: each attempt counts from `attempt_start` (the
    command's start: its set-up holds the devices too) to its last write, so an attempt killed without a word
    misses at most the HEARTBEAT_S since its last heartbeat. It is the run's cost wherever its results are
    collected (final.json keeps it; `trm summarize` reads it)."""

    def __init__(self, run_dir: str, writer: bool, attempt_start: float | None = None, **fields) -> None:
        self.run_dir = run_dir
        self.writer = writer
        previous = (_read_json(layout.path(run_dir, layout.STATUS)) or {}) if writer else {}
        self._elapsed_before = float(previous.get("elapsed_s", 0.0))
        self._attempt_start = _now() if attempt_start is None else attempt_start
        self._last_write = float("-inf")
        self.fields = {
            **fields,
            "started_at": previous.get("started_at", self._attempt_start),
            "attempt": int(previous.get("attempt", 0)) + 1,
            "eval_exact_accuracy": previous.get("eval_exact_accuracy"),
            "eval_step": previous.get("eval_step"),
            "examples_per_s": previous.get("examples_per_s"),
        }

    def record(self, **fields) -> None:
        """Keep `fields` for the next write (cheap: no storage access)."""
        self.fields.update(fields)

    def write(self, state: str, **fields) -> None:
        """Record `fields` and write status.json now with `state`."""
        self.fields.update(fields)
        if not self.writer:
            return
        now = _now()
        write_status(self.run_dir, {**self.fields, "state": state, "elapsed_s": self.elapsed(now)})
        self._last_write = now

    def elapsed(self, now: float | None = None) -> float:
        """The run's wall seconds so far, over every attempt (this one's since its start)."""
        return self._elapsed_before + (_now() if now is None else now) - self._attempt_start

    def heartbeat(self, **fields) -> None:
        """Record `fields`; write a "running" status when the last write is older than HEARTBEAT_S."""
        self.fields.update(fields)
        if _now() - self._last_write >= HEARTBEAT_S:
            self.write("running")

"""The Cloud TPU commands the TPU launcher runs, as argv lists, the checks on every value they carry, and how
their failures are read.

Nothing here goes through a shell on the controller: each command is a list of arguments for `subprocess`.
Values still reach shells (the TPU hosts run `--command`, and gcloud itself is a shell script), so names,
zones and projects must match strict patterns, and anything else sent to a host is quoted with shlex.

Why the gcloud CLI and not the google-cloud-tpu client library: ssh to the hosts needs gcloud anyway (key
propagation, OS Login, `--worker=all`), the user has already authenticated it, and one tool means one set of
credentials to check (trm preflight). What the library would add, typed errors, is done here: every call has
a timeout, and `classify` sorts a failed call into not found, transient (a timeout, network errors, 429 and
5xx, UNAVAILABLE, DEADLINE_EXCEEDED ...: retried, never read as "the slice is gone") or permanent (permission,
authentication, bad argument: the job fails with gcloud's message). An unknown error counts as transient.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trm.errors import UserError

# Google Cloud resource names: lowercase letters, digits and hyphens, starting with a letter.
NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
PROJECT = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
ACCELERATOR = re.compile(r"^v[0-9]+[a-z]*-[0-9]+$")
RUNTIME = re.compile(r"^[a-z0-9][-a-z0-9.]{0,62}$")
# The hosts' Python: a version uv finds or downloads ("3.11"), or an interpreter path (~/ expands on the host).
PYTHON = re.compile(r"^(~/)?[-A-Za-z0-9_./]+$")
VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*$")  # a pinned release, e.g. of uv

# Node states (tpu-vm describe, `state`). READY runs; REPAIRING is waited for (bounded); PREEMPTED, TERMINATED
# and any other state relaunch once a job runs; CREATING, STARTING and RESTARTING are waited for before a start.
NODE_READY = "READY"
NODE_REPAIRING = "REPAIRING"
NODE_COMING = ("CREATING", "STARTING", "RESTARTING", "REPAIRING")
# Queued-resource states (queued-resources describe, `state.state`).
QR_ACTIVE = "ACTIVE"
QR_WAITING = ("CREATING", "ACCEPTED", "PROVISIONING", "WAITING_FOR_RESOURCES")
QR_PREEMPTED = (
    "SUSPENDING",
    "SUSPENDED",
    "DELETING",
)  # the slice is lost: delete (unless deleting) and recreate
QR_FAILED = "FAILED"  # the request failed (quota, bad type, ...): the job fails with the cloud's message
EXIT_TIMEOUT = 124  # a call that timed out, as `timeout` reports it

NOT_FOUND = ("NOT_FOUND", "was not found")
PERMANENT = (
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "INVALID_ARGUMENT",
    "has not been used in project",
    "do not currently have an active account",
    "Reauthentication",
    "gcloud auth login",
)


def check(value: str, pattern: re.Pattern, what: str) -> str:
    """`value` if it matches `pattern`; otherwise a UserError naming the setting and the expected form."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UserError(f"{what} {value!r} is not valid: expected {pattern.pattern}")
    return value


@dataclass(frozen=True)
class Location:
    """Where the slices live. `project` None means gcloud's configured default project."""

    zone: str
    project: str | None = None

    def __post_init__(self) -> None:
        check(self.zone, ZONE, "zone")
        if self.project is not None:
            check(self.project, PROJECT, "project")

    def flags(self) -> list[str]:
        return [f"--zone={self.zone}"] + ([f"--project={self.project}"] if self.project else [])


def _tpus(*args: str) -> list[str]:
    return ["gcloud", "compute", "tpus", *args]


def ssh_all(name: str, where: Location, command: str) -> list[str]:
    """Run the bash `command` on every worker of slice `name`."""
    check(name, NAME, "slice name")
    return _tpus("tpu-vm", "ssh", name, *where.flags(), "--worker=all", f"--command={command}")


def describe_node(name: str, where: Location) -> list[str]:
    """The node as JSON: `state` and `networkEndpoints` (each host's `ipAddress`, in worker order)."""
    check(name, NAME, "slice name")
    return _tpus("tpu-vm", "describe", name, *where.flags(), "--format=json")


def list_nodes(where: Location) -> list[str]:
    """The names of the slices in the zone (also a check that the TPU API answers)."""
    return _tpus("tpu-vm", "list", *where.flags(), "--format=value(name)")


def describe_accelerator_type(accelerator: str, where: Location) -> list[str]:
    """Succeeds when the zone offers slices of this type."""
    check(accelerator, ACCELERATOR, "accelerator type")
    return _tpus("accelerator-types", "describe", accelerator, *where.flags(), "--format=value(type)")


def create_queued_resource(
    qr: str, node: str, where: Location, accelerator: str, runtime: str, provisioning: str
) -> list[str]:
    """Ask for a slice through queued resources; provisioning is "spot", "reserved" or "on-demand"."""
    check(qr, NAME, "queued resource name")
    check(node, NAME, "slice name")
    check(accelerator, ACCELERATOR, "accelerator type")
    check(runtime, RUNTIME, "runtime version")
    flags = {"spot": ["--spot"], "reserved": ["--reserved"], "on-demand": []}
    if provisioning not in flags:
        raise UserError(f"provisioning {provisioning!r}: expected one of {', '.join(flags)}")
    return _tpus(
        "queued-resources",
        "create",
        qr,
        f"--node-id={node}",
        *where.flags(),
        f"--accelerator-type={accelerator}",
        f"--runtime-version={runtime}",
        *flags[provisioning],
    )


def describe_queued_resource(qr: str, where: Location) -> list[str]:
    check(qr, NAME, "queued resource name")
    return _tpus("queued-resources", "describe", qr, *where.flags(), "--format=json")


def delete_queued_resource(qr: str, where: Location) -> list[str]:
    """Delete a queued resource and its slice (without waiting)."""
    check(qr, NAME, "queued resource name")
    return _tpus("queued-resources", "delete", qr, *where.flags(), "--force", "--async", "--quiet")


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run one gcloud command, capturing its output. A call that takes longer than `timeout` seconds is killed
    and returns EXIT_TIMEOUT (a transient failure); a missing gcloud is a UserError."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode(errors="replace") if isinstance(expired.stdout, bytes) else ""
        message = f"ERROR: (trm) gcloud gave no answer within {timeout:.0f} s (timed out)"
        return subprocess.CompletedProcess(argv, EXIT_TIMEOUT, out, message)
    except FileNotFoundError:
        raise UserError("gcloud not found on PATH: install the Google Cloud CLI (docs/tpu.md)") from None


def error_line(stderr: str) -> str:
    """gcloud's own error line without its "ERROR: (gcloud.group.command)" prefix, else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    line = errors[0] if errors else (lines[-1] if lines else "")
    return re.sub(r"^ERROR:\s*(\([^)]*\)\s*)?", "", line)


def classify(done: subprocess.CompletedProcess) -> str:
    """ "ok", "not_found", "permanent" or "transient" (anything unknown: never evidence that a slice is gone)."""
    if done.returncode == 0:
        return "ok"
    if done.returncode == EXIT_TIMEOUT:
        return "transient"
    if any(mark in done.stderr for mark in NOT_FOUND):
        return "not_found"
    if any(mark in done.stderr for mark in PERMANENT):
        return "permanent"
    return "transient"


class CloudError(UserError):
    """A permanent gcloud failure (permission, authentication, bad argument): retrying will not help."""


class CloudUnavailable(Exception):
    """gcloud kept failing transiently (timeouts, network, 429, 5xx) for the whole retry budget."""


@dataclass(frozen=True)
class Retry:
    """How long transient failures of one describe are retried: backoff from `first_s`, doubling to `max_s`,
    for at most `budget_s` in total; each call gets `timeout_s`."""

    timeout_s: float = 120.0
    budget_s: float = 600.0
    first_s: float = 2.0
    max_s: float = 60.0
    log: Callable[[str], None] = field(default=print, compare=False)


@dataclass(frozen=True)
class Resource:
    """What a describe returned: the state and the whole JSON record (None fields when not found)."""

    state: str | None
    record: dict

    @property
    def endpoints(self) -> list[str]:
        """Each host's internal IP address, in worker order (a node's `networkEndpoints`)."""
        return [point.get("ipAddress", "") for point in self.record.get("networkEndpoints", [])]

    @property
    def failure(self) -> str:
        """The cloud's message for a FAILED queued resource (`state.failedData.error.message`)."""
        data = self.record.get("state", {})
        error = data.get("failedData", {}).get("error", {}) if isinstance(data, dict) else {}
        return error.get("message") or json.dumps(data)


def describe(argv: list[str], retry: Retry) -> Resource:
    """Describe a node or queued resource (a `--format=json` describe command): its state, or state None when it
    does not exist. Transient failures are retried with backoff; CloudUnavailable when they last the whole
    budget, CloudError on a permanent failure."""
    started, wait = time.monotonic(), retry.first_s
    while True:
        done = run(argv, retry.timeout_s)
        kind = classify(done)
        if kind == "ok":
            record = json.loads(done.stdout or "{}")
            state = record.get("state")
            if isinstance(state, dict):  # a queued resource: {"state": {"state": "ACTIVE", ...}}
                state = state.get("state")
            return Resource(state or None, record)
        if kind == "not_found":
            return Resource(None, {})
        message = error_line(done.stderr) or f"exit code {done.returncode}"
        if kind == "permanent":
            raise CloudError(f"{' '.join(argv[:5])}: {message}")
        if time.monotonic() - started + wait > retry.budget_s:
            raise CloudUnavailable(f"{' '.join(argv[:5])}: {message} (for {retry.budget_s:.0f} s)")
        retry.log(f"{' '.join(argv[1:5])}: transient failure ({message}); retrying in {wait:.1f} s")
        time.sleep(wait)
        wait = min(wait * 2, retry.max_s)

"""The Cloud TPU commands the TPU launcher runs, as argv lists, and the checks on every value they carry.

Nothing here goes through a shell on the controller: each command is a list of arguments for `subprocess`.
Values still reach shells (the TPU hosts run `--command`, and gcloud itself is a shell script), so names,
zones and projects must match strict patterns, and anything else sent to a host is quoted with shlex.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from trm.errors import UserError

# Google Cloud resource names: lowercase letters, digits and hyphens, starting with a letter.
NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
PROJECT = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
ACCELERATOR = re.compile(r"^v[0-9]+[a-z]*-[0-9]+$")
RUNTIME = re.compile(r"^[a-z0-9][-a-z0-9.]{0,62}$")
PYTHON = re.compile(r"^[-A-Za-z0-9_./]+$")  # the interpreter the hosts run, a name or a path

# Node states (tpu-vm describe) and queued-resource states (queued-resources describe).
NODE_READY = "READY"
QR_ACTIVE = "ACTIVE"
QR_GONE = ("FAILED", "SUSPENDED", "SUSPENDING")


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
    check(name, NAME, "slice name")
    return _tpus("tpu-vm", "describe", name, *where.flags(), "--format=value(state)")


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
    return _tpus("queued-resources", "describe", qr, *where.flags(), "--format=value(state.state)")


def delete_queued_resource(qr: str, where: Location) -> list[str]:
    """Delete a queued resource and its slice (without waiting)."""
    check(qr, NAME, "queued resource name")
    return _tpus("queued-resources", "delete", qr, *where.flags(), "--force", "--async", "--quiet")


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run one gcloud command, capturing its output; a missing gcloud is a UserError."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UserError("gcloud not found on PATH: install the Google Cloud CLI (docs/tpu.md)") from None


def state(argv: list[str], timeout: float = 120) -> str | None:
    """The state a describe command prints, or None when the resource does not exist or cannot be read."""
    try:
        done = run(argv, timeout)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None

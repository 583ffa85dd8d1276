"""The tpu-vm backend's settings, one source for the workflow, its job files and `trm preflight`.

Each setting is a key of the workflow's `launch.tpu`: workflow/schemas/config.schema.yaml says what it means and its
type, config/config.yaml holds its default, and `check` applies the schema and trm/launch/gcloud.py's name
patterns. The workflow checks its settings with `check` at parse time and writes them into each run's job file
(trm/launch/job.py), whose `trm launch --job` checks them again, so a dry run refuses what the launcher would.
`trm preflight` takes some as --tpu-KEY flags (dashes for underscores; --tpu-KEY / --no-tpu-KEY for true or
false; a comma-separated list for the pool of slices), which the workflow writes with `flags`.
"""

from __future__ import annotations

import argparse
import functools
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from trm import storage
from trm.config import CONFIG_DIR
from trm.config.schema import Validator
from trm.errors import UserError, number
from trm.launch import gcloud

WORKFLOW_SCHEMA = CONFIG_DIR.parent / "workflow" / "schemas" / "config.schema.yaml"
WORKFLOW_DEFAULTS = CONFIG_DIR / "config.yaml"


@dataclass(frozen=True)
class TpuOptions:
    """The checked settings of one job (the keys of the workflow's `launch.tpu`)."""

    slices: tuple[str, ...]
    zone: str
    project: str
    create: bool
    delete_after: bool
    accelerator_type: str
    runtime_version: str
    provisioning: str
    code_url: str
    python: str
    install_dependencies: bool
    uv_version: str
    coordinator_port: int
    lock_dir: Path
    poll_seconds: float
    stale_after_seconds: float
    start_timeout_seconds: float
    provision_timeout_seconds: float
    repair_timeout_seconds: float
    gcloud_timeout_seconds: float
    stop_grace_seconds: int
    max_relaunches: int

    @property
    def where(self) -> gcloud.Location:
        return gcloud.Location(self.zone, self.project or None)


@functools.cache
def _settings() -> dict[str, dict]:
    """The schema node of each launcher setting, in TpuOptions' order (`launch.tpu.preflight` is the workflow's)."""
    launch = yaml.safe_load(WORKFLOW_SCHEMA.read_text())["properties"]["launch"]
    nodes = launch["properties"]["tpu"]["properties"]
    return {field.name: nodes[field.name] for field in fields(TpuOptions)}


def defaults() -> dict[str, Any]:
    """config/config.yaml's `launch.tpu`."""
    return yaml.safe_load(WORKFLOW_DEFAULTS.read_text())["launch"]["tpu"]


def flag(key: str) -> str:
    return f"--tpu-{key.replace('_', '-')}"


def add_argument(parser: argparse.ArgumentParser, key: str, default: Any) -> None:
    """The flag of one setting, its help from the schema."""
    node = _settings()[key]
    kind = node.get("type", "string")  # an enum is a string
    words = {"help": node["description"].replace("%", "%%") + " (default: %(default)s)", "default": default}
    if kind == "boolean":
        parser.add_argument(flag(key), action=argparse.BooleanOptionalAction, **words)
    elif kind == "array":
        parser.add_argument(flag(key), type=lambda text: text.split(","), metavar="NAME,...", **words)
    elif kind in ("integer", "number"):  # the schema's bounds, and never nan or inf
        bounds = {
            "minimum": node.get("minimum"),
            "above": node.get("exclusiveMinimum"),
            "maximum": node.get("maximum"),
        }
        parser.add_argument(flag(key), type=number(int if kind == "integer" else float, **bounds), **words)
    else:
        parser.add_argument(flag(key), choices=node.get("enum"), **words)


def launcher_settings(tpu: dict[str, Any]) -> dict[str, Any]:
    """The launcher's keys of a `launch.tpu` mapping (without the workflow's own switch, `preflight`)."""
    return {key: tpu[key] for key in _settings()}


def flags(settings: dict[str, Any]) -> list[str]:
    """The --tpu-KEY flags that give these settings (of `trm preflight`)."""
    args = []
    for key, value in settings.items():
        if key not in _settings():
            continue  # the workflow's own switch (launch.tpu.preflight)
        if isinstance(value, bool):
            args.append(flag(key) if value else f"--no-{flag(key)[2:]}")
        else:
            args += [flag(key), ",".join(value) if isinstance(value, list) else str(value)]
    return args


def check(settings: dict[str, Any], name=lambda key: f"launch.tpu.{key}") -> TpuOptions:
    """Check every setting (`name(key)` names one in a message) and return them as options."""
    node = {"type": "object", "properties": _settings(), "required": list(_settings())}
    for error in Validator(node).iter_errors(settings):
        key = error.absolute_path[0] if error.absolute_path else "?"
        raise UserError(f"{name(key)} {settings.get(key)!r}: {error.message}")
    for slice_name in settings["slices"]:
        gcloud.check(slice_name, gcloud.NAME, name("slices"))
    gcloud.check(settings["zone"], gcloud.ZONE, name("zone"))
    if settings["project"]:
        gcloud.check(settings["project"], gcloud.PROJECT, name("project"))
    gcloud.check(settings["accelerator_type"], gcloud.ACCELERATOR, name("accelerator_type"))
    gcloud.check(settings["runtime_version"], gcloud.RUNTIME, name("runtime_version"))
    gcloud.check(settings["python"], gcloud.PYTHON, name("python"))
    gcloud.check(settings["uv_version"], gcloud.VERSION, name("uv_version"))
    code_url = settings["code_url"]
    if (
        not code_url
        or storage.check_url(code_url, name("code_url")).partition("://")[0] not in storage.GCS_SCHEMES
    ):
        raise UserError(f"{name('code_url')} {code_url!r}: must be a gs:// URL the TPU hosts can read")
    values = {**settings, "slices": tuple(settings["slices"])}
    values["lock_dir"] = Path(os.path.expanduser(settings["lock_dir"]))
    return TpuOptions(**{field.name: values[field.name] for field in fields(TpuOptions)})

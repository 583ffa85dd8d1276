"""Helpers of the tests of the workflow: its Study built from settings as Snakemake would, a copy of the workflow to
edit and run, and a dry run's cost estimates."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import yaml

from trm.study.status import merged_settings
from trm.study.study import Study

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = yaml.safe_load((REPO / "config/config.yaml").read_text())
TPU_PROFILE = yaml.safe_load((REPO / "profiles/tpu-v4-64/study.yaml").read_text())


def _set_keys(changes: dict, prefix: str = "") -> set[str]:
    """Every dotted key `changes` sets, with its parents ("launch", "launch.hosts")."""
    keys = set()
    for key, value in changes.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= _set_keys(value, f"{prefix}{key}.")
    return keys


def study(
    tmp_path: Path,
    changes: dict | None = None,
    *,
    profile: dict | None = None,
    reporting: bool = False,
    compiled: Path | None = None,
) -> Study:
    """The Study of config/config.yaml <- `profile` (a study file) <- `changes` (as from --config), its results and
    storage in `tmp_path`, and the committed compiled figures in `compiled` (default: an empty tmp_path/compiled,
    not the repository's)."""
    changes = copy.deepcopy(changes or {})
    # A deep copy of the result: the Study checks and converts its settings in place.
    settings = merged_settings(
        DEFAULTS, {"results": str(tmp_path / "results"), "storage": str(tmp_path / "storage")}
    )
    settings = copy.deepcopy(merged_settings(merged_settings(settings, profile or {}), changes))
    on_command_line, in_profile = _set_keys(changes), _set_keys(profile or {})

    def source_of(dotted: str) -> str:
        if dotted in on_command_line:
            return "--config"
        return "profiles/tpu-v4-64/study.yaml" if dotted in in_profile else "config/config.yaml"

    return Study(
        settings,
        source_of,
        str(REPO / "workflow/schemas/config.schema.yaml"),
        str(REPO / "config/experiments"),
        str(REPO / "config/groups.yaml"),
        reporting,
        str(compiled or tmp_path / "compiled"),
    )


def copy_workflow(root: Path) -> Path:
    """`root` (created) holding a copy of the workflow and its config, to edit and run in isolation."""
    root.mkdir(parents=True)
    shutil.copy(REPO / "Snakefile", root)
    for folder in ("workflow", "config", "profiles"):
        shutil.copytree(REPO / folder, root / folder)
    return root


def estimates(output: str, part: str) -> dict[str, float]:
    """Per job of a dry run's output: the device-hours on its line labelled `part` (training or evaluation),
    one of the two lines after the job's "train EXP: estimated" line."""
    lines = output.splitlines()
    found = {}
    for i, line in enumerate(lines):
        if ": train " in line and ": estimated on" in line:
            (labelled,) = [x for x in lines[i + 1 : i + 3] if x.strip().startswith(f"{part}:")]
            found[line.split("train ")[1].split(":")[0]] = float(labelled.split(":")[1].split()[0])
    return found

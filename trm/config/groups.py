"""The study's 14 experiment groups (config/groups.yaml): members, baseline, varied keys and main plots."""

from __future__ import annotations

from pathlib import Path

import yaml

from trm.config.load import CONFIG_DIR, EXPERIMENTS_DIR, experiment_ids, schema
from trm.errors import UserError

GROUPS_PATH = CONFIG_DIR / "groups.yaml"
GROUP_FIELDS = ("id", "title", "varies", "members", "baseline", "plots")
PLOT_FIELDS = ("x", "y", "log_x", "kind")
PLOT_KINDS = ("line", "pareto", "curve")
# Quantities a plot may use besides config keys; the analysis code computes them from each run's outputs.
METRICS = (
    "parameter_count",
    "effective_depth",
    "examples_per_second",
    "step_time_s",
    "epoch",
    "mean_halt_steps",
    "halt_steps_variance",
    "test_exact_accuracy",
    "test_exact_accuracy_raw",
    "train_exact_accuracy",
    "train_test_gap",
    "epochs_to_85pct",
)


def config_keys() -> list[str]:
    """Every dotted leaf key of the config schema, e.g. 'arch.hidden_size'."""

    def walk(node: dict, prefix: str) -> list[str]:
        if "properties" not in node:
            return [prefix[:-1]]
        return [key for name, child in node["properties"].items() for key in walk(child, f"{prefix}{name}.")]

    return walk(schema(), "")


def load_groups(path: str | Path = GROUPS_PATH, experiments_dir: str | Path = EXPERIMENTS_DIR) -> list[dict]:
    """Read and check the group table: fields present, names known, every experiment in exactly one group."""
    path = Path(path)
    groups = (yaml.safe_load(path.read_text()) or {}).get("groups")
    if not isinstance(groups, list):
        raise UserError(f"{path}: expected a top-level 'groups' list")
    keys = set(config_keys())
    errors = []
    owner: dict[str, str] = {}
    for n, group in enumerate(groups):
        name = f"{path}: group {group.get('id', n)!r}" if isinstance(group, dict) else f"{path}: group {n}"
        if not isinstance(group, dict) or sorted(group) != sorted(GROUP_FIELDS):
            errors.append(f"{name}: expected exactly the fields {', '.join(GROUP_FIELDS)}")
            continue
        errors += [f"{name}: unknown config key {k!r} in varies" for k in group["varies"] if k not in keys]
        if group["baseline"] not in group["members"]:
            errors.append(f"{name}: baseline {group['baseline']!r} is not a member")
        for member in group["members"]:
            if not member.startswith(group["id"]):
                errors.append(f"{name}: member {member!r} does not start with the group id")
            if member in owner:
                errors.append(f"{name}: member {member!r} already belongs to group {owner[member]!r}")
            owner[member] = group["id"]
        for plot in group["plots"]:
            if not isinstance(plot, dict) or sorted(plot) != sorted(PLOT_FIELDS):
                errors.append(f"{name}: a plot needs exactly the fields {', '.join(PLOT_FIELDS)}")
                continue
            if plot["x"] not in keys | set(METRICS) | {"member"}:
                errors.append(f"{name}: plot x {plot['x']!r} is neither a config key, a metric nor 'member'")
            if plot["y"] not in keys | set(METRICS):
                errors.append(f"{name}: plot y {plot['y']!r} is neither a config key nor a metric")
            if plot["kind"] not in PLOT_KINDS:
                errors.append(f"{name}: plot kind {plot['kind']!r} is not one of {', '.join(PLOT_KINDS)}")
    files = set(experiment_ids(experiments_dir))
    errors += [
        f"{path}: member {m!r} has no file {m}.yaml in {experiments_dir}" for m in sorted(set(owner) - files)
    ]
    errors += [f"{path}: experiment {m!r} belongs to no group" for m in sorted(files - set(owner))]
    if errors:
        raise UserError("\n".join(errors))
    return groups

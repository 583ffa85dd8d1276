"""Helpers of the tests of the workflow and the study: its Study built from settings as Snakemake would (and the
one-line refusal of bad settings), a copy of the workflow to edit and run (`lighten`: one that trains a lighter
model), a dry run's cost estimates and the jobs a run plans, an edited copy of config/groups.yaml, experiments of a
test's own in a copy, a results folder as finished jobs leave it for the table, and a runs table as
`trm aggregate` writes it."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from trm.analysis.aggregate import RUN_TABLE_COLUMNS
from trm.analysis.judge import is_fraction
from trm.config import EXPERIMENTS_DIR, merged
from trm.errors import UserError
from trm.study.groups import GROUPS_PATH
from trm.study.metrics import RUN_METRICS, SAMPLED_METRICS, SUMMARY_METRICS, TEST_TIME_METRICS
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
    compiled: Path | None = None,
    root: Path = REPO,
) -> Study:
    """The Study of config/config.yaml <- `profile` (a study file) <- `changes` (as from --config), its results and
    storage in `tmp_path`, and the committed compiled figures in `compiled` (default: an empty tmp_path/compiled,
    not the repository's); its experiments and groups those of the workflow at `root` (a `copy_workflow`)."""
    changes = copy.deepcopy(changes or {})
    # A deep copy of the result: the Study checks and converts its settings in place.
    settings = merged(DEFAULTS, {"results": str(tmp_path / "results"), "storage": str(tmp_path / "storage")})
    settings = copy.deepcopy(merged(merged(settings, profile or {}), changes))
    on_command_line, in_profile = _set_keys(changes), _set_keys(profile or {})

    def source_of(dotted: str) -> str:
        if dotted in on_command_line:
            return "--config"
        return "profiles/tpu-v4-64/study.yaml" if dotted in in_profile else "config/config.yaml"

    return Study(
        settings,
        source_of,
        str(REPO / "workflow/schemas/config.schema.yaml"),
        str(root / "config/experiments"),
        str(root / "config/groups.yaml"),
        str(compiled or tmp_path / "compiled"),
    )


def copy_workflow(root: Path) -> Path:
    """`root` (created) holding a copy of the workflow and its config, to edit and run in isolation."""
    root.mkdir(parents=True)
    shutil.copy(REPO / "Snakefile", root)
    for folder in ("workflow", "config", "profiles"):
        shutil.copytree(REPO / folder, root / folder)
    return root


# One layer in float32 instead of the baseline's two in bfloat16, and a recursion of 2 x 2 cycles instead of 3 x 6:
# what a workflow test trains when nothing it checks depends on the model's depth or dtype. Compiling the smoke
# recipe's train step was most of these tests' time; XLA compiles the recursion unrolled.
LIGHT_ARCH = {"L_layers": 1, "forward_dtype": "float32", "H_cycles": 2, "L_cycles": 2}


def lighten(root: Path) -> None:
    """The copy of the workflow at `root` trains LIGHT_ARCH: its config/base.yaml's arch, so every experiment and
    group keeps its own keys.

    For tests that run Snakemake in a subprocess in `root` only (dry runs too: `job_stats`): a plan made in the
    test's own process resolves configs from this checkout's config/base.yaml (trm/config/load.py), so its hashes
    would not be the copy's."""
    base = root / "config" / "base.yaml"
    config = yaml.safe_load(base.read_text())
    config["arch"].update(LIGHT_ARCH)
    base.write_text(yaml.safe_dump(config, sort_keys=False))


def add_references(root: Path, experiments: dict[str, dict]) -> None:
    """Experiments of their own in the copy of the workflow at `root` ({id: overrides of config/base.yaml}), each
    a reference of the study (in no group, so that no group's checks apply to it)."""
    for name, config in experiments.items():
        (root / "config" / "experiments" / f"{name}.yaml").write_text(json.dumps(config))
    groups = root / "config" / "groups.yaml"
    listed = "".join(f"  - id: {name}\n    label: {name}\n" for name in experiments)
    groups.write_text(groups.read_text().replace("references:\n", "references:\n" + listed, 1))


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


def job_stats(output: str) -> dict[str, int]:
    """The jobs a Snakemake run (or dry run) planned, per rule: its printed "Job stats" table, without the total."""
    lines = output.splitlines()
    assert "Job stats:" in lines, f"Snakemake planned no jobs:\n{output[-3000:]}"
    start = lines.index("Job stats:") + 3  # the title, the header and its rule
    counts = {}
    for line in lines[start:]:
        rule, _, count = line.partition(" ")
        if rule == "total" or not count.strip().isdigit():
            break
        counts[rule] = int(count)
    return counts


def refused(tmp_path: Path, changes: dict, **kwargs) -> str:
    """The message with which the Study of these settings (as `study` builds it) is refused: one line."""
    with pytest.raises(UserError) as info:
        study(tmp_path, changes, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def groups_file(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of config/groups.yaml (with the experiment files beside it) with one edit."""
    text = GROUPS_PATH.read_text()
    assert old in text
    path = tmp_path / "config" / "groups.yaml"
    path.parent.mkdir()
    path.write_text(text.replace(old, new, 1))
    shutil.copytree(EXPERIMENTS_DIR, path.parent / "experiments")
    return path


def _summary(config_hash: str, accuracy: float, wall_s: float) -> dict:
    """A summary as `trm summarize` writes it: the run's config hash and results (its config is its job file's)."""
    # Distinct values; a fraction stays one.
    metrics = {key: float(n) / (100 if is_fraction(key) else 1) for n, key in enumerate(SUMMARY_METRICS)}
    return {
        "config_hash": config_hash,
        "devices": 2,
        "weights_sha256": f"weights-of-{config_hash}",
        **metrics,
        "wall_time_s": wall_s,
        "test_exact_accuracy": accuracy,
        "epochs_to_85pct": None,  # never reached: not measured
        "curve": [{"epoch": 1.0, "count": 32, "test_exact_accuracy": accuracy, "test_cell_accuracy": 0.5}],
        # 16 test puzzles, as the tests' tables say (--test-puzzles)
        "test_time": [{**dict.fromkeys(TEST_TIME_METRICS, accuracy), "steps": 16, "count": 16}],
        "sampled": [  # K = 1 and 4 at 16 steps, as a smoke run's final evaluation samples them
            {
                **dict.fromkeys(SAMPLED_METRICS, accuracy),
                "steps": 16,
                "count": 16,
                "trajectories": k,
                "sigma": 0.3,
            }
            for k in (1, 4)
        ],
    }


def finished_runs(planned: Study, accuracy: dict[str, float], wall_s: dict[str, float]) -> Path:
    """The study's results folder as its jobs leave it for the table: each run's job file (written at parse time,
    `Study.write_jobs`), and per run id its summary (`wall_s`: its run's wall time)."""
    planned.write_jobs()
    results = Path(planned.results)
    for run_id, value in accuracy.items():
        path = results / "runs" / f"{run_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_summary(planned.plan[run_id].hash, value, wall_s[run_id])))
    return results


def runs_table(rows: pd.DataFrame, group: str = "g") -> pd.DataFrame:
    """`rows` (one per run: its `id` and the metrics a test sets) as `trm aggregate` writes its runs table: with
    each of RUN_TABLE_COLUMNS it lacks (group `group`, not a baseline, an id's rows its seeds 0, 1, ... of one
    configuration, the id, each run's weights its own, not only for the noise floor) and each of RUN_METRICS it lacks,
    not measured (empty)."""
    table = rows.copy()
    if "seed" not in table:
        table["seed"] = table.groupby("id").cumcount()
    made = {
        "group": group,
        "baseline": False,
        "floor_only": False,
        "varied": table["id"],
        "config_key": table["id"],
        "config_hash": [f"{exp}-{seed}" for exp, seed in zip(table["id"], table["seed"], strict=True)],
        "weights_sha256": [f"{exp}-{seed}" for exp, seed in zip(table["id"], table["seed"], strict=True)],
        "run": [
            exp if seed == 0 else f"{exp}~s{seed}"
            for exp, seed in zip(table["id"], table["seed"], strict=True)
        ],
        **dict.fromkeys(RUN_METRICS, float("nan")),
    }
    for column, values in made.items():
        if column not in table:
            table[column] = values
    return table[[*RUN_TABLE_COLUMNS, *(c for c in table.columns if c not in RUN_TABLE_COLUMNS)]]

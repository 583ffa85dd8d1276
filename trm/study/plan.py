"""The study plan the workflow runs: which experiments, their resolved configs at a scale, and their datasets.

Built at parse time by the workflow's Study (trm/study/study.py; no checkpoints: every job is known to a dry run).
Each experiment resolves once, as config/base.yaml <- config/experiments/<id>.yaml, then the scale's rules
(trm/study/scale.py); the workflow writes the result into its run's job file, RESULTS/jobs/<hash>.json
(trm/launch/job.py). Planning all 68 experiments takes about 0.4 s, so every `snakemake` call plans afresh (no
cache that could go stale).
The config hash names the run directory, and (data.train_puzzles, data.num_aug) names the dataset it trains on, so
experiments sharing a dataset (exp04a_1000 and every baseline) share one build.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trm import storage
from trm.config import (
    EXPERIMENTS_DIR,
    batch_split_problem,
    config_hash,
    experiment_ids,
    load_config,
    validate_config,
)
from trm.errors import UserError
from trm.study.groups import GROUPS_PATH, REFERENCE_GROUP, load_groups, load_references, varies_errors
from trm.study.scale import at_scale, scale_of


@dataclass(frozen=True)
class PlannedRun:
    """One run of the study: an experiment resolved at a scale, or one of its replicates (`id` EXP~sK: train.seed
    + K). Experiments with equal configs plan equal hashes, and so share one trained run (Study.distinct_runs)."""

    id: str
    group: str
    path: Path  # config/experiments/<id>.yaml
    config: dict  # resolved: base <- experiment file, then the scale's rules
    hash: str  # config_hash(config): names the run directory, so experiments with equal configs share one run
    replicate: int = 0  # k of replicate k (train.seed + k; id EXP~sK); 0: the experiment's own run

    @property
    def experiment(self) -> str:
        """The experiment id this run is a replicate of (its own id for replicate 0)."""
        return experiment_of(self.id)

    @property
    def dataset(self) -> str:
        return dataset_name(self.config)


# A replicate's id: EXP~s1, EXP~s2, ... (`~` appears in no experiment id: EXPERIMENT_ID in trm/config).
REPLICATE_MARK = "~s"


def experiment_of(run_id: str) -> str:
    """The experiment of a run id: EXP for EXP and for its replicates EXP~sK."""
    return run_id.partition(REPLICATE_MARK)[0]


def replicate_of(exp: PlannedRun, k: int) -> PlannedRun:
    """Replicate k of an experiment: its config with train.seed + k (initialisation, data order, halting draws),
    so its own hash and run dir; two experiments with equal configs still share each seed's run."""
    config = copy.deepcopy(exp.config)
    config["train"]["seed"] += k
    return PlannedRun(f"{exp.id}{REPLICATE_MARK}{k}", exp.group, exp.path, config, config_hash(config), k)


def seedless_hash(config: dict) -> str:
    """The hash of a config without train.seed: equal for the replicates of one configuration, so the noise floor
    can pool them (the table's `config_key`)."""
    config = copy.deepcopy(config)
    del config["train"]["seed"]
    return config_hash(config)


def dataset_name(config: dict) -> str:
    """Name of the dataset a config trains on, e.g. 'p1000-a1000' (training puzzles, augmentations)."""
    return f"p{config['data']['train_puzzles']}-a{config['data']['num_aug']}"


def parse_dataset_name(name: str) -> tuple[int, int]:
    """(train_puzzles, num_aug) of a dataset name made by `dataset_name`."""
    puzzles, aug = name.removeprefix("p").split("-a")
    return int(puzzles), int(aug)


def _choose(requested: str | list[str], known: list[str], what: str, source: str) -> list[str]:
    if requested == "all":
        return list(known)
    unknown = [name for name in requested if name not in known]
    if unknown:
        hints = [
            f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
            for name in unknown
            for close in [difflib.get_close_matches(name, known, n=1)]
        ]
        raise UserError(
            f"{source}: unknown {what} {', '.join(hints)}; allowed: all, or a list of {', '.join(known)}"
        )
    return list(requested)


def plan_study(
    scale: str,
    experiments: str | list[str] = "all",
    groups: str | list[str] = "all",
    experiments_dir: str | Path = EXPERIMENTS_DIR,
    groups_path: str | Path = GROUPS_PATH,
    source: str = "config/config.yaml",
    checked: bool = False,
) -> list[PlannedRun]:
    """The selected experiments (members of the selected groups, among the selected ids) in group order.
    `checked`: an earlier call checked the whole study (its notes and `varies`), so only the selected resolve."""
    table = load_groups(groups_path, experiments_dir)
    group_of = {member: group["id"] for group in table for member in group["members"]}
    references = [ref["id"] for ref in load_references(groups_path, experiments_dir, table)]
    known = experiment_ids(experiments_dir)
    ungrouped = [e for e in known if e not in group_of and e not in references]
    stray = [] if experiments == "all" else [e for e in experiments if e in ungrouped]
    if stray:
        exp_id = stray[0]
        raise UserError(
            f"{source}: experiment {exp_id!r} ({Path(experiments_dir) / exp_id}.yaml) belongs to no group of "
            f"{groups_path}; add it to a group's members there to run it (each experiment is plotted with its group)"
        )
    for exp_id in [] if checked else ungrouped:
        print(
            f"note: {Path(experiments_dir) / exp_id}.yaml belongs to no group of {groups_path}, so the study does "
            "not run it; add it to a group's members there",
            file=sys.stderr,
        )
    chosen_groups = _choose(groups, [g["id"] for g in table], "groups", f"{source}: groups")
    chosen_ids = set(_choose(experiments, known, "experiments", f"{source}: experiments"))
    selected = [
        member
        for group in table
        if group["id"] in chosen_groups
        for member in group["members"]
        if member in chosen_ids
    ]
    # The references run with any selection of groups: every group's plot draws them.
    selected += [ref for ref in references if ref in chosen_ids]
    group_of.update(dict.fromkeys(references, REFERENCE_GROUP))
    if not selected:
        raise UserError(
            f"{source}: no experiment is both in experiments={experiments} and in a group of groups={groups}"
        )
    # Every member resolves (0.4 s for the 67), so that `varies` holds for the whole study.
    members = [] if checked else [m for m in group_of if m not in references]
    paper = {m: load_config(Path(experiments_dir) / f"{m}.yaml") for m in members}
    errors = [] if checked else varies_errors(table, paper, load_config(), groups_path, experiments_dir)
    if errors:
        raise UserError("\n".join(errors))
    plan = []
    for exp_id in selected:
        path = Path(experiments_dir) / f"{exp_id}.yaml"
        config = config_at_scale(paper.get(exp_id) or load_config(path), scale, str(path))
        plan.append(PlannedRun(exp_id, group_of[exp_id], path, config, config_hash(config)))
    return plan


def config_at_scale(paper: dict, scale: str, source: str) -> dict:
    """The config the study trains for an experiment's resolved (paper) config at `scale`, validated: its hash
    names the run dir. `source` names the experiment file in errors."""
    pool = scale_of(scale).pool
    if pool is None:
        return paper
    config = validate_config(at_scale(paper, scale), f"{source} at the {scale} scale")
    if config["data"]["train_puzzles"] > pool.train:
        raise UserError(
            f"{source}: data.train_puzzles {paper['data']['train_puzzles']} needs "
            f"{config['data']['train_puzzles']} {scale} puzzles, more than the pool's {pool.train}"
        )
    return config


def run_dir_of(storage_root: str, scale: str, run_hash: str) -> str:
    """The run dir of a run (`PlannedRun.hash`) of the study at `scale` below its `storage` setting."""
    return storage.join(storage_root, scale, "runs", run_hash)


def stage_receipt(results: str, storage_url: str, dataset: str) -> str:
    """The workflow's local receipt of `dataset` staged below `storage_url` (the study's STORAGE/SCALE), in the
    results folder `results` (RESULTS/SCALE). It stands for a copy in that storage, so its path names the storage
    (a digest of the URL, which the receipt also holds): after a change of storage there is no receipt, and the
    dataset is staged there again, whatever Snakemake remembers of earlier runs."""
    digest = hashlib.sha256(storage_url.encode()).hexdigest()[:12]
    return os.path.join(results, "staged", digest, f"{dataset}.txt")


def check_batches(plan: list[PlannedRun], devices: int, where: str) -> None:
    """Refuse at plan time the experiments the job's devices cannot train, by the trainer's own rule
    (`batch_split_problem`). `where` names the settings that give the device count."""
    problems = [
        (exp, problem) for exp in plan if (problem := batch_split_problem(exp.config["train"], devices))
    ]
    if not problems:
        return
    lines = [f"{exp.path}: {problem} ({where})" for exp, problem in problems[:3]]
    more = f" (and {len(problems) - 3} more experiments)" if len(problems) > 3 else ""
    raise UserError("; ".join(lines) + more + ": choose a batch that divides, or another device count")


class PlannedStudy(Protocol):
    """What the costs read of a study (trm/study/study.py's Study, which builds its Costs): its settings, plan and
    results folder, and each job's shape. Declared here, so that the costs (trm/study/costs.py) need not import the Study."""

    config: dict
    scale: str
    backend: str
    results: str
    experiments_dir: str
    compiled_dir: str
    plan: dict[str, PlannedRun]
    floor_only: list[str]
    references: list[str]
    selected_groups: list[str]
    datasets: list[str]
    test_puzzles: int
    test_time_steps: list[int]
    test_time_subset: int | None
    test_time_trajectories: list[int]

    def distinct_runs(self) -> list[str]: ...
    def first_with_same_run(self, exp_id: str) -> str: ...
    def job_launch(self, exp_id: str | None) -> dict: ...
    def job_devices(self, exp_id: str | None) -> int: ...
    def run_url(self, exp_id: str) -> str: ...

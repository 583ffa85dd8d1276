"""The study the workflow runs, as plain Python: its checked settings, plan, jobs, estimates, commands and messages.

workflow/rules/common.smk builds one `Study` from Snakemake's `config` at parse time and the rules look things up
in it; every job is known then (no checkpoints), so a dry run shows the whole study. Building it:

 1. checks the settings (config/config.yaml, a profile's study file, `--config`; trm/study/settings.py), the
    storage URLs and folders that reach commands and TPU hosts, and the tpu-vm launcher's settings; each bad
    setting is one line naming where it was set (`source_of`);
 2. plans the selected experiments at the scale (trm/study/plan.py) and checks that each job's devices
    (launch.*, or the experiment's launch.per_experiment entry) split its batches;
 3. estimates each run's accelerator-hours (trm/study/costs.py), which the dry run prints.

Each experiment runs `replicates.SCALE` seeds: replicate k (id EXP~sK, k >= 1) is the experiment's config with
train.seed + k, planned as a run of its own; replicate 0 is the experiment itself (id EXP).
A selection (not every experiment) also plans the runs of the study's floor set that it did not select, whose
seeds measure the noise floor, and writes its table, verdicts and plots in a folder of its own
(trm/study/selection.py): `floor_only` names those runs, `analysis` the folder.
Experiments with the same resolved config (every group's baseline) share one run: the first with that config
hash trains it, the others only collect it. Each distinct run has one job file, RESULTS/jobs/<hash>.json
(trm/launch/job.py), written by `write_jobs` before the first job (never by a dry run); the train rule runs
`trm launch --job FILE`, and the aggregate rule reads each run's config there.

Shell commands: settings are shared files (profiles, study files), so none may become shell code. Commands are
argument lists, never pre-joined text, and every placeholder of a rule's shell command is quoted with `:q`
(tests/test_workflow_quoting.py checks both).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Collection
from dataclasses import replace

from trm.checkout import checkout_path
from trm.config import config_value, experiment_ids
from trm.errors import UserError
from trm.launch import slice_ledger, tpu_options
from trm.launch.job import Job, job_path
from trm.run.spec import Run
from trm.storage import GCS_SCHEMES, PlaceholderBucket, check_url
from trm.storage import join as url_join
from trm.study.costs import COMPILED_FIGURES, Costs
from trm.study.groups import REFERENCE_GROUP, load_groups, load_references
from trm.study.plan import (
    PlannedRun,
    check_batches,
    experiment_of,
    parse_dataset_name,
    plan_study,
    replicate_of,
    run_dir_of,
    seedless_hash,
    stage_receipt,
)
from trm.study.scale import scale_of
from trm.study.selection import SELECTIONS, floor_set, selection_name
from trm.study.settings import SourceOf, check_settings, load_schema

# Commands run with the `trm` of the environment running Snakemake, so an unactivated venv works
# (`.venv/bin/snakemake`). Named by its folder, not by the interpreter's name: `python` and `python3` of one
# venv must give the same command, or Snakemake sees changed params and reruns everything.
TRM = os.path.join(os.path.dirname(sys.executable), "trm")
DEFAULT_SETTINGS = checkout_path("config/config.yaml")
# The rules whose jobs reach `storage` or a TPU slice (workflow/rules/): only a run of one needs a real bucket and,
# on TPU, the preflight.
CLOUD_RULES = ("stage_dataset", "train", "canary")


def _check_argument(value: str, key: str) -> None:
    """A setting that becomes a command-line argument: one line, and not read as an option."""
    if any(ord(char) < 32 for char in value):
        raise UserError(f"{key} {value!r} contains a control character (a newline?)")
    if value.startswith("-"):
        raise UserError(f"{key} {value!r} starts with '-', which commands read as an option: write ./{value}")


def _check_results(value: str, key: str) -> None:
    _check_argument(value, key)
    if "{" in value or "}" in value:
        raise UserError(f"{key} {value!r}: {{ and }} are Snakemake wildcards in output paths")


def _check_gcs(url: str, key: str) -> None:
    """The tpu-vm backend's storage: the hosts share no files, so only gs:// (an empty code_url: STORAGE/code)."""
    if url and check_url(url, key).partition("://")[0] not in GCS_SCHEMES:
        raise UserError(f"{key} {url!r}: the tpu-vm backend needs a gs:// URL (TPU hosts share no files)")


class Study:
    """The workflow's settings `config` (Snakemake's, checked and converted in place), planned and estimated.

    `source_of(dotted)` names where a setting was set, for error messages; `compiled_dir` holds the committed
    compiled figures (trm/study/costs.py). Every error is a UserError of one line per problem.
    """

    def __init__(
        self,
        config: dict,
        source_of: SourceOf,
        schema_path: str,
        experiments_dir: str = checkout_path("config/experiments"),
        groups_path: str = checkout_path("config/groups.yaml"),
        compiled_dir: str = COMPILED_FIGURES,
    ) -> None:
        # One readable line for a bad setting (unknown key, wrong type), naming where it was set; nested
        # `--config` values (`--config 'launch={hosts: 2}'`, read as strings) are converted to the schema's types.
        check_settings(config, load_schema(schema_path), source_of)
        self.config, self.source_of, self.experiments_dir = config, source_of, experiments_dir
        self.groups_path = groups_path
        self.compiled_dir = compiled_dir
        # A storage URL with the docs' placeholder bucket: fine for a dry run, which reaches no storage; refused
        # before the first job that would (`check_before_jobs`).
        self.placeholder_storage: str | None = None
        self.scale, self.backend = config["scale"], config["launch"]["backend"]
        self._check_locations()
        tpu = config["launch"]["tpu"]
        self.tpu = {**tpu, "code_url": tpu["code_url"] or url_join(config["storage"], "code")}
        if self.backend == "tpu-vm":  # the launcher's own checks (names gcloud accepts, timeouts)
            self._with_source("launch.tpu", tpu_options.check, self.tpu)
        experiments = plan_study(
            self.scale,
            config["experiments"],
            config["groups"],
            experiments_dir,
            groups_path,
            "workflow config",
        )
        table = load_groups(groups_path, experiments_dir)
        references = [ref["id"] for ref in load_references(groups_path, experiments_dir, table)]
        # Each experiment, then its replicates (ids EXP~s1, ...): replicate 0 is the experiment's own run.
        self.plan: dict[str, PlannedRun] = self._with_replicates(experiments, table)
        floor = self._floor_runs(floor_set(table, references), table)
        self.floor_only = list(floor)  # not selected: in the table only for the noise floor
        self.plan.update(floor)
        selection = selection_name([e.id for e in experiments], table, references)
        self._check_launch(experiments_dir)
        self.results = os.path.join(config["results"], self.scale)
        # The table, verdicts and plots: the whole study's in RESULTS, a selection's in its own folder.
        self.selection = selection
        self.analysis = (
            self.results if selection is None else os.path.join(self.results, SELECTIONS, selection)
        )
        self.storage = url_join(config["storage"], self.scale)
        scale = scale_of(self.scale)
        self.pool, self.test_puzzles = scale.pool, scale.test_puzzles  # the pool: None at the paper scale
        self.test_time_steps: list[int] = config["test_time_steps"][self.scale]
        self.test_time_subset: int | None = config["test_time_subset"][self.scale]  # None: the whole split
        self.test_time_trajectories: list[int] = config["test_time_trajectories"][self.scale]  # []: none
        self.test_time_noise: float = config["test_time_noise"][self.scale]
        selected = [exp for exp in self.plan.values() if exp.id not in floor]
        self.selected_groups = list(dict.fromkeys(e.group for e in selected if e.group != REFERENCE_GROUP))
        self.references = [exp.id for exp in selected if exp.group == REFERENCE_GROUP and not exp.replicate]
        self.datasets = sorted({exp.dataset for exp in self.plan.values()})
        self.first_with_hash: dict[str, str] = {}
        for exp in self.plan.values():
            self.first_with_hash.setdefault(exp.hash, exp.id)
        self.costs = Costs(self)

    # ------------------------------------------------------------------------------------------- checks

    def _with_source(self, key: str, check: Callable, *args) -> None:
        """Run `check(*args)`; its UserError becomes one line starting with where setting `key` was set. A placeholder
        bucket is kept (`placeholder_storage`), not raised: a dry run reaches no storage."""
        try:
            check(*args)
        except PlaceholderBucket as err:
            self.placeholder_storage = self.placeholder_storage or f"{self.source_of(key)}: {err}"
        except UserError as err:
            raise UserError(f"{self.source_of(key)}: {err}") from None

    def _check_locations(self) -> None:
        """Storage URLs and folders reach commands and TPU hosts: check them where a dry run sees them."""
        checks = [("storage", check_url), ("results", _check_results), ("source", _check_argument)]
        checks.append(("launch.tpu.lock_dir", _check_argument))
        if self.backend == "tpu-vm":
            checks += [("storage", _check_gcs), ("launch.tpu.code_url", _check_gcs)]
        for key, check in checks:
            self._with_source(key, check, config_value(self.config, key), key)

    def _check_launch(self, experiments_dir: str) -> None:
        """Every launch.per_experiment entry names an experiment and has valid TPU settings, and every job's
        devices split its experiment's batches."""
        own = self.config["launch"]["per_experiment"]
        if unknown := sorted(set(own) - set(experiment_ids(experiments_dir))):
            where = self.source_of("launch.per_experiment")
            raise UserError(f"{where}: launch.per_experiment: no experiment {', '.join(unknown)}")
        for exp_id in own if self.backend == "tpu-vm" else []:
            self._with_source("launch", tpu_options.check, self.job_launch(exp_id)["tpu"])
        for devices in sorted({self.job_devices(exp_id) for exp_id in self.plan}):
            where = (
                f"{devices} devices (launch.hosts x launch.devices_per_host, or the experiment's "
                f"launch.per_experiment) from {self.source_of('launch.hosts')}, scale {self.scale}"
            )
            same = [exp for exp in self.plan.values() if self.job_devices(exp.id) == devices]
            self._with_source("launch", check_batches, same, devices, where)

    def _with_replicates(self, experiments: list[PlannedRun], table: list[dict]) -> dict[str, PlannedRun]:
        """Each experiment's runs by id: the experiment, then its replicates EXP~s1, ... (`_replicate_counts`)."""
        counts = self._replicate_counts(experiments, table)
        return {
            run.id: run
            for exp in experiments
            for run in [exp, *(replicate_of(exp, k) for k in range(1, counts[exp.id]))]
        }

    def _floor_runs(self, wanted: list[str], table: list[dict]) -> dict[str, PlannedRun]:
        """The runs of the floor set `wanted` (experiment ids, with their replicates) that measure the noise
        floor, a configuration with 2 or more seeds (a lone seed measures no spread), and that no run of the plan
        shares: one id per distinct run, in the whole study's order; none when the plan holds every one."""
        if all(exp_id in self.plan for exp_id in wanted):
            return {}
        planned = {exp.hash for exp in self.plan.values()}
        where = (self.experiments_dir, self.groups_path, "workflow config")
        runs = plan_study(self.scale, wanted, "all", *where, checked=True)  # the selection's plan checked it
        runs = list(self._with_replicates(runs, table).values())
        seeds: dict[str, set[int]] = {}
        for run in runs:
            seeds.setdefault(seedless_hash(run.config), set()).add(run.config["train"]["seed"])
        floor = {}
        for run in runs:
            if run.hash not in planned and len(seeds[seedless_hash(run.config)]) >= 2:
                planned.add(run.hash)
                floor[run.id] = run
        return floor

    def _replicate_counts(self, experiments: list[PlannedRun], table: list[dict]) -> dict[str, int]:
        """Seeds per experiment from replicates.SCALE: its `experiments` entry, else the larger of its group's
        entry (or `seeds`) and, for a group's baseline member, `baseline`. Unknown ids are refused."""
        key = f"replicates.{self.scale}"
        setting = self.config["replicates"][self.scale]
        known = {
            "groups": ([g["id"] for g in table], self.groups_path),
            "experiments": (experiment_ids(self.experiments_dir), self.experiments_dir),
        }
        for field, (ids, listed_in) in known.items():
            if unknown := sorted(set(setting[field]) - set(ids)):
                where = self.source_of(f"{key}.{field}")
                raise UserError(
                    f"{where}: {key}.{field}: no {field[:-1]} {', '.join(unknown)} in {listed_in}"
                )
        baselines = {g["baseline"] for g in table}
        return {
            exp.id: setting["experiments"].get(exp.id)
            or max(
                setting["groups"].get(exp.group, setting["seeds"]),
                setting["baseline"] if exp.id in baselines else 1,
            )
            for exp in experiments
        }

    # ------------------------------------------------------------------------------------------- jobs

    def job_launch(self, exp_id: str | None) -> dict:
        """An experiment's job shape and TPU pool: launch.*, with its launch.per_experiment entry over it."""
        launch = self.config["launch"]
        own = launch["per_experiment"].get(exp_id and experiment_of(exp_id), {})
        return {
            "hosts": own.get("hosts", launch["hosts"]),
            "devices_per_host": own.get("devices_per_host", launch["devices_per_host"]),
            "tpu": {**self.tpu, **own.get("tpu", {})},
        }

    def job_devices(self, exp_id: str | None) -> int:
        launch = self.job_launch(exp_id)
        return launch["hosts"] * launch["devices_per_host"]

    def first_with_same_run(self, exp_id: str) -> str:
        """The experiment whose job trains and evaluates the run `exp_id` shares (itself when it is the first)."""
        return self.first_with_hash[self.plan[exp_id].hash]

    def distinct_runs(self) -> list[str]:
        """The first run id of each distinct run (one per config hash): the runs whose jobs train."""
        return list(self.first_with_hash.values())

    def dataset_url(self, dataset: str) -> str:
        return url_join(self.storage, "datasets", dataset)

    def stage_receipt(self, dataset: str) -> str:
        """The local receipt of `dataset` staged in this study's storage (a pattern with dataset="{dataset}")."""
        return stage_receipt(self.results, self.storage, dataset)

    def run_url(self, exp_id: str) -> str:
        return run_dir_of(self.config["storage"], self.scale, self.plan[exp_id].hash)

    def job_file(self, exp_id: str) -> str:
        """The job file of an experiment's run (shared by the experiments of that run)."""
        return job_path(self.results, self.plan[exp_id].hash)

    def job(self, exp_id: str) -> Job:
        """The job that trains an experiment's run, as its run's first experiment launches it."""
        first = self.first_with_same_run(exp_id)
        exp, launch = self.plan[first], self.job_launch(first)
        run = Run(exp.config, exp.hash, self.dataset_url(exp.dataset), self.run_url(first))
        tpu = tpu_options.launcher_settings(launch["tpu"])
        hosts, devices = launch["hosts"], launch["devices_per_host"]
        steps, subset = tuple(self.test_time_steps), self.test_time_subset
        job = Job(run, steps, self.backend, hosts, devices, tpu, subset, self.config["launch"]["platform"])
        if not self.test_time_trajectories:  # no sampling: the job file as before sampling existed
            return job
        sampling = tuple(self.test_time_trajectories), self.test_time_noise
        return replace(job, test_time_trajectories=sampling[0], test_time_noise=sampling[1])

    def job_digest(self, exp_id: str) -> str:
        """A digest of the job file of an experiment's run: its train job runs again when it changes."""
        return hashlib.sha256(self.job(exp_id).to_json().encode()).hexdigest()[:16]

    def write_jobs(self) -> None:
        """Each distinct run's job file, rewritten only when its content changes (the workflow's onstart)."""
        for first in self.distinct_runs():
            self.job(first).write(self.job_file(first))

    # ------------------------------------------------------------------------------------------- commands

    def jax_cache_env(self) -> list[str]:
        """A persistent XLA cache: the study's many same-shaped configs (every group's baseline) compile once."""
        return [
            "env",
            f"JAX_COMPILATION_CACHE_DIR={os.path.join(self.config['results'], '.cache', 'jax')}",
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0",
        ]

    def train_command(self, exp_id: str) -> list[str]:
        """The argv of the one command that trains an experiment's run: its job file, launched."""
        return [*self.jax_cache_env(), TRM, "launch", "--job", self.job_file(exp_id)]

    def check_before_jobs(self, rules: Collection[str]) -> None:
        """Before the first job of a real run (the Snakefile's onstart; a dry run runs none), given the rules of the
        jobs it will run. When one reaches storage or a slice (`CLOUD_RULES`): a placeholder bucket is refused, and
        a TPU study runs `trm preflight` (gcloud, credentials, the bucket, the TPU API, the slices and ssh, each
        failure with its fix; launch.tpu.preflight: false skips it). Compiling or building datasets needs neither."""
        if not set(rules) & set(CLOUD_RULES):
            return
        if self.placeholder_storage:
            raise UserError(self.placeholder_storage)
        if self.backend == "tpu-vm" and self.config["launch"]["tpu"]["preflight"]:
            if subprocess.run(self.preflight_command()).returncode != 0:
                raise UserError("trm preflight failed (above): fix what it names, then rerun")

    def preflight_command(self) -> list[str]:
        """`trm preflight` with the study's storage and the pool's place, as an argument list."""
        pool = {key: self.tpu[key] for key in ("zone", "project", "slices", "create", "accelerator_type")}
        return [TRM, "preflight", "--storage", self.config["storage"], *tpu_options.flags(pool)]

    def report_leftover_slices(self) -> None:
        """At the study's end (Snakefile onsuccess/onerror): the slices its launchers created that still exist, over
        the lock folders of every pool (each job's merged launch.tpu); a tpu-vm study only."""
        pools = [self.job_launch(exp_id)["tpu"] for exp_id in [None, *self.plan]]
        slice_ledger.report_study(self.backend, pools)

    def run_summary(self, exp_id: str) -> str:
        """The local summary of an experiment's run (`trm summarize`): the train job's one output, what the table
        reads of the run's results (its config: the job file)."""
        return os.path.join(self.results, "runs", f"{exp_id}.json")

    def trained_first(self, exp_id: str) -> list[str]:
        """Nothing, or the summary of the first experiment sharing this one's run: its job trains the run, after
        which this one's job only summarises it."""
        first = self.first_with_same_run(exp_id)
        return [] if first == exp_id else [self.run_summary(first)]

    def dataset_source(self) -> list[str]:
        """The pool's files (a local scale's datasets' input); nothing at the paper scale (a URL or a local path)."""
        pool = os.path.join(self.results, "pool")
        return [os.path.join(pool, f"{split}.csv") for split in ("train", "test")] if self.pool else []

    def pool_flags(self) -> list:
        """`trm smoke-pool`'s flags for the scale's pool (its output folder aside)."""
        pool = self.pool
        assert pool is not None, "only a local scale has a pool"
        blanks = [] if pool.blanks is None else ["--blanks", pool.blanks]
        return [
            "--board",
            pool.board,
            "--train",
            pool.train,
            "--test",
            pool.test,
            *blanks,
            "--seed",
            self.config["seed"],
        ]

    def build_flags(self, dataset: str) -> list:
        puzzles, num_aug = parse_dataset_name(dataset)
        source = os.path.join(self.results, "pool") if self.pool else self.config["source"]
        return [
            "--source",
            source,
            "--subsample-size",
            puzzles,
            "--num-aug",
            num_aug,
            "--seed",
            self.config["seed"],
        ]

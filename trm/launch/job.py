"""A job file: one run and how to launch it, everything `trm launch --job FILE` needs.

The workflow writes one per distinct run, RESULTS/jobs/<config hash>.json (`job_path`; trm/study/study.py), from
which its train rule runs `trm launch --job FILE`; it is the one copy of a run's config outside its run dir, which
the results table reads too (trm/analysis/aggregate.py). A job file is canonical JSON with these keys:

  config            the run's resolved config (what `trm config EXPERIMENT` prints, at the study's scale)
  config_hash       its hash (trm.config.config_hash), computed once by whoever wrote the file, then carried
  data              URL of the staged dataset
  run_dir           URL of the run directory
  test_time_steps   the supervision step counts of the final evaluation (trm/train/test_time.py), may be []
  test_time_subset  the test puzzles those counts are scored on (`trm train --test-time-subset`), null: all
  test_time_trajectories, test_time_noise   the final evaluation's sampled recursion on the same counts and
                    puzzles: K trajectories per puzzle for each K, at that noise sd (trm/train/sampled.py);
                    both absent without sampling
  backend           local or tpu-vm (trm/launch/launch_command.py)
  hosts, devices_per_host   the job's shape
  platform          what local hosts run on: cpu, gpu or auto (launch.platform; trm/platform.py)
  tpu               the tpu-vm backend's settings: the workflow's launch.tpu keys (trm/launch/tpu_options.py),
                    with the experiment's launch.per_experiment entry merged in and code_url filled in
  kind              only in a canary's job file: "canary" (the workflow's `canary` target, trm/study/canary_job.py):
                    every host runs `trm canary` on the config instead of training it, and run_dir is the
                    canary's folder (its checkpoint and canary.json). A training job's file has no `kind`, so the
                    files of existing studies (and the jobs Snakemake keys on their digests) stay as they were.

The launcher writes the config into the run dir (config.json) and starts every host's trainer on that copy, with
the hash the job carries (`Job.host_arguments`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from trm import storage
from trm.config import validate_config
from trm.errors import UserError
from trm.platform import LOCAL_PLATFORMS
from trm.run import layout
from trm.run.spec import Run

KEYS = (
    "config",
    "config_hash",
    "data",
    "run_dir",
    "test_time_steps",
    "test_time_subset",
    "backend",
    "hosts",
    "devices_per_host",
    "platform",
    "tpu",
)
# What every host of a job runs: `trm train` (no `kind` in the file) or `trm canary`.
KINDS = ("train", "canary")


# Only in the job file of a run whose final evaluation samples (so the others' files, and digests, are as before).
SAMPLING_KEYS = ("test_time_trajectories", "test_time_noise")


def job_path(results: str, config_hash: str) -> str:
    """The job file of the run with `config_hash` in the (local) results folder of one scale, RESULTS/SCALE."""
    return os.path.join(results, "jobs", f"{config_hash}.json")


@dataclass(frozen=True)
class Job:
    """One training job: its run (config, hash, data, run dir), test-time steps and launch settings."""

    run: Run
    test_time_steps: tuple[int, ...]
    backend: str
    hosts: int
    devices_per_host: int
    tpu: dict  # launch.tpu's launcher settings, merged (see the module docstring)
    test_time_subset: int | None = None
    platform: str = "cpu"  # of the local backend's hosts (trm.platform.LOCAL_PLATFORMS)
    test_time_trajectories: tuple[int, ...] = ()
    test_time_noise: float | None = None
    kind: str = "train"  # KINDS: the `trm` command every host runs

    @property
    def host_command(self) -> str:
        """The `trm` command every host runs: train, or canary."""
        return self.kind

    @property
    def devices(self) -> int:
        return self.hosts * self.devices_per_host

    def to_json(self) -> str:
        record = {
            "config": self.run.config,
            "config_hash": self.run.config_hash,
            "data": self.run.data,
            "run_dir": self.run.run_dir,
            "test_time_steps": list(self.test_time_steps),
            "test_time_subset": self.test_time_subset,
            "backend": self.backend,
            "hosts": self.hosts,
            "devices_per_host": self.devices_per_host,
            "platform": self.platform,
            "tpu": self.tpu,
        }
        if self.test_time_trajectories:
            record |= {
                "test_time_trajectories": list(self.test_time_trajectories),
                "test_time_noise": self.test_time_noise,
            }
        if self.kind != "train":
            record["kind"] = self.kind
        return json.dumps(record, sort_keys=True, indent=2, allow_nan=False) + "\n"

    def write(self, path: str) -> None:
        """Write the job file at `path` when it does not hold this job already: an unchanged file keeps its time,
        so Snakemake reruns no job for it."""
        text = self.to_json()
        if not storage.exists(path) or storage.read_text(path) != text:
            storage.write_text(path, text)  # atomic: a reader never sees half a file

    def host_arguments(self) -> list[str]:
        """`trm train` arguments of every host: the run dir's copy of the config, with the hash the job carries;
        of a canary job, `trm canary`'s: that config, the data, and the canary's folder as --out."""
        if self.kind == "canary":
            config = layout.path(self.run.run_dir, layout.CONFIG)
            return ["--config", config, "--data", self.run.data, "--out", self.run.run_dir]
        args = [
            "--config",
            layout.path(self.run.run_dir, layout.CONFIG),
            "--config-hash",
            self.run.config_hash,
            "--data",
            self.run.data,
            "--run-dir",
            self.run.run_dir,
        ]
        if self.test_time_steps:
            args += ["--test-time-steps", ",".join(map(str, self.test_time_steps))]
        if self.test_time_subset is not None:
            args += ["--test-time-subset", str(self.test_time_subset)]
        if self.test_time_trajectories:
            args += ["--test-time-trajectories", ",".join(map(str, self.test_time_trajectories))]
            args += ["--test-time-noise", repr(self.test_time_noise)]
        return args


def read_job(path: str) -> Job:
    """The job of the file at `path`; a UserError naming the file and the field when it is not a job file."""
    record = storage.read_json(
        path,
        "job file not found (the workflow writes RESULTS/SCALE/jobs/<hash>.json)",
        "rerun snakemake (not a dry run), which writes it again before its first job",
    )
    if not isinstance(record, dict) or sorted(set(record) - {*SAMPLING_KEYS, "kind"}) != sorted(KEYS):
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise UserError(f"{path}: a job file has the keys {', '.join(KEYS)} (and kind); found {found}")
    job_kind = record.get("kind", "train")
    if job_kind not in KINDS:
        raise UserError(f"{path}: kind {job_kind!r}: one of {', '.join(KINDS)}")
    if job_kind == "canary" and record["test_time_steps"]:
        raise UserError(f"{path}: a canary job evaluates nothing: test_time_steps must be []")
    kinds = {"config_hash": str, "data": str, "run_dir": str, "backend": str, "tpu": dict, "hosts": int}
    kinds["devices_per_host"] = int
    words = {str: "a string", int: "an integer", dict: "a mapping"}
    for key, kind in kinds.items():
        if not isinstance(record[key], kind) or isinstance(record[key], bool):
            raise UserError(f"{path}: {key} {record[key]!r} is not {words[kind]}")
    for key in ("hosts", "devices_per_host"):
        if record[key] < 1:
            raise UserError(f"{path}: {key} {record[key]}: must be >= 1")
    steps = record["test_time_steps"]
    if not isinstance(steps, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in steps
    ):
        raise UserError(f"{path}: test_time_steps {steps!r}: expected a list of positive integers")
    subset = record["test_time_subset"]
    if subset is not None and (not isinstance(subset, int) or isinstance(subset, bool) or subset < 1):
        raise UserError(f"{path}: test_time_subset {subset!r}: expected a positive integer or null")
    trajectories, noise = record.get("test_time_trajectories", []), record.get("test_time_noise")
    if not isinstance(trajectories, list) or not all(
        isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in trajectories
    ):
        raise UserError(
            f"{path}: test_time_trajectories {trajectories!r}: expected a list of positive integers"
        )
    if trajectories and (not isinstance(noise, int | float) or isinstance(noise, bool) or not noise >= 0):
        raise UserError(f"{path}: test_time_noise {noise!r}: expected a number >= 0")
    if record["platform"] not in LOCAL_PLATFORMS:
        raise UserError(f"{path}: platform {record['platform']!r}: one of {', '.join(LOCAL_PLATFORMS)}")
    config = validate_config(record["config"], source=f"{path}: config")
    run = Run(config, record["config_hash"], record["data"], record["run_dir"])
    shape = record["backend"], record["hosts"], record["devices_per_host"], record["tpu"]
    sampling = tuple(trajectories), float(noise) if trajectories else None
    return Job(run, tuple(steps), *shape, subset, record["platform"], *sampling, job_kind)

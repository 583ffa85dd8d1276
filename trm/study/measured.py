"""This machine's measured runs, for the local plan: what a run's steps took here, and which runs have finished.

The local plan (trm/study/costs.py) estimates a run's hours from the runs this results folder has measured, as the
TPU plan does from compiled steps: the results tables of the scale (RESULTS/table.csv and every selection's,
RESULTS/selections/*/table.csv) give each finished run's training step time (`step_time_s`, the median over its
train records), its training FLOP rate, its wall time, and, by difference, the time of the job outside its training
steps and evaluations (start-up, imports, compilation, checkpoints). A run is then estimated as

    training:    its steps x the median step time of the measured runs of its step's shape
                 (trm/launch/accelerators.py step_config, and the job's devices), else its training FLOPs at the
                 median measured FLOP rate per device
    evaluation:  its evaluation FLOPs at the FLOP rate of those same runs
    start-up:    the mean measured time outside steps and evaluations, per job (the mean: the estimate of the
                 measured runs themselves then adds up to their measured time, where their steps are their own)

Without a measured run, the plan falls back to the FLOPs at the assumed utilization and says so. Everything read
is a local file (tables, job files, summaries; a run dir's _SUCCESS only where storage is local), so planning
imports no JAX and reads no bucket.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import statistics
from dataclasses import dataclass

from trm import storage
from trm.launch.accelerators import step_config, step_hash
from trm.launch.job import job_path
from trm.run import layout
from trm.study.selection import SELECTIONS

# The table's columns a measurement reads (trm/study/metrics.py RUN_METRICS).
COLUMNS = (
    "config_hash",
    "steps",
    "step_time_s",
    "examples_per_second",
    "train_flops_per_example_step",
    "run_flops",
    "wall_time_s",
    "accelerator_hours",
)


# Where `trm canary` keeps the step times it measured, under the workflow's results folder: one file per step
# (its program, trm/launch/accelerators.py step_hash, and the devices it ran on), read by every plan's costs.
MEASURED_STEPS = "measured"


def measured_step_path(results: str, config: dict, devices: int) -> str:
    """The file of the step time measured for `config`'s step on `devices` devices: RESULTS/measured/HASH-N.json."""
    return storage.join(results, MEASURED_STEPS, f"{step_hash(config)}-{devices}.json")


def measured_step_s(results: str, config: dict, devices: int) -> tuple[float, str] | None:
    """(seconds per step, the file) that `trm canary` measured for `config`'s step on `devices` devices; None
    where it measured none (or its file is unreadable: the plan then estimates as before)."""
    path = measured_step_path(results, config, devices)
    try:
        with open(path) as stream:
            step_s = float(json.load(stream)["step_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (step_s, path) if math.isfinite(step_s) and step_s > 0 else None


def step_key(config: dict, devices: int) -> str:
    """What a training step's time depends on here: its compiled program (step_config) and the job's devices."""
    return json.dumps({**step_config(config), "devices": devices}, sort_keys=True)


@dataclass(frozen=True)
class Measured:
    """One finished run as its table measured it: its step's shape, one optimizer step's seconds on its job's
    devices, its training FLOP rate per device, evaluation FLOPs and wall seconds."""

    config_hash: str
    key: str
    devices: int
    step_s: float
    rate: float  # training FLOP/s per device
    training_flops: float
    evaluation_flops: float
    wall_s: float
    steps: int


def _number(row: dict, column: str) -> float:
    try:
        return float(row.get(column) or "nan")
    except ValueError:
        return math.nan


def _config(results: str, config_hash: str) -> dict | None:
    """The config of a run from its job file (RESULTS/jobs/<hash>.json), unchecked; None when it is unreadable."""
    try:
        with open(job_path(results, config_hash)) as stream:
            return json.load(stream)["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _measure(row: dict, results: str) -> Measured | None:
    """A table row as a measurement; None for a row that does not measure one (an older table, a run not timed)."""
    figures = {column: _number(row, column) for column in COLUMNS[1:]}
    config = _config(results, row.get("config_hash", ""))
    if config is None or not all(math.isfinite(v) and v > 0 for v in figures.values()):
        return None
    devices = max(1, round(figures["accelerator_hours"] * 3600 / figures["wall_time_s"]))
    batch = config["train"]["global_batch_size"]
    training_flops = figures["steps"] * batch * figures["train_flops_per_example_step"]
    return Measured(
        config_hash=row["config_hash"],
        key=step_key(config, devices),
        devices=devices,
        step_s=figures["step_time_s"],
        rate=figures["train_flops_per_example_step"] * figures["examples_per_second"] / devices,
        training_flops=training_flops,
        evaluation_flops=max(figures["run_flops"] - training_flops, 0.0),
        wall_s=figures["wall_time_s"],
        steps=int(figures["steps"]),
    )


def tables(results: str) -> list[str]:
    """The results tables of one scale's folder, newest first."""
    paths = [
        os.path.join(results, "table.csv"),
        *glob.glob(os.path.join(results, SELECTIONS, "*", "table.csv")),
    ]
    return sorted((p for p in paths if os.path.isfile(p)), key=os.path.getmtime, reverse=True)


def _rows(path: str) -> list[dict]:
    try:
        with open(path, newline="") as stream:
            return list(csv.DictReader(stream))
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


class Measurements:
    """The runs measured in a scale's results folder (`runs`: by config hash, the row of the job that trained it,
    the longest) and the last table (`last`: its path and its runs' hashes), with the estimate they give."""

    def __init__(self, results: str) -> None:
        self.runs: dict[str, Measured] = {}
        found = tables(results)
        self.last: tuple[str, list[str]] | None = None
        for path in found:
            measured = [m for row in _rows(path) if (m := _measure(row, results))]
            for m in measured:  # a job that only collected a run shared with another took less
                if m.config_hash not in self.runs or m.wall_s > self.runs[m.config_hash].wall_s:
                    self.runs[m.config_hash] = m
            if self.last is None and measured:
                self.last = (path, list(dict.fromkeys(m.config_hash for m in measured)))
        by_key: dict[str, list[Measured]] = {}
        for m in self.runs.values():
            by_key.setdefault(m.key, []).append(m)
        self._by_key = by_key
        self.rate = statistics.median(m.rate for m in self.runs.values()) if self.runs else None
        # Per job, what its steps and evaluations do not account for: start, imports, compilation, checkpoints.
        outside = [
            m.wall_s - m.steps * m.step_s - m.evaluation_flops / (m.rate * m.devices)
            for m in self.runs.values()
        ]
        self.start_up_s = max(statistics.fmean(outside), 0.0) if outside else 0.0

    def __bool__(self) -> bool:
        return bool(self.runs)

    def same_shape(self, key: str) -> bool:
        return key in self._by_key

    def seconds(
        self, key: str, devices: int, steps: int, training_flops: float, evaluation_flops: float
    ) -> dict:
        """Seconds of a run's job on its `devices`: training, evaluation and start-up (see the module docstring)."""
        same = self._by_key.get(key)
        if same:
            step_s = statistics.median(m.step_s for m in same)
            rate = statistics.median(m.rate for m in same)
            training = steps * step_s
        else:
            rate = self.rate
            training = training_flops / (rate * devices)
        return {
            "training": training,
            "evaluation": evaluation_flops / (rate * devices),
            "start-up": self.start_up_s,
        }

    def last_study(self) -> tuple[str, float, float] | None:
        """(the last table, its runs' measured wall hours, the hours this estimate gives them), each run once."""
        if self.last is None:
            return None
        path, hashes = self.last
        runs = [self.runs[h] for h in hashes]
        estimated = sum(
            sum(self.seconds(m.key, m.devices, m.steps, m.training_flops, m.evaluation_flops).values())
            for m in runs
        )
        return path, sum(m.wall_s for m in runs) / 3600, estimated / 3600


def finished_runs(results: str, run_dirs: dict[str, str]) -> set[str]:
    """The config hashes among `run_dirs` (hash -> run dir URL) whose runs have finished: a summary in
    RESULTS/runs/ carries the hash, or, where the run dir is local, it holds _SUCCESS. No bucket is read."""
    done = set()
    for path in glob.glob(os.path.join(results, "runs", "*.json")):
        try:
            with open(path) as stream:
                done.add(json.load(stream)["config_hash"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    local = {h: url for h, url in run_dirs.items() if "://" not in url or url.startswith("file://")}
    done |= {
        h
        for h, url in local.items()
        if os.path.exists(layout.path(url.removeprefix("file://"), layout.SUCCESS))
    }
    return done & set(run_dirs)

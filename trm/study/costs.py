"""A study's planned cost: each run's estimated accelerator-hours, the dry run's plan text and each job's message.

A run is estimated from this machine's measured runs (trm/study/measured.py: same step shape, else the measured
FLOP rate; a canary's measured step), else from its compiled steps' roofline (DIR/<accelerator>/<step hash>.json in
RESULTS/compile, then config/compiled; the step hash covers config and source, trm/launch/accelerators.py), else
from its FLOPs at the assumed utilization (trm/study/estimate.py), and the plan says which. Only runs left to train
are counted; a local study's plan compares the estimate with the last table's measured wall time.
"""

from __future__ import annotations

import collections
import functools
import glob
import os
import shutil

from trm.checkout import checkout_path
from trm.config import experiment_path, load_config
from trm.errors import UserError
from trm.launch.accelerators import step_figures
from trm.model.mlp_t_path import path_name
from trm.study.estimate import (
    CostCache,
    accelerator_hours,
    compiled_run_hours,
    compiled_step_seconds,
    describe_evaluation,
    evaluation_batch_steps,
    evaluation_flops,
    evaluation_passes,
    training_flops,
    training_steps,
)
from trm.study.measured import Measurements, finished_runs, measured_step_s, step_key
from trm.study.plan import PlannedRun, PlannedStudy, experiment_of

# The compiled figures kept in the repository (the plan of a fresh clone, which has compiled nothing, uses them).
COMPILED_FIGURES = checkout_path("config/compiled")
# The sampled recursion's K the plan prices for a scale that samples none (test_time_trajectories: []), so that a
# user sees what it would add before setting it (docs/fidelity.md, "Sampled test-time recursion").
OFFERED_TRAJECTORIES = (4, 16)
MAX_NAMED = 6  # runs without compiled figures named in the plan's figures line (more are counted)


# How a run was estimated (Costs.source).
COMPILED, SAME_STEP, MEASURED_RATE, ASSUMED = "compiled", "same step", "measured rate", "assumed"


class Costs:
    """The estimates of a study's runs (`hours[exp_id]`: training, evaluation and, from measurements, start-up
    accelerator-hours; `source[exp_id]`: how; `finished`: the config hashes of the finished runs)."""

    def __init__(self, study: PlannedStudy) -> None:
        self.study = study
        config = study.config
        self.accelerator = config["accelerator"]
        self.device_hours = f"{self.accelerator['name']}-hours"
        self.test_puzzles = study.test_puzzles
        self.hours: dict[str, dict[str, float]] = {}
        self.source: dict[str, str] = {}
        # Of the evaluation hours, the sampled recursion's (where the scale samples none: OFFERED_TRAJECTORIES').
        self.sampled_hours: dict[str, float] = {}
        # Experiments estimated from their compiled steps -> the file of the figures used.
        self.compiled: dict[str, str] = {}
        # A local study's measured runs (the local backend runs on this machine; TPU jobs do not).
        self.measured = Measurements(study.results) if study.backend == "local" else None
        # Each run's MLP-T path in its train step (None without MLP-T); a `fused` that cannot be is an error now.
        self.mlp_t: dict[str, str | None] = {exp.id: self._mlp_t_path(exp) for exp in study.plan.values()}
        # Kept in memory while planning; written by `save_cache` once jobs will run (a dry run writes nothing).
        self._cache = CostCache(os.path.join(config["results"], ".cache", "model-costs.json"))
        for exp in study.plan.values():
            if exp.replicate and exp.experiment in self.hours:  # the seed changes no cost: its experiment's
                self.hours[exp.id], self.source[exp.id] = (
                    self.hours[exp.experiment],
                    self.source[exp.experiment],
                )
                self.sampled_hours[exp.id] = self.sampled_hours[exp.experiment]
                if exp.experiment in self.compiled:
                    self.compiled[exp.id] = self.compiled[exp.experiment]
                continue
            devices = study.job_devices(exp.id)
            found = self._compiled_seconds(exp)  # read once: each grid below is priced from the same figures
            self.hours[exp.id], self.source[exp.id] = self._estimate(
                exp, devices, study.test_time_trajectories, found
            )
            if found:
                self.compiled[exp.id] = found[1]
            # What the sampled recursion adds to the evaluation: this scale's grid's, or the one the plan offers.
            sampled = self.hours[exp.id]["evaluation"]
            if not study.test_time_trajectories:
                sampled = self._estimate(exp, devices, OFFERED_TRAJECTORIES, found)[0]["evaluation"]
            self.sampled_hours[exp.id] = sampled - self._estimate(exp, devices, (), found)[0]["evaluation"]
        # Training at the step time `trm canary` measured for a run's step on its job's devices, where it did.
        self.canary: dict[str, str] = {}
        for exp in study.plan.values():
            devices = study.job_devices(exp.id)
            if found := measured_step_s(config["results"], exp.config, devices):
                step_s, self.canary[exp.id] = found
                training = training_steps(exp.config) * step_s * devices / 3600
                self.hours[exp.id] = {**self.hours[exp.id], "training": training}
        self.finished = finished_runs(
            study.results, {exp.hash: study.run_url(exp.id) for exp in study.plan.values()}
        )

    def _estimate(
        self, exp: PlannedRun, devices: int, trajectories, found: tuple[dict, str] | None
    ) -> tuple[dict, str]:
        """A run's hours by part and how they were estimated, with `trajectories` as its sampled recursion, from
        its compiled step figures `found` (`_compiled_seconds`) where there are some."""
        study = self.study
        curve = (study.test_time_steps, devices, study.test_time_subset, trajectories)
        if found:
            hours = compiled_run_hours(
                exp.config,
                found[0],
                devices,
                self.test_puzzles,
                study.test_time_steps,
                study.test_time_subset,
                trajectories,
            )
            return hours, COMPILED
        costs = self._cache.costs(exp.hash, exp.config)
        flops = {
            "training": training_flops(exp.config, costs),
            "evaluation": evaluation_flops(exp.config, costs, self.test_puzzles, *curve),
        }
        if self.measured:
            key = step_key(exp.config, devices)
            steps = training_steps(exp.config)
            seconds = self.measured.seconds(key, devices, steps, flops["training"], flops["evaluation"])
            source = SAME_STEP if self.measured.same_shape(key) else MEASURED_RATE
            return {part: s * devices / 3600 for part, s in seconds.items()}, source
        peak, utilization = self.accelerator["peak_flops"], self.accelerator["utilization"]
        steps = {
            "training": training_steps(exp.config),
            "evaluation": evaluation_batch_steps(exp.config, self.test_puzzles, *curve),
        }
        floor = self.accelerator.get("step_floor_s")
        hours = {
            k: accelerator_hours(v, peak, utilization, steps[k] * devices, floor) for k, v in flops.items()
        }
        return hours, ASSUMED

    def _mlp_t_path(self, exp) -> str | None:
        study = self.study
        platform = "tpu" if study.backend == "tpu-vm" else study.config["launch"]["platform"]
        try:
            return path_name(exp.config, platform, study.job_devices(exp.id))
        except UserError as err:
            raise UserError(f"{exp.path} at the {study.scale} scale: {err}") from None

    def save_cache(self) -> None:
        """Keep the model costs computed while planning, so that the next plan needs no JAX import."""
        self._cache.save()

    def accelerator_of(self, exp_id: str) -> str:
        """The slice type of the experiment's job (launch.tpu.accelerator_type, or its launch.per_experiment one)."""
        return self.study.job_launch(exp_id)["tpu"]["accelerator_type"]

    def compile_dir(self, exp_id: str) -> str:
        """This machine's `trm compile-check` figures of the experiment's accelerator (the compile_check target)."""
        return os.path.join(self.study.config["results"], "compile", self.accelerator_of(exp_id))

    def committed_dir(self, exp_id: str) -> str:
        """The repository's compiled figures of the experiment's accelerator (the compiled_figures target)."""
        return os.path.join(self.study.compiled_dir, self.accelerator_of(exp_id))

    @functools.cached_property
    def compile_targets(self) -> dict[str, str]:
        """Compile result file -> the first selected experiment with that accelerator and paper-scale step (read
        only when compiling)."""
        steps = {}
        for exp_id in self.study.plan:
            paper = load_config(experiment_path(experiment_of(exp_id), self.study.experiments_dir))
            steps.setdefault(step_figures(self.compile_dir(exp_id), paper), exp_id)
        return steps

    def commit_figures(self, paths: list[str]) -> list[str]:
        """The compiled_figures target: the repository's compiled figures replaced by `paths` (this machine's
        compiles of the selected experiments' steps, `compile_targets`), each into its accelerator's folder; the
        files written."""
        for stale in glob.glob(os.path.join(self.study.compiled_dir, "*", "*.json")):
            os.remove(stale)
        written = []
        for path in paths:
            folder = os.path.join(self.study.compiled_dir, os.path.basename(os.path.dirname(path)))
            os.makedirs(folder, exist_ok=True)
            written.append(shutil.copyfile(path, os.path.join(folder, os.path.basename(path))))
        return written

    def _compiled_seconds(self, exp) -> tuple[dict, str] | None:
        """The roofline step times of a run on the TPU slice and the file they come from, from this machine's
        compiles, else the repository's; None when neither holds its step (of this code and config)."""
        if not self._uses_compiled_figures():
            return None
        for folder in (self.compile_dir(exp.id), self.committed_dir(exp.id)):
            if seconds := compiled_step_seconds(exp.config, folder):
                return seconds, step_figures(folder, exp.config)
        return None

    def _uses_compiled_figures(self) -> bool:
        """Compiled figures apply to a TPU study at the paper scale (the steps `trm compile-check` compiles)."""
        return self.study.backend == "tpu-vm" and self.study.scale == "paper"

    def _assumed(self) -> str:
        floor = self.accelerator.get("step_floor_s")
        at_least = f", at least {floor * 1000:.3g} ms a step (accelerator.step_floor_s)" if floor else ""
        return f"an assumed {self.accelerator['utilization']:.0%} of peak{at_least}"

    def _measured(self) -> str:
        """Where a local study's measurements come from, in words."""
        return f"this machine's measured runs ({len(self.measured.runs)} in {self.study.results}'s tables)"

    def _source_words(self, source: str, their: str = "their") -> str:
        """How a run was estimated (`source`), in words; `their`: "its" for one job's message."""
        if source == COMPILED:
            return f"at {their} compiled steps' roofline times (a best case)"
        if source == SAME_STEP:
            return f"at the step time measured for {their} step's shape ({self._measured()})"
        if source == MEASURED_RATE:
            return f"at the FLOP rate measured on this machine (no measured run of {their} step's shape)"
        # The assumed utilization is a guess, not a calibration (at 10%, the smoke study took 6.5 times less than
        # estimated), so the line says what the figure is.
        return f"at {self._assumed()} (a rough bound, not a forecast)"

    def _source_text(self, runs: list[str]) -> str:
        """How the given runs were estimated, for the summary's first line."""
        counts = collections.Counter(self.source[r] for r in runs)
        if len(counts) == 1:
            (source,) = counts
            return ("every run " if source == COMPILED else "") + self._source_words(source)
        order = (COMPILED, SAME_STEP, MEASURED_RATE, ASSUMED)
        parts = [f"{counts[source]} {self._source_words(source)}" for source in order if counts[source]]
        return f"{parts[0].replace(' ', ' runs ', 1)}, {', '.join(parts[1:])}"

    def plan_text(self) -> str:
        """The study's line of the dry run, then the hours of the runs left to train, and how a local study's
        estimate compares with the last table's measured wall time."""
        study = self.study
        runs = study.distinct_runs()
        todo = [first for first in runs if study.plan[first].hash not in self.finished]
        references = f" and {len(study.references)} reference" if study.references else ""
        experiments = sum(not exp.replicate for exp in study.plan.values() if exp.id not in study.floor_only)
        experiments -= len(study.references)
        floor = f" ({len(study.floor_only)} only for the noise floor)" if study.floor_only else ""
        finished = (
            f", {len(runs) - len(todo)} finished, {len(todo)} to train" if len(todo) < len(runs) else ""
        )
        head = (
            f"TRM study, scale {study.scale}: {experiments} experiments in {len(study.selected_groups)} groups"
            f"{references}, {len(study.datasets)} datasets, {len(runs)} distinct runs{floor}{finished}"
        )
        lines = [f"{head}; estimated {self._source_text(todo)}:" if todo else f"{head}: nothing to train"]
        if todo:
            lines += self._hours_lines(todo)
            lines.append(self._sampled_line(todo))
            if figures := self._figures_line(todo):
                lines.append(figures)
            if canary := [first for first in todo if first in self.canary]:
                where = os.path.dirname(self.canary[canary[0]])
                lines.append(
                    f"  {'canary:':<12}training of {len(canary)} runs at the step times measured in {where}/"
                )
        if self.measured and (last := self.measured.last_study()):
            path, measured, estimated = last
            lines.append(
                f"  {'measured:':<12}the runs of the last table ({path}) took {measured:.3g} h of jobs; this "
                f"estimate gives them {estimated:.3g} h ({estimated / measured:.2f} x measured)"
            )
        if todo and (price := self.accelerator.get("price_per_hour")) is not None:
            hours = sum(sum(self.hours[first].values()) for first in todo)
            lines.append(
                f"  {'price:':<12}${hours * price:,.0f} for these {hours:.4g} {self.device_hours} at ${price:g} each "
                "(accelerator.price_per_hour; a slice bills while it exists, busy or idle: a lower bound)"
            )
        return "\n".join(lines)

    def _hours_lines(self, runs: list[str]) -> list[str]:
        """Training, evaluation and (measured) start-up hours of the given runs; their replicates on a line of
        their own: what the noise floor costs."""
        study = self.study
        if len({study.job_devices(e) for e in study.plan}) == 1:
            shapes = f"on {study.job_devices(None)} devices each"
        else:
            shapes = "each on its own devices"
        replicates = [first for first in runs if study.plan[first].replicate]
        own = [first for first in runs if not study.plan[first].replicate]
        lines = []
        for part in ("training", "evaluation", "start-up"):
            hours = sum(self.hours[first].get(part, 0.0) for first in own)
            wall = sum(self.hours[first].get(part, 0.0) / study.job_devices(first) for first in own)
            if part != "start-up":
                lines.append(
                    f"  {f'{part}:':<12}{hours:.4g} {self.device_hours} ({wall:.4g} h of jobs {shapes})"
                )
            elif hours:
                lines.append(
                    f"  {f'{part}:':<12}{hours:.4g} {self.device_hours} ({wall:.4g} h of jobs {shapes}): "
                    f"{self.measured.start_up_s:.3g} s per job, measured outside steps and evaluations"
                )
        if replicates:
            hours = sum(sum(self.hours[first].values()) for first in replicates)
            wall = sum(sum(self.hours[first].values()) / study.job_devices(first) for first in replicates)
            lines.append(
                f"  {'replicates:':<12}{len(replicates)} runs (more seeds: replicates.{study.scale}), {hours:.4g} "
                f"{self.device_hours} of training and evaluation ({wall:.4g} h of jobs {shapes})"
            )
        return lines

    def _sampled_line(self, runs: list[str]) -> str:
        """What the sampled recursion costs of the runs' evaluation, or would add to it where the scale samples none,
        priced where the accelerator has a price."""
        study = self.study
        hours = sum(self.sampled_hours[first] for first in runs)
        puzzles = min(study.test_time_subset or self.test_puzzles, self.test_puzzles)
        grid = " and ".join(map(str, study.test_time_trajectories or OFFERED_TRAJECTORIES))
        what = f"K = {grid} trajectories per puzzle to {max(study.test_time_steps)} steps on {puzzles:,} test puzzles"
        setting = f"test_time_trajectories.{study.scale}"
        price = self.accelerator.get("price_per_hour")
        cost = f"{hours:.4g} {self.device_hours}" + (f" (${hours * price:,.0f})" if price is not None else "")
        if study.test_time_trajectories:
            return f"  {'sampled:':<12}{what}: {cost} of the evaluation ({setting})"
        return f"  {'sampled:':<12}none ({setting}: []); {what} would add {cost} to the evaluation"

    def _figures_line(self, runs: list[str]) -> str | None:
        """Where a TPU study's compiled figures come from (the folders, runs from each), and which runs have none
        for their step and this code, named when few; None where no figures apply (not a TPU study at paper scale)."""
        study = self.study
        if not self._uses_compiled_figures():
            return None
        folders = collections.Counter(os.path.dirname(self.compiled[r]) for r in runs if r in self.compiled)
        found = ", ".join(f"{n} run{'s' * (n != 1)} from {folder}/" for folder, n in sorted(folders.items()))
        assumed = [r for r in runs if r not in self.compiled]
        line = f"  {'figures:':<12}" + (f"compiled steps of {found}" if found else "no compiled steps")
        if not assumed:
            return line
        named = ", ".join(assumed) if len(assumed) <= MAX_NAMED else f"{len(assumed)} runs"
        return (
            f"{line}; assumed for {named}: no figures of their step, for this code and config, in "
            f"{os.path.join(study.config['results'], 'compile')}/ or {study.compiled_dir}/ "
            "(snakemake compile_check compiles them)"
        )

    def message(self, exp_id: str) -> str:
        """The job's estimate, training and evaluation (and measured start-up) on separate labelled lines
        (evaluation as the trainer runs it: trm/study/estimate.py)."""
        study = self.study
        first = study.first_with_same_run(exp_id)
        if first != exp_id:
            return f"train {exp_id}: same config as {first}, whose run it collects (no training)"
        exp = study.plan[exp_id]
        if exp.hash in self.finished:
            return (
                f"train {exp_id}: its run {exp.hash} has finished: the job only summarises it (no training)"
            )
        hours, devices = self.hours[exp_id], study.job_devices(exp_id)
        steps = study.test_time_steps
        config = exp.config
        replicate = (
            f"; replicate {exp.replicate} of {exp.experiment} (train.seed {config['train']['seed']})"
            if exp.replicate
            else ""
        )
        passes = evaluation_passes(
            config, self.test_puzzles, steps, devices, study.test_time_subset, study.test_time_trajectories
        )
        source = self.source[exp_id]
        if source == COMPILED:
            source = f"at its compiled steps' roofline times ({self.compiled[exp_id]}), a best case"
        elif source == ASSUMED:
            source = f"from its FLOPs and batch at {self._assumed()}"
        else:
            source = self._source_words(source, "its")
        if exp_id in self.canary:
            source = (
                f"training at the step time trm canary measured ({self.canary[exp_id]}), the rest {source}"
            )
        unit = self.device_hours
        lines = [
            f"train {exp_id}: estimated on the job's {devices} devices, {source}{replicate}",
            f"    training:   {hours['training']:.4g} {unit} ({hours['training'] / devices:.3g} h on them)",
            f"    evaluation: {hours['evaluation']:.4g} {unit} ({hours['evaluation'] / devices:.3g} h on them): "
            f"{describe_evaluation(passes, steps)}",
        ]
        if hours.get("start-up"):
            lines.append(f"    start-up:   {hours['start-up'] / devices * 3600:.3g} s (measured per job)")
        if self.mlp_t[exp_id]:
            lines.append(
                f"    MLP-T:      {self.mlp_t[exp_id]} (arch.mlp_t_kernel {config['arch']['mlp_t_kernel']})"
            )
        return "\n".join(lines)

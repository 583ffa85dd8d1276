"""A study's planned cost: each run's estimated accelerator-hours, the dry run's summary and each job's message.

From the roofline times of a run's compiled steps where `trm compile-check` compiled them for the slice, else
from its FLOPs and batch at the assumed utilization (trm/study/estimate.py; model costs cached by config hash in
RESULTS/.cache/model-costs.json). A step's figures are DIR/<accelerator>/<step hash>.json, looked up first in
this machine's compiles (DIR = RESULTS/compile, the workflow's compile_check target, workflow/rules/compile.smk),
then in the repository's (DIR = config/compiled, refreshed by the compiled_figures target). The step hash covers
the step's config and source code (trm/launch/accelerators.py), so a figure of other code or config is not found:
that run is planned at the assumed utilization, and the plan says which runs are.
"""

from __future__ import annotations

import collections
import functools
import glob
import os
import shutil
from typing import TYPE_CHECKING

from trm.config import experiment_path, load_config
from trm.launch.accelerators import step_figures
from trm.study.estimate import (
    CostCache,
    accelerator_hours,
    compiled_run_hours,
    compiled_step_seconds,
    describe_evaluation,
    evaluation_flops,
    evaluation_passes,
    training_flops,
)
from trm.study.plan import experiment_of
from trm.study.scale import TEST_PUZZLES

if TYPE_CHECKING:
    from trm.study.study import Study

# The compiled figures kept in the repository (the plan of a fresh clone, which has compiled nothing, uses them).
COMPILED_FIGURES = "config/compiled"
MAX_NAMED = 6  # runs without compiled figures named in the plan's figures line (more are counted)


class Costs:
    """The estimates of a study's runs (`hours[exp_id]`: training and evaluation accelerator-hours)."""

    def __init__(self, study: Study) -> None:
        self.study = study
        config = study.config
        self.accelerator = config["accelerator"]
        self.device_hours = f"{self.accelerator['name']}-hours"
        self.test_puzzles = TEST_PUZZLES[study.scale]
        self.hours: dict[str, dict[str, float]] = {}
        # Experiments estimated from their compiled steps -> the file of the figures used.
        self.compiled: dict[str, str] = {}
        cache = CostCache(os.path.join(config["results"], ".cache", "model-costs.json"))
        for exp in study.plan.values():
            if exp.replicate:  # the seed changes no cost: its experiment's (planned just before it)
                self.hours[exp.id] = self.hours[exp.experiment]
                if exp.experiment in self.compiled:
                    self.compiled[exp.id] = self.compiled[exp.experiment]
                continue
            devices = study.job_devices(exp.id)
            if found := self._compiled_seconds(exp):
                seconds, self.compiled[exp.id] = found
                self.hours[exp.id] = compiled_run_hours(
                    exp.config,
                    seconds,
                    devices,
                    self.test_puzzles,
                    study.test_time_steps,
                    study.test_time_subset,
                )
                continue
            costs = cache.costs(exp.hash, exp.config)
            flops = {
                "training": training_flops(exp.config, costs),
                "evaluation": evaluation_flops(
                    exp.config,
                    costs,
                    self.test_puzzles,
                    study.test_time_steps,
                    devices,
                    study.test_time_subset,
                ),
            }
            peak, utilization = self.accelerator["peak_flops"], self.accelerator["utilization"]
            self.hours[exp.id] = {k: accelerator_hours(v, peak, utilization) for k, v in flops.items()}
        cache.save()

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
    def compile_steps(self) -> dict[str, str]:
        """Compile result file -> the first selected experiment with that accelerator and paper-scale step (read
        only when compiling)."""
        steps = {}
        for exp_id in self.study.plan:
            paper = load_config(experiment_path(experiment_of(exp_id), self.study.experiments_dir))
            steps.setdefault(step_figures(self.compile_dir(exp_id), paper), exp_id)
        return steps

    def commit_figures(self, paths: list[str]) -> list[str]:
        """The compiled_figures target: the repository's compiled figures replaced by `paths` (this machine's
        compiles of the selected experiments' steps, `compile_steps`), each into its accelerator's folder; the
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
        return f"an assumed {self.accelerator['utilization']:.0%} of peak"

    def summary(self) -> str:
        """The study's line of the dry run, then its training and evaluation hours."""
        study = self.study
        runs = study.runs()
        compiled = sum(first in self.compiled for first in runs)
        # The assumed utilization is a guess, not a calibration (at 10%, smoke runs took 1.5 to 8 times less than
        # estimated), so the line says what the figure is.
        assumed = f"{self._assumed()} (a rough bound, not a forecast)"
        roofline = "at their compiled steps' roofline times (a best case)"
        if not compiled:
            source = f"at {assumed}"
        elif compiled == len(runs):
            source = f"every run {roofline}"
        else:
            source = f"{compiled} runs {roofline}, {len(runs) - compiled} at {assumed}"
        references = f" and {len(study.references)} reference" if study.references else ""
        experiments = sum(not exp.replicate for exp in study.plan.values()) - len(study.references)
        # Replicates (seeds beyond each experiment's first) on a line of their own: what the noise floor costs.
        replicates = [first for first in runs if study.plan[first].replicate]
        own = [first for first in runs if not study.plan[first].replicate]
        lines = [
            f"TRM study, scale {study.scale}: {experiments} experiments in "
            f"{len(study.selected_groups)} groups{references}, {len(study.datasets)} datasets, {len(runs)} distinct "
            f"runs; estimated {source}:"
        ]
        if len({study.job_devices(e) for e in study.plan}) == 1:
            shapes = f"on {study.job_devices(None)} devices each"
        else:
            shapes = "each on its own devices"
        for part in ("training", "evaluation"):
            hours = sum(self.hours[first][part] for first in own)
            wall = sum(self.hours[first][part] / study.job_devices(first) for first in own)
            lines.append(f"  {f'{part}:':<12}{hours:.4g} {self.device_hours} ({wall:.4g} h of jobs {shapes})")
        if replicates:
            hours = sum(sum(self.hours[first].values()) for first in replicates)
            wall = sum(sum(self.hours[first].values()) / study.job_devices(first) for first in replicates)
            lines.append(
                f"  {'replicates:':<12}{len(replicates)} runs (more seeds: replicates.{study.scale}), {hours:.4g} "
                f"{self.device_hours} of training and evaluation ({wall:.4g} h of jobs {shapes})"
            )
        if figures := self._figures_line(runs):
            lines.append(figures)
        if (price := self.accelerator.get("price_per_hour")) is not None:
            hours = sum(self.hours[first]["training"] + self.hours[first]["evaluation"] for first in runs)
            lines.append(
                f"  {'price:':<12}${hours * price:,.0f} for these {hours:.4g} {self.device_hours} at ${price:g} each "
                "(accelerator.price_per_hour; a slice bills while it exists, busy or idle: a lower bound)"
            )
        return "\n".join(lines)

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
        """The job's estimate, training and evaluation on separate labelled lines (evaluation as the trainer runs
        it: trm/study/estimate.py)."""
        study = self.study
        first = study.first_with_same_run(exp_id)
        if first != exp_id:
            return f"train {exp_id}: same config as {first}, whose run it collects (no training)"
        hours, devices = self.hours[exp_id], study.job_devices(exp_id)
        steps = study.test_time_steps
        exp = study.plan[exp_id]
        config = exp.config
        replicate = (
            f"; replicate {exp.replicate} of {exp.experiment} (train.seed {config['train']['seed']})"
            if exp.replicate
            else ""
        )
        passes = evaluation_passes(config, self.test_puzzles, steps, devices, study.test_time_subset)
        source = (
            f"at its compiled steps' roofline times ({self.compiled[exp_id]}), a best case"
            if exp_id in self.compiled
            else f"from its FLOPs and batch at {self._assumed()}"
        )
        unit = self.device_hours
        return (
            f"train {exp_id}: estimated on the job's {devices} devices, {source}{replicate}\n"
            f"    training:   {hours['training']:.4g} {unit} ({hours['training'] / devices:.3g} h on them)\n"
            f"    evaluation: {hours['evaluation']:.4g} {unit} ({hours['evaluation'] / devices:.3g} h on them): "
            f"{describe_evaluation(passes, steps)}"
        )

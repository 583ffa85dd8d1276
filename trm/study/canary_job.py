"""The workflow's canary job: `trm canary` on the study's baseline, on its backend, through the training launcher.

    snakemake --cores 2 canary          (or with a profile: snakemake --profile profiles/gpu canary)

The `canary` rule (workflow/rules/train.smk) runs `trm launch --job RESULTS/jobs/canary.json`, a job file of kind
"canary" (trm/launch/job.py): the baseline (the first group's baseline member, the config of config/base.yaml) at
the study's scale, on the job shape the baseline trains on (launch.*, with its launch.per_experiment entry), its
staged dataset, and as its folder STORAGE/SCALE/canary/<config hash> (the canary's checkpoint and canary.json).
The launcher starts `trm canary` on every host where a training job would start `trm train`; then, on the
controller, `trm canary --report` prints the go / no-go page from that folder and, on a go, writes the step time
into RESULTS/measured/ (the rule's output), where every later plan reads it. It runs no study job, and `all`
does not depend on it; it runs again when its measured file is missing (a code change gives the step a new hash)
or with `--forcerun canary`. On the tpu-vm backend the launcher watches the markers the canary writes in its
folder as a trainer does in its run dir (status.json, _SUCCESS on a go); tested on the fake cloud only.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from trm.launch import tpu_options
from trm.launch.job import Job
from trm.run.spec import Run
from trm.storage import join as url_join
from trm.study.groups import load_groups
from trm.study.measured import measured_step_path
from trm.study.plan import plan_study

if TYPE_CHECKING:
    from trm.study.study import Study

CANARY = "canary"  # the rule's name, the job file's name in RESULTS/jobs/ and the folder's in STORAGE/SCALE/


class CanaryJob:
    """The canary job of a study: its run (the baseline at the study's scale), job, files and commands."""

    def __init__(self, study: Study, trm: str) -> None:
        baseline = load_groups(study.groups_path, study.experiments_dir)[0]["baseline"]
        self.study, self.trm = study, trm
        (self.baseline,) = plan_study(
            study.scale, [baseline], "all", study.experiments_dir, study.groups_path, checked=True
        )
        self.folder = url_join(study.storage, CANARY, self.baseline.hash)
        self.job_file = os.path.join(study.results, "jobs", f"{CANARY}.json")

    def job(self) -> Job:
        study, exp = self.study, self.baseline
        launch = study.job_launch(exp.id)
        run = Run(exp.config, exp.hash, study.dataset_url(exp.dataset), self.folder)
        tpu = tpu_options.launcher_settings(launch["tpu"])
        shape = study.backend, launch["hosts"], launch["devices_per_host"], tpu
        return Job(run, (), *shape, None, study.config["launch"]["platform"], kind=CANARY)

    def digest(self) -> str:
        """A digest of the job file: the canary runs again when it changes."""
        return hashlib.sha256(self.job().to_json().encode()).hexdigest()[:16]

    def write(self) -> None:
        """The job file, rewritten only when its content changes (the workflow's onstart)."""
        self.job().write(self.job_file)

    def measured_file(self) -> str:
        """Where a go writes the baseline's step time on its job's devices (the rule's output)."""
        devices = self.study.job_devices(self.baseline.id)
        return measured_step_path(self.study.config["results"], self.baseline.config, devices)

    def stage_receipt(self) -> str:
        return self.study.stage_receipt(self.baseline.dataset)

    def launch_command(self) -> list[str]:
        """The argv that runs the canary on every host: its job file, launched."""
        return [*self.study.jax_cache_env(), self.trm, "launch", "--job", self.job_file]

    def report_command(self) -> list[str]:
        """The argv that prints the page on the controller and, on a go, writes the measured step time."""
        return [self.trm, "canary", "--report", self.folder, "--results", self.study.config["results"]]

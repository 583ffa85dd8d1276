# Parse time: build the study (trm/study/study.py: settings checked, experiments planned, costs estimated) from
# the settings and print its planned cost and what its seeds can decide; the rules look everything up in it. Parsing
# writes nothing: the job files and the model-cost cache are written at onstart (Snakefile), never by a dry run.
import os
import sys

from snakemake.exceptions import WorkflowError

from trm.analysis.aggregate import repair_summaries
from trm.analysis.power import report as power_report
from trm.errors import UserError
from trm.launch.local import one_thread_per_job
from trm.study import interrupts
from trm.study.settings import setting_source
from trm.study.canary_job import CANARY as CANARY_RULE, CanaryJob
from trm.study.study import DEFAULT_SETTINGS, TRM, Study


def _source_of(dotted):
    """Where a setting was set (--config, a --configfile, config/config.yaml), for error messages."""
    settings = workflow.config_settings
    return setting_source(dotted, dict(settings.config), list(settings.configfiles), DEFAULT_SETTINGS)


try:
    study = Study(config, _source_of, workflow.source_path("../schemas/config.schema.yaml"))
    print(study.costs.plan_text(), file=sys.stderr)
    if power := power_report(study):  # at the paper and mini scales (trm/analysis/power.py)
        print(power, file=sys.stderr)
    if study.placeholder_storage:  # a dry run reaches no storage; a real run refuses before its first job
        print(f"warning: {study.placeholder_storage} (needed before a real run)", file=sys.stderr)
    # A damaged run summary looks done to Snakemake: removed, its run is summarised again (never retrained).
    for line in repair_summaries([study.run_summary(exp) for exp in study.plan], workflow.dryrun):
        print(f"note: {line}", file=sys.stderr)
except UserError as err:
    raise WorkflowError(str(err)) from None
# XLA's CPU work on one thread per job, set in Snakemake's environment, which every job inherits (not in the
# commands: a changed command would make Snakemake rerun finished jobs).
one_thread_per_job()

PLAN = study.plan
CANARY = CanaryJob(study, TRM)  # the `canary` rule's job (workflow/rules/train.smk)
RESULTS = study.results  # per-run files (summaries, job files, benchmarks), shared by every selection
# The table, verdicts and plots: RESULTS for the whole study, RESULTS/selections/<name> for a selection's.
ANALYSIS = study.analysis
TABLE = os.path.join(ANALYSIS, "table")
TABLE_CSV = f"{TABLE}.csv"
PLOT_FILES = os.path.join(ANALYSIS, "plots", "{group}.{ext}")
SELECTED_GROUPS = study.selected_groups
TEST_TIME_STEPS = ",".join(map(str, study.test_time_steps))
# `trm summarize`'s arguments for the sampled recursion a run's summary must hold: none without it.
TEST_TIME_SAMPLING = (
    [
        *("--test-time-trajectories", ",".join(map(str, study.test_time_trajectories))),
        *("--test-time-noise", repr(study.test_time_noise)),
    ]
    if study.test_time_trajectories
    else []
)


wildcard_constraints:
    exp="|".join(PLAN),
    dataset=r"p\d+-a\d+",
    group="|".join(SELECTED_GROUPS),

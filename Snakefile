# The TRM scaling study: 67 experiments from raw puzzles to scaling plots (docs/configuration.md, workflow section).
#   snakemake -n                                  plan, with estimated accelerator-hours per training job
#   snakemake --cores 2 all                       everything: datasets, runs, table, plots
#   snakemake --cores 2 --config experiments=[exp01a]   one experiment (or groups=[exp01] for one group); a
#                                                 selection writes its table and plots in results/SCALE/selections/
#   snakemake --report results/report.html        HTML report with the plots and the table (of the whole study;
#                                                 a selection's: the same --config as its run)
#   snakemake --cores 1 compile_check             compile every step for the TPU slice: does it fit, how fast
#   snakemake --cores 2 canary                    before `all` on new hardware: go / no-go on the job's devices
# Settings: config/config.yaml (local defaults), profiles/default/ (applied everywhere).

configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/compile.smk"


report: "workflow/report/workflow.rst"


# Small jobs run on the controller under any executor; datasets and training (with evaluation) go to the executor.
localrules:
    all,
    aggregate,
    verdicts,
    plot_group,
    compile_check,
    compile_step,
    compiled_figures,



# Before the first job (never in dry runs, which write nothing): each run's job file (RESULTS/jobs/<hash>.json, what
# its train job launches and the table reads its config from), and the model costs computed while planning, kept for
# the next plan (results/.cache). SIGINT and SIGTERM (like Ctrl-C) stop every running job through its
# checkpoint, and Snakemake then exits 128 + the signal (trm/study/interrupts.py; README "Stopping a study"). When a
# job to run reaches storage or a slice: a placeholder bucket is refused and, of a TPU study, gcloud, credentials,
# the bucket, the TPU API, the slices and ssh are checked, each failure with its fix (trm preflight;
# launch.tpu.preflight: false skips it); compile_check and dataset builds need none of it (Study.check_before_jobs).
onstart:
    interrupts.install()
    try:
        rules = {job.rule.name for job in workflow.dag.needrun_jobs()}
        study.write_jobs()
        if CANARY_RULE in rules:  # its job file (RESULTS/jobs/canary.json) only when it runs: `all` never needs it
            CANARY.write()
        study.costs.save_cache()
        study.check_before_jobs(rules)
    except UserError as err:
        raise WorkflowError(str(err)) from None


# At the end of a TPU study, failed or not: the slices it created that still exist (they bill until deleted), each
# with the command that deletes it (trm/launch/slice_ledger.py).
onsuccess:
    study.report_leftover_slices()


onerror:
    study.report_leftover_slices()
    interrupts.exit_if_interrupted()


rule all:
    input:
        TABLE_CSV,
        rules.verdicts.output,
        expand(PLOT_FILES, group=SELECTED_GROUPS, ext=["png", "svg"]),
    default_target: True

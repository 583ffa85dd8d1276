# Training and evaluation, one job per experiment. Each job launches its run's job file (RESULTS/jobs/<hash>.json:
# the resolved config, dataset, run dir and launch settings; trm/launch/job.py), which trains the run and, as its
# last phase on the same hosts, evaluates the whole test split at train.eval_steps and every test_time_steps count
# on test_time_subset puzzles (trm/train/test_time.py), then, with test_time_trajectories, the same counts and
# puzzles with K noisy trajectories per puzzle (trm/train/final_evaluation.py); the run dir (checkpoints, evaluation) lives in storage
# under that hash. The job's one local output is the run's summary (`trm summarize`, RESULTS/runs/<exp>.json),
# written only after the run's _SUCCESS marker, so a failed or preempted job leaves nothing that looks complete,
# and rerunning it resumes where it stopped (training or evaluation).


rule train:
    input:
        staged=lambda wildcards: study.stage_receipt(PLAN[wildcards.exp].dataset),
        same_run=lambda wildcards: study.trained_first(wildcards.exp),
    output:
        summary=study.run_summary("{exp}"),
    params:
        trm=TRM,
        # The job file is written at onstart (never by a dry run); a digest of its content reruns this job when it
        # changes (launch settings, storage): a finished run is only summarised again.
        job=lambda wildcards: study.job_digest(wildcards.exp),
        command=lambda wildcards: study.train_command(wildcards.exp),
        run_dir=lambda wildcards: study.run_url(wildcards.exp),
        steps=TEST_TIME_STEPS,
        sampling=TEST_TIME_SAMPLING,
    message:
        "{resources.estimate}"
    resources:
        estimate=lambda wildcards: study.costs.message(wildcards.exp),
        # Training jobs at once: a profile sets `resources: training_jobs=N` (TPU: its slices; one GPU machine: 1).
        training_jobs=1,
    log:
        os.path.join(RESULTS, "logs", "train", "{exp}.log"),
    benchmark:
        os.path.join(RESULTS, "benchmarks", "train", "{exp}.tsv")
    shell:
        # A finished run (trained by a same-config experiment or an earlier attempt) is only summarised; one that
        # has not finished, or whose evaluation lacks a count, is (re)launched, and evaluates only missing counts.
        "({params.trm:q} summarize {params.run_dir:q} --test-time-steps {params.steps:q} {params.sampling:q} "
        "--output {output:q} || ({params.command:q} && {params.trm:q} summarize {params.run_dir:q} "
        "--test-time-steps {params.steps:q} {params.sampling:q} --output {output:q})) > {log:q} 2>&1"


# Before the first `all` on new hardware: the canary (trm/study/canary_job.py, docs/tpu.md "Before `all`"), a few
# minutes of the baseline on every host of its job, through the same launcher; no study job runs first and `all`
# does not need it. Its page goes to the screen; a go writes its output, the measured step time the plan reads.
#   snakemake --cores 2 canary          (again: --forcerun canary)
rule canary:
    input:
        staged=CANARY.stage_receipt(),
    output:
        measured=CANARY.measured_file(),
    params:
        exp=CANARY.baseline.id,
        job=CANARY.digest(),  # a changed job file (launch settings, storage) runs the canary again
        command=CANARY.launch_command(),
        report=CANARY.report_command(),
    message:
        "canary: the baseline ({params.exp}) on every host of its job, a few minutes"
    log:
        os.path.join(RESULTS, "logs", "canary.log"),
    shell:
        # The page comes from what the hosts wrote (the launcher clears an earlier canary's first); a launch that
        # failed with a go page fails too.
        "launched=0; {params.command:q} > {log:q} 2>&1 || launched=$?; {params.report:q} && exit $launched"

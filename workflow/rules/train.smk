# Training and evaluation, one job per experiment. Each job launches its run's job file (RESULTS/jobs/<hash>.json:
# the resolved config, dataset, run dir and launch settings; trm/launch/job.py), which trains the run and, as its
# last phase on the same hosts, evaluates the whole test split at every test_time_steps count
# (trm/train/test_time.py); the run dir (checkpoints, evaluation) lives in storage under that hash. The local
# outputs are small copies made only after the run's _SUCCESS marker, so a failed or preempted job leaves nothing
# that looks complete, and rerunning it resumes where it stopped (training or evaluation).


rule train:
    input:
        staged=lambda wildcards: os.path.join(RESULTS, "staged", f"{PLAN[wildcards.exp].dataset}.txt"),
        job=lambda wildcards: study.job_file(wildcards.exp),
        same_run=lambda wildcards: study.trained_first(wildcards.exp),
    output:
        config=os.path.join(RESULTS, "runs", "{exp}", layout.CONFIG),
        metrics=os.path.join(RESULTS, "runs", "{exp}", layout.METRICS),
        test_time=os.path.join(RESULTS, "runs", "{exp}", layout.TEST_TIME),
        final=os.path.join(RESULTS, "runs", "{exp}", layout.FINAL),
    params:
        trm=TRM,
        command=lambda wildcards: study.train_command(wildcards.exp),
        run_dir=lambda wildcards: study.run_url(wildcards.exp),
        local=lambda wildcards, output: os.path.dirname(output.final),
        steps=TEST_TIME_STEPS,
    message:
        "{resources.estimate}"
    resources:
        estimate=lambda wildcards: study.costs.message(wildcards.exp),
        # One training job per TPU slice: a profile sets `resources: tpu=<slices>` (unlimited otherwise).
        tpu=1,
    log:
        os.path.join(RESULTS, "logs", "train", "{exp}.log"),
    benchmark:
        os.path.join(RESULTS, "benchmarks", "train", "{exp}.tsv")
    shell:
        # A finished run (trained by a same-config experiment or an earlier attempt) is only collected; one whose
        # evaluation lacks a count is relaunched, and evaluates only the missing counts.
        "({params.trm:q} collect-run {params.run_dir:q} {params.local:q} --test-time-steps {params.steps:q} || "
        "({params.command:q} && {params.trm:q} collect-run {params.run_dir:q} {params.local:q})) > {log:q} 2>&1"


rule evaluate:
    # Test-time scaling: the run's test split scored after each of test_time_steps supervision steps, by the
    # training job's hosts as its last phase (in the pass that also gives the trainer's final figures at
    # train.eval_steps). This job only writes those results from the collected copy: no JAX on the controller.
    # Only the first experiment of a shared run writes them.
    input:
        test_time=rules.train.output.test_time,
    output:
        json=os.path.join(RESULTS, "eval", "{exp}-steps.json"),
        csv=os.path.join(RESULTS, "eval", "{exp}-steps.csv"),
    params:
        trm=TRM,
        steps=TEST_TIME_STEPS,
    log:
        os.path.join(RESULTS, "logs", "evaluate", "{exp}.log"),
    shell:
        "{params.trm:q} collect-evaluation {input.test_time:q} --steps {params.steps:q} --out {output.json:q} "
        "> {log:q} 2>&1"


rule run_metrics:
    # One record per experiment for the table: the trainer's figures plus its run's test-time evaluation.
    input:
        config=rules.train.output.config,
        metrics=rules.train.output.metrics,
        final=rules.train.output.final,
        test_time=lambda wildcards: study.shared_evaluation(wildcards.exp),
    output:
        os.path.join(RESULTS, "eval", "{exp}.json"),
    params:
        trm=TRM,
        run=lambda wildcards, input: os.path.dirname(input.final),
    log:
        os.path.join(RESULTS, "logs", "run_metrics", "{exp}.log"),
    shell:
        "{params.trm:q} run-metrics {params.run:q} --test-time {input.test_time:q} --output {output:q} > {log:q} 2>&1"

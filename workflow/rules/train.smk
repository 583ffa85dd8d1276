# Training, one job per experiment, and test-time evaluation, one job per distinct run. Each job trains the resolved
# config the plan wrote (RESULTS/configs/<hash>.json); the run dir (checkpoints) lives in storage under that hash.
# The local outputs are small copies made only after the run's _SUCCESS marker, so a failed or preempted job leaves
# nothing that looks complete, and rerunning it resumes from the latest checkpoint.


rule train:
    input:
        staged=lambda wildcards: os.path.join(RESULTS, "staged", f"{PLAN[wildcards.exp].dataset}.txt"),
        config=lambda wildcards: config_file(wildcards.exp),
        same_run=same_run_trained_first,
    output:
        config=os.path.join(RESULTS, "runs", "{exp}", layout.CONFIG),
        metrics=os.path.join(RESULTS, "runs", "{exp}", layout.METRICS),
        final=os.path.join(RESULTS, "runs", "{exp}", layout.FINAL),
    params:
        trm=TRM,
        command=lambda wildcards: train_command(PLAN[wildcards.exp]),
        run_dir=lambda wildcards: run_url(wildcards.exp),
        local=lambda wildcards, output: os.path.dirname(output.final),
    message:
        "{resources.estimate}"
    resources:
        estimate=estimate_message,
        # One training job per TPU slice: a profile sets `resources: tpu=<slices>` (unlimited otherwise).
        tpu=1,
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "train", "{exp}.log"),
    benchmark:
        os.path.join(RESULTS, "benchmarks", "train", "{exp}.tsv")
    shell:
        # A finished run (trained by a same-config experiment or an earlier attempt) is only collected.
        "({params.trm:q} collect-run {params.run_dir:q} {params.local:q} || "
        "({params.command:q} && {params.trm:q} collect-run {params.run_dir:q} {params.local:q})) > {log:q} 2>&1"


rule evaluate:
    # Test-time scaling: the run's latest checkpoint (EMA weights when kept) on the whole test split, scored after
    # each of test_time_steps supervision steps in one pass, by the trainer's own evaluator and batch (so its figures
    # at train.eval_steps are the trainer's final ones). Only the first experiment of a shared run evaluates it.
    input:
        final=rules.train.output.final,
        staged=lambda wildcards: os.path.join(RESULTS, "staged", f"{PLAN[wildcards.exp].dataset}.txt"),
    output:
        json=os.path.join(RESULTS, "eval", "{exp}-steps.json"),
        csv=os.path.join(RESULTS, "eval", "{exp}-steps.csv"),
    params:
        trm=TRM,
        env=JAX_CACHE_ENV,
        run_dir=lambda wildcards: run_url(wildcards.exp),
        data=lambda wildcards: dataset_url(PLAN[wildcards.exp].dataset),
        steps=TEST_TIME_STEPS,
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "evaluate", "{exp}.log"),
    benchmark:
        os.path.join(RESULTS, "benchmarks", "evaluate", "{exp}.tsv")
    shell:
        "{params.env:q} {params.trm:q} evaluate --checkpoint {params.run_dir:q} --data {params.data:q} --split test "
        "--steps {params.steps:q} --out {output.json:q} > {log:q} 2>&1"


rule run_metrics:
    # One record per experiment for the table: the trainer's figures plus its run's test-time evaluation.
    input:
        config=rules.train.output.config,
        metrics=rules.train.output.metrics,
        final=rules.train.output.final,
        test_time=shared_evaluation,
    output:
        os.path.join(RESULTS, "eval", "{exp}.json"),
    params:
        trm=TRM,
        run=lambda wildcards, input: os.path.dirname(input.final),
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "run_metrics", "{exp}.log"),
    shell:
        "{params.trm:q} run-metrics {params.run:q} --test-time {input.test_time:q} --output {output:q} > {log:q} 2>&1"

# Training and evaluation, one job each per experiment. The run dir (checkpoints) lives in storage under its
# config hash; the local outputs are small copies made only after the run's _SUCCESS marker, so a failed or
# preempted job leaves nothing that looks complete, and rerunning it resumes from the latest checkpoint.


rule train:
    input:
        staged=lambda wildcards: os.path.join(RESULTS, "staged", f"{PLAN[wildcards.exp].dataset}.txt"),
        experiment=lambda wildcards: str(PLAN[wildcards.exp].path),
        base="config/base.yaml",
        same_run=same_run_trained_first,
    output:
        config=os.path.join(RESULTS, "runs", "{exp}", "config.json"),
        metrics=os.path.join(RESULTS, "runs", "{exp}", "metrics.jsonl"),
        final=os.path.join(RESULTS, "runs", "{exp}", "final.json"),
    params:
        trm=TRM,
        command=lambda wildcards: train_command(PLAN[wildcards.exp]),
        run_dir=lambda wildcards: run_url(wildcards.exp),
        local=lambda wildcards, output: os.path.dirname(output.final),
    message:
        "{resources.estimate}"
    resources:
        estimate=estimate_message,
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "train", "{exp}.log"),
    benchmark:
        os.path.join(RESULTS, "benchmarks", "train", "{exp}.tsv")
    shell:
        # A finished run (trained by a same-config experiment or an earlier attempt) is only collected.
        "({params.trm} collect-run {params.run_dir} {params.local} || "
        "({params.command} && {params.trm} collect-run {params.run_dir} {params.local})) > {log} 2>&1"


rule evaluate:
    # Reads the trainer's final evaluation (final.json); `trm evaluate` can replace this rule's command alone.
    input:
        config=rules.train.output.config,
        metrics=rules.train.output.metrics,
        final=rules.train.output.final,
    output:
        os.path.join(RESULTS, "eval", "{exp}.json"),
    params:
        trm=TRM,
        run=lambda wildcards, input: os.path.dirname(input.final),
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "evaluate", "{exp}.log"),
    shell:
        "{params.trm} run-metrics {params.run} --output {output} > {log} 2>&1"

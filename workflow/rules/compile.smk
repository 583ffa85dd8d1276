# Compile before paying: every selected experiment's paper-scale train and evaluation steps compiled for its slice
# type (launch.tpu.accelerator_type, or its launch.per_experiment one) on this machine (trm compile-check; libtpu,
# no TPU). Experiments whose steps are the same program (same architecture, batch, micro-batches, remat, optimizer;
# trm/launch/accelerators.py step_config) share one compile, kept as RESULTS/compile/<accelerator>/<step hash>.json
# (compile_dir and compile_targets in trm/study/costs.py); the dry run's chip-hours then use the compiled steps' roofline
# times. A step that does not fit a chip's HBM fails its job, naming what to change.
#   snakemake --profile tpu-v4-64 compile_check   (or without a profile: the same paper-scale steps)
rule compile_check:
    input:
        lambda wildcards: list(study.costs.compile_targets),


rule compile_step:
    output:
        os.path.join(config["results"], "compile", "{accelerator}", "{step}.json"),
    wildcard_constraints:
        step="[0-9a-f]{12}",
    params:
        trm=TRM,
        exp=lambda wildcards, output: study.costs.compile_targets[output[0]],
        folder=lambda wildcards, output: os.path.dirname(output[0]),
    message:
        "compile-check {params.exp} for a {wildcards.accelerator} (minutes at paper scale)"
    resources:
        # A paper-scale compile peaks at 5 to 8 GB of RAM (exp01c, exp02a_06): `--resources mem_mb=N` bounds how many run.
        mem_mb=8000,
    log:
        os.path.join(config["results"], "compile", "{accelerator}", "logs", "{step}.log"),
    shell:
        # Low priority: a compile takes minutes of CPU on the controller, beside running jobs.
        "nice -n 10 {params.trm:q} compile-check {params.exp:q} --accelerator {wildcards.accelerator:q} "
        "--cache {params.folder:q} > {log:q} 2>&1"


# The compiled figures the repository keeps, config/compiled/<accelerator>/<step hash>.json, which the plan reads
# where this machine has compiled nothing (a fresh clone): replaced by the selected experiments' figures, compiled
# here first where missing. After a change to a step's code or config, on the whole study, then commit config/compiled/:
#   snakemake --profile tpu-v4-64 --resources mem_mb=16000 compiled_figures
rule compiled_figures:
    input:
        lambda wildcards: list(study.costs.compile_targets),
    log:
        os.path.join(config["results"], "compile", "compiled_figures.log"),
    run:
        with open(log[0], "w") as stream:  # the files written
            print(*study.costs.commit_figures(input), sep="\n", file=stream)

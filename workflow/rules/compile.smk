# Compile before paying: every selected experiment's paper-scale train and evaluation steps compiled for the slice
# type launch.tpu.accelerator_type on this machine (trm compile-check; libtpu, no TPU). Experiments whose steps are
# the same program (same architecture, batch, micro-batches, remat, optimizer; trm/launch/accelerators.py
# step_config) share one compile, kept as COMPILE_DIR/<step hash>.json; the dry run's chip-hours then use the
# compiled steps' roofline times. A step that does not fit a chip's HBM fails its job, naming what to change.
#   snakemake --profile tpu-v4-64 compile_check   (or without a profile: the same paper-scale steps)
import functools

from trm.config import experiment_path, load_config
from trm.launch.accelerators import step_hash


@functools.cache
def compile_steps():
    """Step hash -> the first selected experiment with that paper-scale step (read only when compiling)."""
    steps = {}
    for exp_id in PLAN:
        steps.setdefault(step_hash(load_config(experiment_path(exp_id, "config/experiments"))), exp_id)
    return steps


rule compile_check:
    input:
        lambda wildcards: [os.path.join(COMPILE_DIR, f"{step}.json") for step in compile_steps()],


rule compile_step:
    output:
        os.path.join(COMPILE_DIR, "{step}.json"),
    wildcard_constraints:
        step="[0-9a-f]{12}",
    params:
        trm=TRM,
        exp=lambda wildcards: compile_steps()[wildcards.step],
        accelerator=config["launch"]["tpu"]["accelerator_type"],
        folder=COMPILE_DIR,
    message:
        "compile-check {params.exp} for a {params.accelerator} (minutes at paper scale)"
    resources:
        # A paper-scale compile peaks at 5 to 8 GB of RAM (exp01c, exp02a_06): `--resources mem_mb=N` bounds how many run.
        mem_mb=8000,
    conda:
        SOFTWARE
    log:
        os.path.join(COMPILE_DIR, "logs", "{step}.log"),
    shell:
        # Low priority: a compile takes minutes of CPU on the controller, beside running jobs.
        "nice -n 10 {params.trm:q} compile-check {params.exp:q} --accelerator {params.accelerator:q} "
        "--cache {params.folder:q} > {log:q} 2>&1"

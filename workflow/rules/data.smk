# Datasets: each distinct (training puzzles, augmentations) is built once, then staged to storage with a
# checksum manifest. The smoke scale builds from one offline pool of generated puzzles.


rule smoke_pool:
    output:
        os.path.join(RESULTS, "pool", "train.csv"),
        os.path.join(RESULTS, "pool", "test.csv"),
    params:
        trm=TRM,
        train=SMOKE_POOL["train"],
        test=SMOKE_POOL["test"],
        seed=config["seed"],
        folder=lambda wildcards, output: os.path.dirname(output[0]),
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "smoke_pool.log"),
    shell:
        "{params.trm} smoke-pool --train {params.train} --test {params.test} --seed {params.seed} "
        "--output-dir {params.folder} > {log} 2>&1"


rule build_dataset:
    input:
        dataset_source,
    output:
        directory(os.path.join(RESULTS, "datasets", "{dataset}")),
    params:
        trm=TRM,
        flags=build_flags,
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "build_dataset", "{dataset}.log"),
    shell:
        "{params.trm} build-dataset {params.flags} --output-dir {output} --force > {log} 2>&1"


rule stage_dataset:
    input:
        os.path.join(RESULTS, "datasets", "{dataset}"),
    output:
        os.path.join(RESULTS, "staged", "{dataset}.txt"),
    params:
        trm=TRM,
        url=lambda wildcards: dataset_url(wildcards.dataset),
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "stage_dataset", "{dataset}.log"),
    shell:
        # The receipt (the output) is written only after the staged copy verifies against its manifest.
        "({params.trm} stage {input} {params.url} && {params.trm} verify {params.url}) > {log} 2>&1 && "
        "echo {params.url} > {output}"

# Datasets: each distinct (training puzzles, augmentations) is built once, with a record of the checksums of
# its files (MANIFEST.json), then staged to storage: trm stage refuses files that no longer match the record,
# and the record becomes the staged copy's manifest. A local scale (smoke, mini) builds from one offline pool of
# generated puzzles on its board (trm/study/scale.py).


# The paper scale reads Sudoku-Extreme instead: no pool rule there.
if study.pool:

    rule puzzle_pool:
        output:
            os.path.join(RESULTS, "pool", "train.csv"),
            os.path.join(RESULTS, "pool", "test.csv"),
        params:
            trm=TRM,
            flags=study.pool_flags(),
            folder=lambda wildcards, output: os.path.dirname(output[0]),
        log:
            os.path.join(RESULTS, "logs", "puzzle_pool.log"),
        shell:
            "{params.trm:q} smoke-pool {params.flags:q} --output-dir {params.folder:q} > {log:q} 2>&1"


rule build_dataset:
    input:
        lambda wildcards: study.dataset_source(),
    output:
        directory(os.path.join(RESULTS, "datasets", "{dataset}")),
    params:
        trm=TRM,
        flags=lambda wildcards: study.build_flags(wildcards.dataset),
    log:
        os.path.join(RESULTS, "logs", "build_dataset", "{dataset}.log"),
    shell:
        "{params.trm:q} build-dataset {params.flags:q} --output-dir {output:q} --force > {log:q} 2>&1"


rule stage_dataset:
    input:
        os.path.join(RESULTS, "datasets", "{dataset}"),
    output:
        # A receipt of the copy in this storage: its folder names the storage (trm/study/plan.py `stage_receipt`).
        study.stage_receipt("{dataset}"),
    params:
        trm=TRM,
        url=lambda wildcards: study.dataset_url(wildcards.dataset),
    log:
        os.path.join(RESULTS, "logs", "stage_dataset", "{dataset}.log"),
    shell:
        # The receipt (the output) is written only after the staged copy verifies against its manifest.
        "({params.trm:q} stage {input:q} {params.url:q} && {params.trm:q} verify {params.url:q}) > {log:q} 2>&1 && "
        "printf '%s\\n' {params.url:q} > {output:q}"

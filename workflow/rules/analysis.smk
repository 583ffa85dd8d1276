# Analysis: one table of all selected runs (with companion CSVs), the verdict of each selected group's success
# criteria (config/groups.yaml), one plot per group, and the captions the HTML report shows them with.

VERDICTS = os.path.join(RESULTS, "verdicts")


rule aggregate:
    input:
        evals=expand(os.path.join(RESULTS, "eval", "{exp}.json"), exp=PLAN),
        runs=expand(os.path.join(RESULTS, "runs", "{exp}", "config.json"), exp=PLAN),
        groups="config/groups.yaml",
    output:
        csv=report(
            TABLE_FILES[0],
            caption="../report/table.rst",
            category="Table",
            labels={"table": "all runs"},
        ),
        parquet=TABLE_FILES[1],
        curves=f"{TABLE}-curves.csv",
        test_time=f"{TABLE}-test-time.csv",
    params:
        trm=TRM,
        ids=" ".join(PLAN),
        results=lambda wildcards, output: os.path.dirname(output.csv),
        table=lambda wildcards, output: output.csv.removesuffix(".csv"),
        accelerator=(
            f"--devices {DEVICES} --peak-flops {config['accelerator']['peak_flops']} "
            f"--utilization {config['accelerator']['utilization']} --test-puzzles {TEST_PUZZLES[config['scale']]}"
        ),
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "aggregate.log"),
    shell:
        "{params.trm} aggregate {params.ids} --results {params.results} --groups {input.groups} "
        "{params.accelerator} --output {params.table} > {log} 2>&1"


rule verdicts:
    input:
        csv=TABLE_FILES[0],
        groups="config/groups.yaml",
    output:
        json=os.path.join(VERDICTS, "verdicts.json"),
        md=report(
            os.path.join(VERDICTS, "verdicts.md"),
            caption="../report/verdicts.rst",
            category="Verdicts",
            labels={"verdicts": "all groups"},
        ),
        summary=os.path.join(VERDICTS, "verdicts.rst"),
        groups=expand(os.path.join(VERDICTS, "{group}.rst"), group=SELECTED_GROUPS),
    params:
        trm=TRM,
        scale=config["scale"],
        groups=" ".join(SELECTED_GROUPS),
        folder=lambda wildcards, output: os.path.dirname(output.json),
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "verdicts.log"),
    shell:
        "{params.trm} verdicts {params.groups} --table {input.csv} --groups {input.groups} "
        "--scale {params.scale} --output {params.folder} > {log} 2>&1"


rule plot_group:
    input:
        csv=TABLE_FILES[0],
        curves=f"{TABLE}-curves.csv",
        test_time=f"{TABLE}-test-time.csv",
        groups="config/groups.yaml",
        # Not read by the plot: the report's caption includes it (hypothesis, expected result, verdict).
        verdict=os.path.join(VERDICTS, "{group}.rst"),
    output:
        png=report(
            PLOT_FILES.replace("{ext}", "png"),
            caption="../report/plot.rst",
            category="Plots",
            labels={"group": "{group}"},
        ),
        svg=PLOT_FILES.replace("{ext}", "svg"),
    params:
        trm=TRM,
        table=lambda wildcards, input: input.csv.removesuffix(".csv"),
        stem=lambda wildcards, output: output.png.removesuffix(".png"),
    conda:
        SOFTWARE
    log:
        os.path.join(RESULTS, "logs", "plot", "{group}.log"),
    shell:
        "{params.trm} plot-group {wildcards.group} --table {params.table} --groups {input.groups} "
        "--output {params.stem} > {log} 2>&1"

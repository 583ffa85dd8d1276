# Analysis: one table of all selected runs (with companion CSVs), the verdict of each selected group's success
# criteria (config/groups.yaml), one plot per group, and the captions the HTML report shows them with; in ANALYSIS,
# the whole study's folder or a selection's own (trm/study/selection.py). A selection's table also holds the runs of
# the study's floor set it did not select, marked floor_only: the noise floor is always theirs.

VERDICTS = os.path.join(ANALYSIS, "verdicts")


rule aggregate:
    input:
        summaries=[study.run_summary(exp) for exp in PLAN],
        groups="config/groups.yaml",
    output:
        csv=report(
            TABLE_CSV,
            caption="../report/table.rst",
            category="Table",
            labels={"table": "all runs"},
        ),
        curves=f"{TABLE}-curves.csv",
        test_time=f"{TABLE}-test-time.csv",
        sampled=f"{TABLE}-sampled.csv",
    params:
        trm=TRM,
        ids=[exp for exp in PLAN if exp not in study.floor_only],
        floor_only=["--floor-only", *study.floor_only] if study.floor_only else [],
        # The per-run files' folder, where the summaries and job files are: each run's config is read from its job
        # file (a summary holds its hash and results, not its config), written at onstart.
        results=lambda wildcards: RESULTS,
        table=lambda wildcards, output: output.csv.removesuffix(".csv"),
        accelerator=[
            *("--peak-flops", config["accelerator"]["peak_flops"]),
            *("--utilization", config["accelerator"]["utilization"]),
            *("--test-puzzles", study.test_puzzles),
        ],
    log:
        os.path.join(ANALYSIS, "logs", "aggregate.log"),
    shell:
        "{params.trm:q} aggregate {params.ids:q} {params.floor_only:q} --results {params.results:q} "
        "--groups {input.groups:q} {params.accelerator:q} --output {params.table:q} > {log:q} 2>&1"


rule verdicts:
    input:
        csv=TABLE_CSV,
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
        test_puzzles=study.test_puzzles,
        groups=SELECTED_GROUPS,
        folder=lambda wildcards, output: os.path.dirname(output.json),
    log:
        os.path.join(ANALYSIS, "logs", "verdicts.log"),
    shell:
        "{params.trm:q} verdicts {params.groups:q} --table {input.csv:q} --groups {input.groups:q} "
        "--scale {params.scale:q} --test-puzzles {params.test_puzzles:q} --output {params.folder:q} > {log:q} 2>&1"


rule plot_group:
    input:
        csv=TABLE_CSV,
        curves=f"{TABLE}-curves.csv",
        test_time=f"{TABLE}-test-time.csv",
        sampled=f"{TABLE}-sampled.csv",
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
    log:
        os.path.join(ANALYSIS, "logs", "plot", "{group}.log"),
    shell:
        "{params.trm:q} plot-group {wildcards.group:q} --table {params.table:q} --groups {input.groups:q} "
        "--output {params.stem:q} > {log:q} 2>&1"

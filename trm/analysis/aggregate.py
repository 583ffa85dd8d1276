r"""Gather every run of the study into one table, the evaluation curves and test-time scaling (CSV files).

    trm aggregate --results results/smoke --groups config/groups.yaml \
        --peak-flops 5e10 --utilization 0.1 --test-puzzles 32 --output results/smoke/table exp01a exp01b \
        [--floor-only exp01c exp01c~s1 exp01c~s2]

Reads, per run id (an experiment id, or EXP~sK for its replicate k), RESULTS/runs/<id>.json (the run's summary,
`trm summarize`: its config hash and measured results), the job file that hash names, RESULTS/jobs/<hash>.json
(trm/launch/job.py: the run's resolved config, its one copy outside the run dir, read once per run). Writes
OUTPUT.csv (one row per run: its experiment `id` (replicates EXP~sK of experiment EXP are rows of EXP, told apart by
`seed` and `run`), group, varied keys, config hash, seed, run id, `config_key` (the hash of the config without
train.seed: equal for the replicates of one configuration, which the noise floor pools), `weights_sha256` (the
summary's digest of its final weights) and `floor_only` (true for the runs given after --floor-only: a selection's
table holds the study's floor set, whose seeds measure the noise floor, whether it selected them or not; its
verdicts and plots show only the others, trm/study/selection.py), then the metrics of trm/study/metrics.py's
RUN_METRICS in that order, then the config keys the groups plot, then for each metric of SUMMARY_METRICS its
experiment's mean, sd, n, 95% interval and the interval's source: columns {metric}_mean, _sd, _n, _low, _high,
_interval, the same on every row of the experiment; docs/statistics.md explains them), OUTPUT-curves.csv (test
accuracy per evaluation during training) and
OUTPUT-test-time.csv (test accuracy per number of supervision steps at test time, one row per run and step count),
OUTPUT-sampled.csv (the sampled recursion's figures, one row per run, step count and trajectories per puzzle),
each with the experiment's `id` and the `run`. Accelerator-hours are the run's measured wall hours (its summary's
wall time, over all its attempts, whichever job collected it; experiments with equal configs share the run and its
figures) x the devices the run trained on; the estimate column uses the FLOPs model of trm.study.estimate at the given peak FLOP/s and utilization.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from trm import storage
from trm.analysis.summary import SUMMARY_KEYS
from trm.config import config_value
from trm.errors import UserError, number
from trm.launch.job import job_path, read_job
from trm.study.estimate import accelerator_hours, evaluation_flops, model_costs, training_flops
from trm.study.groups import REFERENCE_GROUP, load_groups, load_references
from trm.study.metrics import (
    CURVE_METRICS,
    RUN_METRICS,
    SAMPLED_METRICS,
    SUMMARY_METRICS,
    TEST_TIME_FLOPS,
    TEST_TIME_METRICS,
)
from trm.study.plan import experiment_of, seedless_hash

if TYPE_CHECKING:  # pandas is imported where a table is made, so `trm aggregate --help` stays fast
    import pandas as pd

# `run` tells an experiment's seeds apart: EXP, or EXP~sK for its replicate k.
# The runs table's columns before its metrics: which run a row is, and what its seeds are replicates of.
# `weights_sha256`: the summary's digest of the run's final weights, equal only for bit-identical runs (the verdicts
# report a treatment whose runs are its reference's as having had no effect). `floor_only`: a run the table holds
# only for the noise floor (trm/study/selection.py).
RUN_TABLE_COLUMNS = (
    "id",
    "group",
    "baseline",
    "varied",
    "config_hash",
    "seed",
    "run",
    "config_key",
    "weights_sha256",
    "floor_only",
)
TEST_TIME_COLUMNS = ("id", "run", "group", "baseline", *TEST_TIME_METRICS, TEST_TIME_FLOPS.key)
SAMPLED_COLUMNS = ("id", "run", "group", "baseline", *SAMPLED_METRICS, TEST_TIME_FLOPS.key)
CURVE_COLUMNS = ("id", "run", "group", *CURVE_METRICS)


# What to do about a run summary that cannot be used: the workflow makes it again from the run dir, without
# training; it removes such a summary when it starts (`repair_summaries`).
RESUMMARIZE = "rerun snakemake, which summarises the finished run again without training"
MISSING_SUMMARY = "missing (`trm summarize` writes it when the run has finished)"


def _read_summary(path: Path, remedy: str = RESUMMARIZE) -> dict:
    """A run's summary; UserError naming the file and what to do (`remedy`) when `trm summarize` did not write it
    so (damaged, or of another version)."""
    summary = storage.read_json(str(path), MISSING_SUMMARY, remedy)
    missing = [key for key in SUMMARY_KEYS if not isinstance(summary, dict) or key not in summary]
    if missing:
        raise UserError(f"{path}: not a run summary of this version (no {', '.join(missing)}); {remedy}")
    return summary


def repair_summaries(paths: list[str], dry_run: bool) -> list[str]:
    """Remove the run summaries at `paths` that exist but cannot be used (damaged, or of another version), so that
    their runs' train jobs summarise the runs again (Snakemake sees a present output as done); one line each. A dry
    run removes nothing."""
    done = "a real run removes it and" if dry_run else "removed:"
    lines = []
    for path in filter(os.path.exists, paths):
        try:
            _read_summary(Path(path), f"{done} the run's train job summarises the finished run again")
        except UserError as err:
            if not dry_run:
                os.remove(path)
            lines.append(str(err))
    return lines


def _curve_subset(summary: dict, test_puzzles: int) -> int | None:
    """The puzzles the run's test-time curve (and its sampled recursion) scored, as its summary records them, where
    that is a subset of the split; None where the final evaluation scored them on the whole split."""
    counts = [r["count"] for r in (*summary["test_time"], *summary.get("sampled", []))]
    smallest = min(counts, default=test_puzzles)
    return int(smallest) if smallest < test_puzzles else None


def _config_of(results: Path, config_hash: str) -> dict:
    """The resolved config of the run `config_hash` names: its job file's, where the workflow wrote it."""
    path = job_path(str(results), config_hash)
    job = read_job(path)
    if job.run.config_hash != config_hash:
        raise UserError(
            f"{path}: the job of config {job.run.config_hash}, not {config_hash}: rerun snakemake, which rewrites it"
        )
    return job.run.config


def aggregate(
    ids: list[str],
    results: Path,
    groups_path: Path,
    peak_flops: float,
    utilization: float,
    test_puzzles: int,
    floor_only: list[str] = (),
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(runs, curves, test_time, sampled): one row per run with its config's varied keys, costs and metrics; one
    row per evaluation during training; one row per run and test-time step count; one row per run, step count and
    trajectories per puzzle of the sampled recursion. `ids` and then `floor_only` (runs in the table only for the
    noise floor) are run ids."""
    experiments_dir = groups_path.parent / "experiments"
    group_table = load_groups(groups_path, experiments_dir)
    groups = {m: g for g in group_table for m in g["members"]}
    labels = {}
    for ref in load_references(
        groups_path, experiments_dir, group_table
    ):  # group "reference", its label as varied
        groups[ref["id"]] = {"id": REFERENCE_GROUP, "varies": [], "baseline": None, "plots": []}
        labels[ref["id"]] = ref["label"]
    plot_keys = sorted(
        {k for g in groups.values() for k in g["varies"]}
        | {p["x"] for g in groups.values() for p in g["plots"] if "." in p["x"]}
    )
    rows, curves, test_time, sampled = [], [], [], []
    configs: dict[str, dict] = {}  # by config hash: experiments with equal configs share one run and job file
    for run_id in [*ids, *floor_only]:
        # A replicate's row (run EXP~sK) is a row of its experiment: `id` EXP, which every summary groups by.
        exp_id = experiment_of(run_id)
        summary = _read_summary(results / "runs" / f"{run_id}.json")
        if summary["config_hash"] not in configs:
            configs[summary["config_hash"]] = _config_of(results, summary["config_hash"])
        config = configs[summary["config_hash"]]
        group = groups[exp_id]
        is_baseline = exp_id == group["baseline"]
        costs = model_costs(config)
        # The training job's work: training, then the evaluations (the last one to the test-time counts).
        evaluated_steps = [result["steps"] for result in summary["test_time"]]
        trajectories = sorted({r["trajectories"] for r in summary.get("sampled", [])})
        flops = training_flops(config, costs) + evaluation_flops(
            config,
            costs,
            test_puzzles,
            evaluated_steps,
            summary["devices"],
            _curve_subset(summary, test_puzzles),
            trajectories,
        )
        arch = config["arch"]
        computed = {  # the table's own metrics (RUN_METRICS with source "table"); the rest are the summary's
            "parameter_count": costs["parameter_count"],
            "train_flops_per_example_step": costs["train_flops_per_example_step"],
            "run_flops": flops,
            "effective_depth": arch["H_cycles"] * (arch["L_cycles"] + 1) * arch["L_layers"],
            "accelerator_hours": None  # the run's own wall time, over all its attempts (trm summarize)
            if summary["wall_time_s"] is None
            else summary["wall_time_s"] * summary["devices"] / 3600.0,
            "estimated_accelerator_hours": accelerator_hours(flops, peak_flops, utilization),
        }
        values = {**computed, **{key: summary[key] for key in SUMMARY_METRICS}}
        rows.append(
            {
                "id": exp_id,
                "group": group["id"],
                "baseline": is_baseline,
                "varied": labels.get(exp_id)
                or ", ".join(f"{k.split('.')[-1]}={config_value(config, k)}" for k in group["varies"]),
                "config_hash": summary["config_hash"],
                "seed": config_value(config, "train.seed"),  # replicates of one experiment differ only here
                "run": run_id,
                "config_key": seedless_hash(config),  # equal for the replicates of one configuration
                "weights_sha256": summary["weights_sha256"],
                "floor_only": run_id in floor_only,
                **{key: values[key] for key in RUN_METRICS},
                **{key: config_value(config, key) for key in plot_keys},
            }
        )
        curves += [{"id": exp_id, "run": run_id, "group": group["id"], **point} for point in summary["curve"]]
        row = {"id": exp_id, "run": run_id, "group": group["id"], "baseline": is_baseline}
        step_flops = costs["eval_flops_per_example_step"]
        test_time += [
            {**row, **result, TEST_TIME_FLOPS.key: result["steps"] * step_flops}
            for result in summary["test_time"]
        ]
        sampled += [
            {**row, **result, TEST_TIME_FLOPS.key: result["trajectories"] * result["steps"] * step_flops}
            for result in summary.get("sampled", [])  # only a run whose final evaluation sampled has it
        ]
    import pandas as pd

    table = pd.DataFrame(rows)
    # Imported here, not at the top: judge brings scipy (seconds to import), which only building a table needs, not
    # the readers of this module's table helpers.
    from trm.analysis.judge import add_estimates, floor_ids, noise_floors

    floors = noise_floors(table, SUMMARY_METRICS, floor_ids(table), run_column="seed")
    table = add_estimates(table, SUMMARY_METRICS, floors, test_puzzles)
    return (
        table,
        pd.DataFrame(curves, columns=CURVE_COLUMNS),
        pd.DataFrame(test_time, columns=TEST_TIME_COLUMNS),
        pd.DataFrame(sampled, columns=SAMPLED_COLUMNS),
    )


def read_table(path: str | Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """Read a CSV that `trm aggregate` wrote, with `columns` among its own (RUN_TABLE_COLUMNS, CURVE_COLUMNS,
    TEST_TIME_COLUMNS); a missing, malformed or foreign file, or one without them, is a UserError naming it."""
    import pandas as pd

    try:
        table = pd.read_csv(path)
    except FileNotFoundError:
        raise UserError(
            f"{path}: missing; `trm aggregate` writes it (in the workflow: `snakemake --cores 2 aggregate`)"
        ) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise UserError(f"{path}: not a readable CSV table ({reason})") from None
    if not Path(path).read_bytes().endswith(b"\n"):  # pandas reads a row cut short as unmeasured cells
        raise storage.DamagedFile(
            f"{path}: damaged (cut short, or edited?): its last line is incomplete; delete it and rerun snakemake "
            "(or `trm aggregate`), which writes it again"
        )
    missing = [column for column in columns if column not in table.columns]
    if missing:
        raise UserError(f"{path}: no column {', '.join(missing)}: not a table written by `trm aggregate`")
    return table


def selected_runs(table: pd.DataFrame) -> pd.DataFrame:
    """The table's rows but those only there for the noise floor (`floor_only`): what verdicts and plots show."""
    return table[~table["floor_only"].astype(bool)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ids", nargs="+", help="run ids (EXP, or EXP~sK for a replicate), in table order")
    parser.add_argument(
        "--floor-only",
        nargs="+",
        default=[],
        metavar="ID",
        help="runs of the study's floor set that the table holds only for the noise floor",
    )
    parser.add_argument("--results", required=True, type=Path, help="results folder of one scale")
    parser.add_argument("--groups", required=True, type=Path, help="config/groups.yaml")
    parser.add_argument(
        "--peak-flops", type=number(float, above=0), required=True, help="peak FLOP/s of one device"
    )
    parser.add_argument(
        "--utilization",
        type=number(float, above=0, maximum=1),
        required=True,
        help="fraction of peak assumed in estimates",
    )
    parser.add_argument(
        "--test-puzzles",
        type=number(int, minimum=1),
        required=True,
        help="test puzzles of one final evaluation",
    )
    parser.add_argument(
        "--output",
        required=True,
        help="output path without suffix (.csv, -curves.csv, -test-time.csv, -sampled.csv)",
    )


def main(args: argparse.Namespace) -> int:
    runs, curves, test_time, sampled = aggregate(
        args.ids,
        args.results,
        args.groups,
        args.peak_flops,
        args.utilization,
        args.test_puzzles,
        args.floor_only,
    )
    output = Path(args.output)
    storage.write_text(str(output.with_suffix(".csv")), runs.to_csv(index=False))
    storage.write_text(str(output.with_name(output.name + "-curves.csv")), curves.to_csv(index=False))
    storage.write_text(str(output.with_name(output.name + "-test-time.csv")), test_time.to_csv(index=False))
    storage.write_text(str(output.with_name(output.name + "-sampled.csv")), sampled.to_csv(index=False))
    floor = f", {len(args.floor_only)} of them only for the noise floor" if args.floor_only else ""
    print(
        f"wrote {output}.csv ({len(runs)} runs{floor}), {output.name}-curves.csv, {output.name}-test-time.csv "
        f"and {output.name}-sampled.csv"
    )
    return 0

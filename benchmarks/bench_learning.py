"""Benchmark: what a local study learned, read from its results (it trains nothing).

For each scale whose results folder holds a whole study's table (RESULTS/<scale>/table.csv, verdicts/):
- the baseline's test exact and cell accuracy: each seed's, then their mean and 95% interval over seeds (the
  table's own figures for the floor configuration, the one the group baselines share);
- the copy-the-givens floor: the cell accuracy of answering every test puzzle with its givens (its exact accuracy
  is 0), over the test split of the scale's datasets;
- the criteria the verdicts decided (supported or not), by the metric each was judged on: exact accuracy, cell
  accuracy (a local scale's fallback where exact accuracy is 0 throughout) or another metric.

A scale whose baseline does not clear the copy floor, or whose baseline's exact accuracy interval reaches 0, did
not learn what its groups measure: the benchmark says so, and its verdicts are a pipeline check.

    .venv/bin/python benchmarks/bench_learning.py [--results results] [--scales smoke mini]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from trm.data.format import array_path

DECIDED = ("supported", "not supported")
METRIC_KINDS = {"test_exact_accuracy": "exact", "test_cell_accuracy": "cell"}


def copy_floor(results: Path) -> float | None:
    """Mean over the test puzzles of the givens' share of the cells (inputs: 1 = blank, 2.. = digits, 0 = pad):
    the cell accuracy of copying the givens. The local scales' datasets share one test split; None if none."""
    for dataset in sorted((results / "datasets").glob("*")):
        path = array_path(dataset, "test", "inputs")
        if path.is_file():
            inputs = np.load(path)
            return float(np.mean(np.sum(inputs > 1, axis=1) / np.sum(inputs > 0, axis=1)))
    return None


def baseline(table: pd.DataFrame) -> pd.DataFrame:
    """One row per seed of the floor configuration (the group baselines share its runs): the baseline rows'
    most-seeded config_key, one row per run dir (config_hash)."""
    rows = table[table["baseline"].astype(bool)].drop_duplicates("config_hash")
    key = rows["config_key"].value_counts().idxmax()
    return rows[rows["config_key"] == key]


def decided_by_metric(verdicts: dict) -> dict[str, int]:
    """The decided criteria, counted by the kind of metric they were judged on."""
    counts = {"exact": 0, "cell": 0, "other": 0}
    for group in verdicts["groups"]:
        for criterion in group["criteria"]:
            if criterion["verdict"] in DECIDED:
                counts[METRIC_KINDS.get(criterion["metric"], "other")] += 1
    return counts


def report(results: Path) -> list[str]:
    """The lines printed for one scale's results folder."""
    table = pd.read_csv(results / "table.csv")
    verdicts = json.loads((results / "verdicts" / "verdicts.json").read_text())
    seeds, floor = baseline(table), copy_floor(results)
    first = seeds.iloc[0]
    lines = [f"{results}: {len(table)} rows, baseline {first['id']} over {len(seeds)} seeds"]
    for metric, name in (("test_exact_accuracy", "exact"), ("test_cell_accuracy", "cell")):
        values = ", ".join(f"{v:.3f}" for v in seeds[metric])
        low, high = first[f"{metric}_low"], first[f"{metric}_high"]
        lines.append(
            f"  test {name} accuracy: {values}; mean {first[f'{metric}_mean']:.3f}, 95% interval [{low:.3f}, {high:.3f}]"
        )
    floor_text = "no test split found" if floor is None else f"{floor:.3f} cell accuracy, 0 exact"
    lines.append(f"  copy-the-givens floor: {floor_text}")
    counts = decided_by_metric(verdicts)
    total = sum(len(group["criteria"]) for group in verdicts["groups"])
    lines.append(
        f"  criteria decided: {sum(counts.values())} of {total}: {counts['exact']} on exact accuracy, "
        f"{counts['cell']} on cell accuracy, {counts['other']} on other metrics"
    )
    learned = first["test_exact_accuracy_low"] > 0 and (
        floor is None or (seeds["test_cell_accuracy"] > floor).all()
    )
    lines.append(
        "  learns: the baseline solves puzzles (interval above 0) and beats the copy floor"
        if learned
        else "  does NOT learn what its groups measure: its verdicts are a pipeline check"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--results", default="results", help="the workflow's results folder (default: results)"
    )
    parser.add_argument(
        "--scales", nargs="+", default=["smoke", "mini"], help="scales to report (default: both)"
    )
    args = parser.parse_args(argv)
    found = False
    for scale in args.scales:
        folder = Path(args.results) / scale
        if not (folder / "table.csv").is_file() or not (folder / "verdicts" / "verdicts.json").is_file():
            print(f"{folder}: no whole-study table and verdicts yet (snakemake --config scale={scale})")
            continue
        found = True
        print("\n".join(report(folder)))
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())

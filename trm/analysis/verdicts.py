r"""Judge each group's hypothesis on the results table: every success criterion of config/groups.yaml is judged
against the uncertainty of the differences it tests (trm.analysis.judge, docs/statistics.md), then a verdict per
group.

    trm verdicts --table results/paper/table.csv --groups config/groups.yaml --scale paper \
        --test-puzzles 423168 --output results/paper/verdicts

Reads the table of `trm aggregate` (one row per run; an experiment with several seeds has several rows). Judges
the given groups, or every group with a run in the table. A criterion is `supported` or `not supported` only when
the 95% interval of every difference it reads excludes the other outcome; `inconclusive` otherwise (with the
difference, its half-width and the seeds per point that would resolve it); `no signal` when its metric is the
same for every run it reads; `not enough data` when a member it needs has no row or did not measure the metric
(NaN); `no effect at this scale` when the runs of a member it compares are the same runs as those it is compared
with (the table's weights_sha256 and the same value: the treatment did not act). Single runs borrow the noise floor
measured on the seeds of the baselines and reference runs, and accuracies their sampling interval over the test
split's `--test-puzzles`. Rows marked `floor_only` (a selection's table holds the study's floor set for the
floor, trm/study/selection.py) measure the floor and are judged in no criterion. A group is not supported when any
criterion is not, supported when all are, lacks data when any criterion does, has no signal when none of its
criteria has any, has no effect at this scale when its criteria have no signal or no effect, and is inconclusive
otherwise. Writes OUTPUT/verdicts.json and OUTPUT/verdicts.md (every group),
OUTPUT/verdicts.rst (the summary table) and OUTPUT/<group>.rst (hypothesis, expected result and verdict: the HTML
report shows it under the group's plot). At a local scale (trm/study/scale.py, `cell_fallback`) a criterion on
exact accuracy is judged on cell accuracy when exact accuracy is 0 for every run of the group (as the plots do,
with a caveat), except one against a fixed `value` (a published exact accuracy, which no cell accuracy compares
with); every output carries the scale's note on what its verdicts can say.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from trm import storage
from trm.analysis.aggregate import RUN_TABLE_COLUMNS, read_table, selected_runs
from trm.analysis.judge import (
    PUZZLE_SD_COLUMNS,
    floor_ids,
    judge_criterion,
    judged_metric,
    needed_members,
    noise_floors,
    puzzle_sds,
    samples_by_experiment,
    weights_by_experiment,
)
from trm.analysis.uncertainty import (
    INCONCLUSIVE,
    NO_DATA,
    NO_EFFECT,
    NO_SIGNAL,
    NOT_SUPPORTED,
    SUPPORTED,
)
from trm.errors import UserError, number
from trm.study.groups import load_groups
from trm.study.metrics import CELL_FALLBACK
from trm.study.scale import SCALES, scale_of

if TYPE_CHECKING:  # pandas is imported where a table is read, so `trm verdicts --help` stays fast
    import pandas as pd

OUTCOMES = (SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, NO_EFFECT, NO_SIGNAL, NO_DATA)


def evaluate_criterion(
    criterion: dict, group: dict, table: pd.DataFrame, scale: str, floors: dict, test_puzzles: int | None
) -> dict:
    """One criterion judged on the table's runs (judge.judge_criterion) on the metric judged_metric picks for
    the scale; `floors`: each metric's noise floor (judge.noise_floors)."""
    in_group = table[table["id"].isin(group["members"])]
    metric, caveat = judged_metric(
        criterion["metric"], samples_by_experiment(in_group, criterion["metric"]), scale
    )
    if (
        "value" in criterion
    ):  # a published figure of the criterion's own metric: no other metric compares with it
        metric, caveat = criterion["metric"], ""
    present = set(table["id"].astype(str))
    absent = [m for m in needed_members(criterion, group) if m not in present]
    base = {"text": criterion["text"], "check": criterion["check"], "caveat": caveat}
    if absent:
        return {
            **base,
            "metric": metric,
            "verdict": NO_DATA,
            "detail": f"no run in the table: {', '.join(absent)}",
            "estimates": {},
            "comparisons": [],
        }
    samples = samples_by_experiment(table, metric)
    judged = judge_criterion(
        {**criterion, "metric": metric},
        group,
        samples,
        floors.get(metric),
        test_puzzles,
        puzzle_sds(table, metric),
        weights_by_experiment(table),
    )
    return {**base, **judged}


def group_verdict(verdicts: list[str]) -> str:
    """Not supported when any criterion is not; supported when all are; not enough data when any criterion lacks
    it; no signal when no criterion has any; no effect at this scale when the others have none because the
    treatment did not act; otherwise inconclusive."""
    if NOT_SUPPORTED in verdicts:
        return NOT_SUPPORTED
    if all(v == SUPPORTED for v in verdicts):
        return SUPPORTED
    if NO_DATA in verdicts:
        return NO_DATA
    if all(v == NO_SIGNAL for v in verdicts):
        return NO_SIGNAL
    if all(v in (NO_SIGNAL, NO_EFFECT) for v in verdicts):
        return NO_EFFECT
    return INCONCLUSIVE


def evaluate_group(
    group: dict, table: pd.DataFrame, scale: str, floors: dict, test_puzzles: int | None
) -> dict:
    """Every criterion of one group judged on the table, with the group's verdict and guide summary."""
    criteria = [evaluate_criterion(c, group, table, scale, floors, test_puzzles) for c in group["criteria"]]
    return {
        "id": group["id"],
        "title": group["title"],
        "hypothesis": group["hypothesis"],
        "expected": group["expected"],
        "verdict": group_verdict([c["verdict"] for c in criteria]),
        "criteria": criteria,
    }


def _check_numbers(table: pd.DataFrame, metrics: list[str], source: str) -> None:
    """Every cell of the metric columns is a number or empty (not measured): name the first that is not."""
    import pandas as pd

    for metric in metrics:
        cells = table[metric]
        bad = cells.notna() & pd.to_numeric(cells, errors="coerce").isna()
        if bad.any():
            row = table[bad].iloc[0]
            raise UserError(
                f"{source}: column {metric}, row {row['id']}: {row[metric]!r} is not a number "
                "(an empty cell means not measured; rewrite the table with `trm aggregate`)"
            )


def judge_groups(
    groups: list[dict],
    table: pd.DataFrame,
    scale: str,
    test_puzzles: int | None,
    source: str = "the results table",
) -> dict:
    """Every criterion of every given group judged on the table, with the scale and its caveat. `test_puzzles`:
    the test split's size (the sampling interval of a single run's accuracy); None ignores sampling."""
    note = scale_of(scale).note
    metrics = sorted({c["metric"] for g in groups for c in g["criteria"]})
    # At a local scale a criterion may be judged on cell accuracy instead (judge.judged_metric).
    metrics += sorted({CELL_FALLBACK[m] for m in metrics if m in CELL_FALLBACK} - set(metrics))
    sds = [PUZZLE_SD_COLUMNS[m] for m in metrics if m in PUZZLE_SD_COLUMNS]
    absent = [c for c in (*RUN_TABLE_COLUMNS, *metrics, *sds) if c not in table.columns]
    if absent:
        raise UserError(f"{source} has no column {', '.join(absent)} (is it `trm aggregate`'s table?)")
    _check_numbers(table, metrics + sds, source)
    floors = noise_floors(table, metrics, floor_ids(table))
    judged = selected_runs(table)
    return {
        "scale": scale,
        "note": note,
        "groups": [evaluate_group(g, judged, scale, floors, test_puzzles) for g in groups],
    }


# ---------------------------------------------------------------------------------------------------- outputs


def outcome_counts(verdicts: list[str]) -> str:
    """'2 supported, 1 inconclusive': how many of the given verdicts have each outcome (those that occur)."""
    return ", ".join(f"{verdicts.count(v)} {v}" for v in OUTCOMES if v in verdicts)


def _points(criterion: dict) -> str:
    """Each member read: its mean, n and interval, with the sources of the intervals: 'a 0.39 [0.21, 0.57] (n=1),
    ...; intervals: sampling only'."""
    estimates = criterion["estimates"]
    if not estimates:
        return ""
    parts = []
    for member, s in estimates.items():
        interval = (
            f" [{s['low']:.3g}, {s['high']:.3g}]" if s["low"] is not None and s["high"] is not None else ""
        )
        mean = "not measured" if s["mean"] is None else f"{s['mean']:.3g}"
        parts.append(f"{member} {mean}{interval} (n={s['n']})")
    sources = ", ".join(dict.fromkeys(s["source"] for s in estimates.values()))
    return f"{'; '.join(parts)}; intervals: {sources}"


def criterion_lines(criterion: dict) -> list[str]:
    """A criterion as text: its verdict and claim, then the metric judged (or the caveat of a replaced one), the
    points read with their n, and the differences judged."""
    lines = [
        f"{criterion['verdict']}: {criterion['text'].rstrip('.')}",
        criterion["caveat"] or f"judged on {criterion['metric']}",
    ]
    points = _points(criterion)
    if points:
        lines.append(f"points: {points}")
    lines.append(criterion["detail"])
    return lines


def _bullet(criterion: dict, escape=lambda text: text) -> str:
    """One markdown or reStructuredText list item (`escape`: _rst for the latter)."""
    head, *rest = criterion_lines(criterion)
    verdict, text = head.split(": ", 1)
    return f"- **{verdict}**: {escape(text)}. " + ". ".join(escape(line) for line in rest) + "."


def to_markdown(result: dict) -> str:
    """verdicts.md: a summary table, then per group its hypothesis, expected result and criteria."""
    lines = [f"# Verdicts of the study's hypotheses (scale: {result['scale']})", ""]
    if result["note"]:
        lines += [f"> **{result['note']}**", ""]
    lines += [
        "Written by `trm verdicts` from the results table and the criteria of config/groups.yaml; each group's",
        "guide is docs/experiments/<group>.md. A criterion is decided only when the 95% interval of the difference",
        "it tests excludes the other outcome (docs/statistics.md); n is the number of runs (seeds) of each point.",
        "",
        "| group | title | verdict | criteria |",
        "|---|---|---|---|",
    ]
    for g in result["groups"]:
        counts = outcome_counts([c["verdict"] for c in g["criteria"]])
        lines.append(f"| {g['id']} | {g['title']} | {g['verdict']} | {counts} |")
    every = [c["verdict"] for g in result["groups"] for c in g["criteria"]]
    lines += ["", f"All criteria: {outcome_counts(every)}."]
    for g in result["groups"]:
        lines += [
            "",
            f"## {g['id']}: {g['title']}: {g['verdict']}",
            "",
            f"**Hypothesis.** {g['hypothesis']}",
            "",
            f"**Expected.** {g['expected']}",
            "",
        ]
        lines += [_bullet(c) for c in g["criteria"]]
    return "\n".join(lines) + "\n"


def _rst(text: str) -> str:
    """Plain text as reStructuredText: ids such as exp02a_01 or a `*` must not become markup."""
    for char in "\\*`|_":
        text = text.replace(char, "\\" + char)
    return text


def group_rst(group: dict, result: dict) -> str:
    """OUTPUT/<group>.rst: what the report shows under the group's plot."""
    counts = outcome_counts([c["verdict"] for c in group["criteria"]])
    lines = [
        f"**Hypothesis.** {_rst(group['hypothesis'])}",
        "",
        f"**Expected.** {_rst(group['expected'])}",
        "",
        f"**Verdict at the {result['scale']} scale: {group['verdict']}.** Criteria: {counts}.",
    ]
    if result["note"]:
        lines[-1] += f" *{_rst(result['note'])}*"
    lines.append("")
    lines += [_bullet(c, _rst) for c in group["criteria"]]
    return "\n".join(lines) + "\n"


def summary_rst(result: dict) -> str:
    """OUTPUT/verdicts.rst: one line per group, for the caption of the report's verdicts entry."""
    lines = [f"**Verdicts at the {result['scale']} scale.**"]
    if result["note"]:
        lines[0] += f" *{_rst(result['note'])}*"
    lines.append("")
    for g in result["groups"]:
        counts = outcome_counts([c["verdict"] for c in g["criteria"]])
        lines.append(f"- {_rst(g['id'])} ({_rst(g['title'])}): **{g['verdict']}** (criteria: {counts})")
    return "\n".join(lines) + "\n"


def _select(groups: list[dict], table: pd.DataFrame, wanted: list[str], table_path: str) -> list[dict]:
    by_id = {g["id"]: g for g in groups}
    unknown = [g for g in wanted if g not in by_id]
    if unknown:
        raise UserError(f"unknown group {', '.join(unknown)}: one of {', '.join(by_id)}")
    if wanted:
        return [by_id[g] for g in wanted]
    present = set(selected_runs(table)["id"])
    selected = [g for g in groups if present & set(g["members"])]
    if not selected:
        raise UserError(f"{table_path}: no run of any group of the study")
    return selected


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "group", nargs="*", help="groups to judge (default: every group with a run in the table)"
    )
    parser.add_argument("--table", required=True, help="the results table, table.csv of `trm aggregate`")
    parser.add_argument("--groups", required=True, type=Path, help="config/groups.yaml")
    parser.add_argument("--scale", required=True, choices=SCALES, help="the scale the runs were trained at")
    parser.add_argument(
        "--test-puzzles",
        type=number(int, minimum=1),
        required=True,
        help="test puzzles of one final evaluation (as for aggregate)",
    )
    parser.add_argument("--output", required=True, type=Path, help="folder for the verdict files")


def main(args: argparse.Namespace) -> int:
    table = read_table(args.table, RUN_TABLE_COLUMNS)
    groups = _select(
        load_groups(args.groups, args.groups.parent / "experiments"), table, args.group, args.table
    )
    result = judge_groups(groups, table, args.scale, args.test_puzzles, source=str(args.table))
    files = {
        "verdicts.json": json.dumps(result, indent=2) + "\n",
        "verdicts.md": to_markdown(result),
        "verdicts.rst": summary_rst(result),
        **{f"{g['id']}.rst": group_rst(g, result) for g in result["groups"]},
    }
    for name, text in files.items():
        storage.write_text(str(args.output / name), text)
    summary = outcome_counts([g["verdict"] for g in result["groups"]])
    print(
        f"wrote verdicts.json, .md, .rst and {len(result['groups'])} group files to {args.output}: {summary}"
    )
    if result["note"]:
        print(result["note"])
    return 0

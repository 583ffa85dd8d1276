r"""Judge each group's hypothesis on the results table: every success criterion of config/groups.yaml is
`supported`, `not supported` or `not enough data`, with the numbers it compared; then a verdict per group.

    trm verdicts --table results/paper/table.csv --groups config/groups.yaml --scale paper \
        --output results/paper/verdicts

Reads the table of `trm aggregate` (one row per experiment). Judges the given groups, or every group with a run
in the table. A criterion lacks data when one of the members it needs has no row or the run did not measure the
metric (NaN). A group is supported when all its criteria are, not supported when any is not, and lacks data
otherwise. Writes OUTPUT/verdicts.json and OUTPUT/verdicts.md (every group), OUTPUT/verdicts.rst (the summary
table) and OUTPUT/<group>.rst (hypothesis, expected result and verdict: the HTML report shows it under the
group's plot). At the smoke scale the verdicts are computed the same way, and every output says that the runs are
too short to test anything.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING

from trm import storage
from trm.analysis.aggregate import read_table
from trm.errors import UserError
from trm.study.groups import format_number as _fmt
from trm.study.groups import load_groups
from trm.study.groups import signed as _signed
from trm.study.metrics import CRITERION_METRICS
from trm.study.scale import SCALES

if TYPE_CHECKING:  # pandas is imported where a table is read, so `trm verdicts --help` stays fast
    import pandas as pd

SUPPORTED, NOT_SUPPORTED, NO_DATA = "supported", "not supported", "not enough data"
SMOKE_NOTE = (
    "smoke scale: these runs are too short to test the hypothesis; the verdicts only show that the criteria "
    "are evaluated."
)
# Accuracies are ratios of puzzle counts: 0.87 - 0.86 must count as within a tolerance of 0.01.
SLACK = 1e-9


def _listing(ids: list[str], values: dict[str, float]) -> str:
    return ", ".join(f"{m} {_fmt(values[m])}" for m in ids)


def _reference(criterion: dict, values: dict[str, float]) -> tuple[float, str]:
    """The value members are compared with (a number, or the highest of the reference members) and its label."""
    if "value" in criterion:
        return float(criterion["value"]), _fmt(criterion["value"])
    reference = criterion["reference"]
    best = max(reference, key=values.__getitem__)
    if len(reference) == 1:
        return values[best], f"{best} {_fmt(values[best])}"
    return values[best], f"the highest of {', '.join(reference)}, {best} {_fmt(values[best])}"


def within(criterion: dict, values: dict[str, float], group: dict) -> tuple[bool, str]:
    """|member - reference| <= tolerance for every member."""
    ref, label = _reference(criterion, values)
    tolerance = criterion["tolerance"]
    members = criterion["members"]
    worst = max(members, key=lambda m: abs(values[m] - ref))
    gap = abs(values[worst] - ref)
    ok = gap <= tolerance + SLACK
    return ok, (
        f"{_listing(members, values)} against {label}: largest difference {_fmt(gap)} "
        f"({worst}) {'<=' if ok else '>'} tolerance {_fmt(tolerance)}"
    )


def _bound(criterion: dict, values: dict[str, float], at_least: bool) -> tuple[bool, str]:
    ref, label = _reference(criterion, values)
    margin = criterion.get("margin", 0)
    bound = ref + margin
    members = criterion["members"]
    if at_least:
        worst = min(members, key=values.__getitem__)
        ok = values[worst] >= bound - SLACK
    else:
        worst = max(members, key=values.__getitem__)
        ok = values[worst] <= bound + SLACK
    sign = ">=" if at_least else "<="
    limit = f"{label} {_signed(margin)} = {_fmt(bound)}" if margin else label
    verdict = "holds" if ok else f"{worst} {_fmt(values[worst])} does not"
    return ok, f"{_listing(members, values)}; needs {sign} {limit}: {verdict}"


def at_least(criterion: dict, values: dict[str, float], group: dict) -> tuple[bool, str]:
    """member >= reference + margin for every member."""
    return _bound(criterion, values, at_least=True)


def at_most(criterion: dict, values: dict[str, float], group: dict) -> tuple[bool, str]:
    """member <= reference + margin for every member."""
    return _bound(criterion, values, at_least=False)


def best_is_one_of(criterion: dict, values: dict[str, float], group: dict) -> tuple[bool, str]:
    """The group member with the best metric (the highest, or the lowest where lower is better:
    trm/study/metrics.py) is one of the criterion's members (a tie counts)."""
    sign = 1 if CRITERION_METRICS[criterion["metric"]].higher_is_better else -1
    best = max(group["members"], key=lambda m: sign * values[m])
    ok = any(sign * values[m] >= sign * values[best] - SLACK for m in criterion["members"])
    return ok, (
        f"{'highest' if sign > 0 else 'lowest'}: {best} {_fmt(values[best])}; candidates "
        f"{_listing(criterion['members'], values)}: {'one of them is the best' if ok else 'none is the best'}"
    )


def monotonic(criterion: dict, values: dict[str, float], group: dict) -> tuple[bool, str]:
    """Over the members in order, no step moves against the direction by more than the tolerance."""
    members = criterion["members"]
    tolerance = criterion.get("tolerance", 0)
    sign = 1 if criterion["direction"] == "increasing" else -1
    # The largest step against the direction (negative when every step goes the right way).
    against, where = max((sign * (values[a] - values[b]), (a, b)) for a, b in itertools.pairwise(members))
    ok = against <= tolerance + SLACK
    path = " -> ".join(f"{m} {_fmt(values[m])}" for m in members)
    wrong_way = "falls" if sign > 0 else "rises"
    if ok:
        return ok, f"{path}: never {wrong_way} by more than {_fmt(tolerance)}"
    return (
        ok,
        f"{path}: {wrong_way} by {_fmt(against)} from {where[0]} to {where[1]} (tolerance {_fmt(tolerance)})",
    )


CHECKS = {
    "within": within,
    "at_least": at_least,
    "at_most": at_most,
    "best_is_one_of": best_is_one_of,
    "monotonic": monotonic,
}


def needed_members(criterion: dict, group: dict) -> list[str]:
    """The members whose metric the criterion reads (every member for best_is_one_of)."""
    if criterion["check"] == "best_is_one_of":
        return list(group["members"])
    return list(dict.fromkeys(criterion["members"] + criterion.get("reference", [])))


def evaluate_criterion(criterion: dict, group: dict, table: pd.DataFrame) -> dict:
    """One criterion judged on the table (one row per experiment id): verdict, detail and the values read."""
    import pandas as pd

    metric = criterion["metric"]
    rows = table.set_index("id")[metric]
    values: dict[str, float | None] = {}
    absent, unmeasured = [], []
    for member in needed_members(criterion, group):
        value = rows.get(member)
        if value is None:
            absent.append(member)
        elif pd.isna(value):
            unmeasured.append(member)
        values[member] = None if value is None or pd.isna(value) else float(value)
    if absent or unmeasured:
        verdict = NO_DATA
        detail = "; ".join(
            ([f"no run in the table: {', '.join(absent)}"] if absent else [])
            + ([f"{metric} not measured: {', '.join(unmeasured)}"] if unmeasured else [])
        )
    else:
        ok, detail = CHECKS[criterion["check"]](criterion, values, group)
        verdict = SUPPORTED if ok else NOT_SUPPORTED
    return {
        "text": criterion["text"],
        "check": criterion["check"],
        "metric": metric,
        "verdict": verdict,
        "detail": detail,
        "values": values,
    }


def group_verdict(verdicts: list[str]) -> str:
    """Supported when every criterion is, not supported when any is not, otherwise not enough data."""
    if NOT_SUPPORTED in verdicts:
        return NOT_SUPPORTED
    if all(v == SUPPORTED for v in verdicts):
        return SUPPORTED
    return NO_DATA


def evaluate_group(group: dict, table: pd.DataFrame) -> dict:
    """Every criterion of one group judged on the table, with the group's verdict and guide summary."""
    criteria = [evaluate_criterion(c, group, table) for c in group["criteria"]]
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


def evaluate(groups: list[dict], table: pd.DataFrame, scale: str, source: str = "the results table") -> dict:
    """Every criterion of every given group judged on the table, with the scale and its caveat."""
    if scale not in SCALES:
        raise UserError(f"unknown scale {scale!r}: one of {', '.join(SCALES)}")
    metrics = sorted({c["metric"] for g in groups for c in g["criteria"]})
    absent = sorted(({"id"} | set(metrics)) - set(table.columns))
    if absent:
        raise UserError(f"{source} has no column {', '.join(absent)} (is it `trm aggregate`'s table?)")
    _check_numbers(table, metrics, source)
    return {
        "scale": scale,
        "note": SMOKE_NOTE if scale == "smoke" else "",
        "groups": [evaluate_group(g, table) for g in groups],
    }


# ---------------------------------------------------------------------------------------------------- outputs


def to_markdown(result: dict) -> str:
    """verdicts.md: a summary table, then per group its hypothesis, expected result and criteria."""
    lines = [f"# Verdicts of the study's hypotheses (scale: {result['scale']})", ""]
    if result["note"]:
        lines += [f"> **{result['note']}**", ""]
    lines += [
        "Written by `trm verdicts` from the results table and the criteria of config/groups.yaml; each group's",
        "guide is docs/experiments/<group>.md.",
        "",
        "| group | title | verdict | criteria supported |",
        "|---|---|---|---|",
    ]
    for g in result["groups"]:
        supported = sum(c["verdict"] == SUPPORTED for c in g["criteria"])
        lines.append(f"| {g['id']} | {g['title']} | {g['verdict']} | {supported} of {len(g['criteria'])} |")
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
        lines += [f"- **{c['verdict']}**: {c['text']} ({c['detail']})" for c in g["criteria"]]
    return "\n".join(lines) + "\n"


def _rst(text: str) -> str:
    """Plain text as reStructuredText: ids such as exp02a_01 or a `*` must not become markup."""
    for char in "\\*`|_":
        text = text.replace(char, "\\" + char)
    return text


def group_rst(group: dict, result: dict) -> str:
    """OUTPUT/<group>.rst: what the report shows under the group's plot."""
    lines = [
        f"**Hypothesis.** {_rst(group['hypothesis'])}",
        "",
        f"**Expected.** {_rst(group['expected'])}",
        "",
        f"**Verdict at the {result['scale']} scale: {group['verdict']}.**",
    ]
    if result["note"]:
        lines[-1] += f" *{_rst(result['note'])}*"
    lines.append("")
    lines += [f"- **{c['verdict']}**: {_rst(c['text'])} ({_rst(c['detail'])})" for c in group["criteria"]]
    return "\n".join(lines) + "\n"


def summary_rst(result: dict) -> str:
    """OUTPUT/verdicts.rst: one line per group, for the caption of the report's verdicts entry."""
    lines = [f"**Verdicts at the {result['scale']} scale.**"]
    if result["note"]:
        lines[0] += f" *{_rst(result['note'])}*"
    lines.append("")
    for g in result["groups"]:
        supported = sum(c["verdict"] == SUPPORTED for c in g["criteria"])
        lines.append(
            f"- {_rst(g['id'])} ({_rst(g['title'])}): **{g['verdict']}** "
            f"({supported} of {len(g['criteria'])} criteria supported)"
        )
    return "\n".join(lines) + "\n"


def _select(groups: list[dict], table: pd.DataFrame, wanted: list[str], table_path: str) -> list[dict]:
    by_id = {g["id"]: g for g in groups}
    unknown = [g for g in wanted if g not in by_id]
    if unknown:
        raise UserError(f"unknown group {', '.join(unknown)}: one of {', '.join(by_id)}")
    if wanted:
        return [by_id[g] for g in wanted]
    present = set(table["id"]) if "id" in table.columns else set()
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
    parser.add_argument("--output", required=True, type=Path, help="folder for the verdict files")


def main(args: argparse.Namespace) -> int:
    table = read_table(args.table, columns=("id",))
    groups = _select(
        load_groups(args.groups, args.groups.parent / "experiments"), table, args.group, args.table
    )
    result = evaluate(groups, table, args.scale, source=str(args.table))
    files = {
        "verdicts.json": json.dumps(result, indent=2) + "\n",
        "verdicts.md": to_markdown(result),
        "verdicts.rst": summary_rst(result),
        **{f"{g['id']}.rst": group_rst(g, result) for g in result["groups"]},
    }
    for name, text in files.items():
        storage.write_text(str(args.output / name), text)
    counts = {
        v: sum(g["verdict"] == v for g in result["groups"]) for v in (SUPPORTED, NOT_SUPPORTED, NO_DATA)
    }
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    print(
        f"wrote verdicts.json, .md, .rst and {len(result['groups'])} group files to {args.output}: {summary}"
    )
    if result["note"]:
        print(result["note"])
    return 0

"""A selection of the study: where its table, verdicts and plots go, and the runs its noise floor needs.

The whole study (every experiment: `experiments: all` and `groups: all`) writes its analysis in RESULTS (results/
<scale>/table.csv, plots/, verdicts/). A selection (`--config experiments=[...]` or `groups=[...]`) writes its own
in RESULTS/selections/<name>/, so a selection never overwrites the whole study's. Its name is derived from what it
selects: the experiment ids (`exp01a`, `exp01a+exp06_c`), or `groups-<ids>` when it is whole groups with the
reference runs (`groups-exp06`); past MAX_NAME characters the first id, how many follow and a hash of the whole list
(`exp01a+11-more-3f2a9c1b`). The per-run files (runs/, jobs/, benchmarks/, logs/train/) stay shared.

A one-run experiment's interval borrows the noise floor, the seed spread pooled over the study's floor set:
every group's baseline member with its replicates, and the reference runs (trm/analysis/judge.py floor_ids). So
that the floor, hence every interval and verdict, does not depend on which experiments a selection runs, a
selection trains and tables the floor set's runs that measure it too (those of a configuration with 2 or more
seeds: a lone seed measures no spread); the table marks those it did not select `floor_only` (docs/statistics.md).
Experiments with equal configs share runs and the floor counts each run once, so one id per distinct run is enough:
at the smoke scale the 43 ids of the floor set are 4 runs, of which the 3 seeds of the baselines measure it.
"""

from __future__ import annotations

import hashlib

SELECTIONS = "selections"  # RESULTS/selections/<name>/: a selection's table, verdicts and plots
MAX_NAME = 48  # longer names are shortened (a folder name stays readable in a listing)


def floor_set(groups: list[dict], references: list[str]) -> list[str]:
    """The experiments whose seeds measure the noise floor: every group's baseline, then the reference runs."""
    return list(dict.fromkeys([*(g["baseline"] for g in groups), *references]))


def _shortened(ids: list[str], prefix: str = "") -> str:
    name = prefix + "+".join(ids)
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(",".join(ids).encode()).hexdigest()[:8]
    return f"{prefix}{ids[0]}+{len(ids) - 1}-more-{digest}"


def selection_name(selected: list[str], groups: list[dict], references: list[str]) -> str | None:
    """The folder name of a selection of experiments (ids, in plan order: no replicates, no floor-only runs); None
    for the whole study (every member of every group and every reference run)."""
    chosen = set(selected)
    if chosen == {m for g in groups for m in g["members"]} | set(references):
        return None
    touched = [g for g in groups if chosen & set(g["members"])]
    if touched and chosen == {m for g in touched for m in g["members"]} | set(references):
        return _shortened([g["id"] for g in touched], "groups-")
    return _shortened(selected)

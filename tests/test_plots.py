"""Group plots: where a group's exact accuracy is 0 for every run (short smoke runs), the panels draw cell accuracy
and say so; where any run is exactly right somewhere, they draw exact accuracy."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from trm.analysis.plots import FALLBACK_TITLE, plot_group
from trm.study.groups import GROUPS_PATH, load_groups


def tables(group: dict, exact: float) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Runs, curves and test-time rows for every member: cell accuracy 0.3 + 0.1 i, exact accuracy `exact`."""
    members = group["members"]
    runs = pd.DataFrame(
        {
            "id": members,
            "group": group["id"],
            "varied": [f"m{i}" for i in range(len(members))],
            "baseline": [m == group["baseline"] for m in members],
            "test_exact_accuracy": exact,
            "test_cell_accuracy": [0.3 + 0.1 * i for i in range(len(members))],
        }
    )
    curves = pd.DataFrame(
        [
            {
                "id": m,
                "group": group["id"],
                "epoch": epoch,
                "test_exact_accuracy": exact,
                "test_cell_accuracy": 0.2,
            }
            for m in members
            for epoch in (36, 72)
        ]
    )
    test_time = pd.DataFrame(
        [
            {
                "id": m,
                "group": group["id"],
                "baseline": False,
                "steps": k,
                "exact_accuracy": exact,
                "accuracy": 0.4,
            }
            for m in members
            for k in (16, 32)
        ]
    )
    return runs, curves, test_time


def test_a_group_never_exactly_right_is_plotted_in_cell_accuracy_and_says_so(tmp_path: Path):
    group = next(g for g in load_groups() if g["id"] == "exp09")  # a curve panel and the test-time panel
    for exact, fallback in ((0.0, True), (0.25, False)):
        output = tmp_path / f"exact-{exact}"
        plot_group("exp09", *tables(group, exact), Path(GROUPS_PATH), output)
        svg = output.with_suffix(".svg").read_text()
        assert (FALLBACK_TITLE in svg) == fallback
        assert ("test cell accuracy" in svg) == fallback and ("test exact accuracy" in svg) != fallback

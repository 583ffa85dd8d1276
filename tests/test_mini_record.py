"""The mini study's recorded run (docs/records/mini-h200/): its verdicts are what today's `trm verdicts` makes of
its table, and every figure docs/statistics.md quotes from it is the table's."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from trm.cli import main
from trm.config.load import config_hash

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "docs" / "records" / "mini-h200"
STATISTICS = REPO / "docs" / "statistics.md"


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verdicts")
    argv = [
        "verdicts",
        "--table",
        str(RECORD / "table.csv"),
        "--groups",
        str(REPO / "config" / "groups.yaml"),
    ]
    assert main([*argv, "--scale", "mini", "--test-puzzles", "1024", "--output", str(out)]) == 0
    return out


def mini_section() -> str:
    text = STATISTICS.read_text()
    return text[text.index("**Mini: 6x6 (2x3 boxes).**") :]


def test_the_recorded_verdicts_are_todays_verdicts_of_the_recorded_table(judged):
    assert (judged / "verdicts.md").read_text() == (RECORD / "verdicts.md").read_text()


def test_the_docs_counts_are_the_verdicts(judged):
    criteria = [
        c for g in json.loads((judged / "verdicts.json").read_text())["groups"] for c in g["criteria"]
    ]
    counts = Counter(c["verdict"] for c in criteria)
    decided = counts["supported"] + counts["not supported"]
    text = " ".join(mini_section().split())
    assert (
        f"Of the {len(criteria)} criteria, {decided} are decided ({counts['supported']} supported, "
        f"{counts['not supported']} not supported)" in text
    )
    assert f"{counts['inconclusive']} are inconclusive" in text


def test_the_docs_baseline_curve_and_interval_are_the_tables():
    curves = pd.read_csv(RECORD / "table-curves.csv")
    text = mini_section()
    for seed, run in enumerate(("exp01c", "exp01c~s1", "exp01c~s2")):
        rows = curves[curves["run"] == run].set_index("epoch")["test_exact_accuracy"]
        row = re.search(rf"^\| {seed} \|(.*)\|$", text, re.MULTILINE).group(1)
        quoted = [float(cell) for cell in row.split("|")]
        assert quoted == [round(rows[epoch], 3) for epoch in (32.0, 48.0, 64.0, 80.0, 96.0, 128.0)]
    table = pd.read_csv(RECORD / "table.csv")
    baseline = table[table["id"] == "exp01c"].iloc[0]
    seeds = ", ".join(f"{v:.3f}" for v in table[table["id"] == "exp01c"]["test_exact_accuracy"])
    interval = (
        f"Baseline test exact accuracy {seeds} (mean {baseline['test_exact_accuracy_mean']:.3f}, 95% interval "
        f"{baseline['test_exact_accuracy_low']:.3f} to {baseline['test_exact_accuracy_high']:.3f})"
    )
    assert interval in " ".join(text.split())


CPU_RECORD = REPO / "docs" / "records" / "mini-cpu"


def test_the_cpu_baseline_is_the_h200_records_runs_and_the_docs_quote_it():
    table = pd.read_csv(RECORD / "table.csv").set_index("run")
    text = " ".join(mini_section().split())
    curves, finals = [], []
    for seed, run in enumerate(("exp01c", "exp01c~s1")):
        folder = CPU_RECORD / run
        config = json.loads((folder / "config.json").read_text())
        assert config["train"]["seed"] == seed
        assert config_hash(config) == table.loc[run, "config_hash"]  # the recipe the H200 trained
        evals = {
            r["step"]: r["exact_accuracy"]
            for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "eval"
        }
        curves.append(", ".join(f"{evals[step]:.3f}" for step in (500, 750, 1000, 1250)) + f" (seed {seed})")
        final = json.loads((folder / "test_time.json").read_text())
        assert final["checkpoint_step"] == 2000 and final["weights"] == "ema"
        headline = next(r for r in final["results"] if r["steps"] == config["arch"]["halt_max_steps"])
        assert headline["count"] == 1024
        finals.append(f"{headline['exact_accuracy']:.3f}")
    assert f"test exact accuracy {curves[0]} and {curves[1]} at steps 500, 750, 1,000 and 1,250" in text
    assert f"and {finals[0]} and {finals[1]} at step 2,000 on all 1,024" in text

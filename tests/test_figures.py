"""Every figure is computed from what it claims to measure (issue 37), checked as properties over synthetic records
and tables, so that cases nobody listed are caught too:

- the summary's train-side figures are those of the rows (training examples that halted) its train records
  counted: records weigh by their counts, and a record that counted none adds nothing, whether the trainer wrote
  its means as null (this one) or as 0 (earlier ones);
- a criterion never compares a member with itself: a member of its own `against` list is judged against the best of
  the others;
- a member whose runs are its reference's own (the same trained weights and the same value) is judged "no effect
  at this scale", never as a measured difference; any other pair is measured as usual.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from workflow_support import runs_table

from trm.analysis.judge import same_runs
from trm.analysis.summary import run_metrics
from trm.analysis.uncertainty import NO_EFFECT, NO_SIGNAL
from trm.analysis.verdicts import judge_groups, to_markdown
from trm.study.groups import load_groups
from trm.study.metrics import RUN_METRICS
from trm.train.records import ROW_MEANS, row_means

CONFIG = {"train": {"eval_interval": 36, "global_batch_size": 24}}


def _record(
    step: int, epoch: float, halted: list[int], exact: list[bool], empty_as_zero: bool = False
) -> dict:
    """A train record as the trainer writes it from the rows that halted in its window (`halted`: their halt
    steps, `exact`: whether each was exactly right); `empty_as_zero`: a window without a halted row written as
    trainers before issue 37 did, with 0 for every mean."""
    sums = {
        "count": float(len(halted)),
        "steps": float(sum(halted)),
        "steps_sq": float(sum(h * h for h in halted)),
        "accuracy": float(sum(exact)),
        "exact_accuracy": float(sum(exact)),
        "q_halt_accuracy": 0.0,
    }
    means = row_means(sums)
    if not halted and empty_as_zero:
        means = dict.fromkeys(ROW_MEANS, 0.0)
    return {
        "kind": "train",
        "step": step,
        "epoch": epoch,
        "count": len(halted),
        "examples_per_s": 100.0,
        **means,
    }


def _final(epochs: float) -> dict:
    test = {"exact_accuracy": 0.0, "accuracy": 0.3, "accuracy_puzzle_sd": 0.05, "count": 24, "epoch": epochs}
    return {"steps": 60, "epochs": epochs, "test": test, "best_test": test}


def test_train_figures_are_the_counted_rows_whatever_the_windows():
    rng = np.random.default_rng(37)
    for _ in range(300):
        intervals = int(rng.integers(1, 4))
        epochs = 36.0 * intervals
        windows = sorted(set(rng.uniform(0.5, epochs, size=int(rng.integers(1, 8))).round(2)) | {epochs})
        records, last_rows, last_exact = [], [], []
        for n, epoch in enumerate(windows):
            rows = int(rng.integers(1, 40)) if rng.random() > 0.35 else 0  # some windows see no halt
            halted = [int(h) for h in rng.integers(1, 17, size=rows)]
            exact = [bool(e) for e in rng.random(rows) < 0.3]
            records.append(
                _record(n + 1, float(epoch), halted, exact, empty_as_zero=bool(rng.random() < 0.5))
            )
            if epoch > epochs - 36:  # the last evaluation interval
                last_rows += halted
                last_exact += exact
        metrics = run_metrics(CONFIG, records, _final(epochs))
        if not last_rows:
            assert metrics["mean_halt_steps"] is None and metrics["train_exact_accuracy"] is None
            assert metrics["halt_steps_variance"] is None and metrics["train_test_gap"] is None
            continue
        assert metrics["mean_halt_steps"] == pytest.approx(np.mean(last_rows), rel=1e-12)
        assert metrics["halt_steps_variance"] == pytest.approx(np.var(last_rows), rel=1e-9, abs=1e-9)
        assert metrics["train_exact_accuracy"] == pytest.approx(np.mean(last_exact), rel=1e-12, abs=1e-15)


def test_a_smoke_runs_last_window_without_a_halt_leaves_its_halt_steps_at_the_limit():
    """The smoke run of the issue: 60 steps logged at 50 and 60; every row halts at the limit of 16 (steps 16, 32,
    48), so the 10-step window after step 50 counts no row. Its figures were read as 0 and halved the mean to 8."""
    halted_at_limit = [16] * 72  # 3 halts of 24 rows
    empty = row_means({"count": 0.0, "steps": 0.0, "steps_sq": 0.0, "accuracy": 0.0, "exact_accuracy": 0.0})
    assert empty == dict.fromkeys(ROW_MEANS)  # a mean over no row is not 0
    for zero in (False, True):
        records = [_record(50, 60.0, halted_at_limit, [False] * 72), _record(60, 72.0, [], [], zero)]
        metrics = run_metrics(CONFIG, records, _final(72.0))
        assert metrics["mean_halt_steps"] == 16.0 and metrics["halt_steps_variance"] == 0.0
        assert metrics["train_exact_accuracy"] == 0.0


# ------------------------------------------------------------------------------------------------- the judge


def _random_study(rng: np.random.Generator, groups: list[dict]) -> tuple[pd.DataFrame, dict[str, set[str]]]:
    """A runs table of every group's members, each with 1 to 3 runs of random figures, except that some members'
    runs are copies of an earlier member's (all of them, or its first): a treatment that did not act, or two
    settings the scale made one config. Returns the table and each member's run identities (weight digests)."""
    rows: list[dict] = []
    digests: dict[str, set[str]] = {}
    for group in groups:
        done: list[str] = []
        for member in group["members"]:
            if done and rng.random() < 0.35:
                source = done[int(rng.integers(len(done)))]
                copied = [r for r in rows if r["id"] == source]
                copied = copied if rng.random() < 0.5 else copied[:1]
                rows += [{**r, "id": member} for r in copied]
                digests[member] = {r["weights_sha256"] for r in copied}
            else:
                seeds = int(rng.integers(1, 4))
                for seed in range(seeds):
                    figures = {k: float(rng.uniform(0.05, 0.95)) for k in RUN_METRICS}
                    rows.append({"id": member, "seed": seed, "weights_sha256": f"{member}-{seed}", **figures})
                digests[member] = {f"{member}-{seed}" for seed in range(seeds)}
            done.append(member)
    return runs_table(pd.DataFrame(rows)), digests


def test_no_criterion_compares_a_member_with_itself_and_same_runs_are_no_effect():
    rng = np.random.default_rng(2037)
    groups = load_groups()
    checked = {"no effect": 0, "measured": 0, "own against": 0}
    for _ in range(5):
        table, digests = _random_study(rng, groups)
        for group, judged in zip(groups, judge_groups(groups, table, "paper", 24)["groups"], strict=True):
            for criterion, result in zip(group["criteria"], judged["criteria"], strict=True):
                verdicts = [c["verdict"] for c in result["comparisons"]]
                for c in result["comparisons"]:
                    assert c["a"] != c["b"], (group["id"], c)
                    if c["b"] not in group["members"]:  # against a fixed figure
                        continue
                    a, b = digests[c["a"]], digests[c["b"]]
                    if a <= b or b <= a:
                        assert c["verdict"] == NO_EFFECT and c["difference"] is None, (group["id"], c)
                        checked["no effect"] += 1
                    else:
                        assert c["verdict"] != NO_EFFECT and c["difference"] is not None, (group["id"], c)
                        checked["measured"] += 1
                    if c["a"] in criterion.get("against", []):  # the best of the others
                        others = [m for m in criterion["against"] if m != c["a"]]
                        means = {m: result["estimates"][m]["mean"] for m in others}
                        assert c["b"] == max(others, key=means.get)
                        checked["own against"] += 1
                if result["verdict"] == NO_EFFECT:
                    assert NO_EFFECT in verdicts
                elif verdicts and all(v == NO_EFFECT for v in verdicts):
                    raise AssertionError(f"{group['id']}: every comparison had no effect: {result}")
    # The draws reached each case many times.
    assert min(checked.values()) >= 5, checked


def test_exp10s_baseline_is_judged_against_the_best_of_the_other_rates():
    """exp10b, one of the rates it is compared with, had been compared with itself: "exp10b - exp10b:
    inconclusive: difference 0 ± 12.2 points"."""
    (exp10,) = [g for g in load_groups() if g["id"] == "exp10"]
    values = {
        "exp10a": [0.30],
        "exp10b": [0.34, 0.45, 0.40],
        "exp10c": [0.25],
        "exp10d": [0.36],
        "exp10e": [0.2],
    }
    rows = [(m, seed, v) for m, vs in values.items() for seed, v in enumerate(vs)]
    table = runs_table(pd.DataFrame(rows, columns=["id", "seed", "test_exact_accuracy"]))
    (criterion,) = judge_groups([exp10], table, "paper", 24)["groups"][0]["criteria"]
    (comparison,) = criterion["comparisons"]
    # The highest of the others; exp10b above it by 3.7 points is within 1 point of the best (itself).
    assert (comparison["a"], comparison["b"], comparison["claim"]) == ("exp10b", "exp10d", "at_least")
    assert comparison["bound"] == -0.01 and comparison["difference"] == pytest.approx(0.0367, abs=1e-4)
    # Below the best by 4 points it is not; neither reads a difference of 0.
    values["exp10d"] = [0.43]
    rows = [(m, seed, v) for m, vs in values.items() for seed, v in enumerate(vs)]
    table = runs_table(pd.DataFrame(rows, columns=["id", "seed", "test_exact_accuracy"]))
    (criterion,) = judge_groups([exp10], table, "paper", 24)["groups"][0]["criteria"]
    assert criterion["detail"].startswith("exp10b - exp10d: ") and "difference 0 " not in criterion["detail"]


def _contrib02(adaptive_steps: float = 16.0) -> pd.DataFrame:
    """contrib02 at the smoke scale as the issue found it: the adaptive member's one run is the baseline's seed 0
    bit for bit (no example halts early, so the schedule never acts); exact accuracy 0 throughout."""
    runs = [
        ("contrib02_baseline", 0, "w0", 0.337963, 16.0),
        ("contrib02_baseline", 1, "w1", 0.445, 16.0),
        ("contrib02_baseline", 2, "w2", 0.404, 16.0),
        ("contrib02_adaptive", 0, "w0", 0.337963, adaptive_steps),
    ]
    columns = ["id", "seed", "weights_sha256", "test_cell_accuracy", "mean_halt_steps"]
    table = runs_table(pd.DataFrame(runs, columns=columns))
    table["test_exact_accuracy"] = 0.0
    table["test_cell_accuracy_puzzle_sd"] = 0.05
    table["baseline"] = table["id"] == "contrib02_baseline"
    return table


def test_a_treatment_that_did_not_act_is_no_effect_not_a_difference():
    (contrib02,) = [g for g in load_groups() if g["id"] == "contrib02"]
    result = judge_groups([contrib02], _contrib02(), "smoke", 24)
    group = result["groups"][0]
    assert [c["verdict"] for c in group["criteria"]] == [NO_EFFECT, NO_EFFECT]
    assert group["verdict"] == NO_EFFECT
    accuracy = group["criteria"][0]
    assert accuracy["detail"] == (
        "contrib02_adaptive - contrib02_baseline: no effect at this scale: the same runs (the same trained weights "
        "and value), so the treatment did not act"
    )
    assert accuracy["comparisons"][0]["difference"] is None and "±" not in to_markdown(result)
    # The same weights with another figure (a setting that acts after training, or throughput, which every run
    # measures anew) is measured.
    measured = judge_groups([contrib02], _contrib02(adaptive_steps=12.0), "smoke", 24)["groups"][0]
    assert measured["criteria"][1]["verdict"] not in (NO_EFFECT, NO_SIGNAL)
    assert measured["criteria"][1]["comparisons"][0]["difference"] == -4.0


def test_same_runs_needs_every_run_of_one_side_in_the_other():
    base = [("w0", 0.3), ("w1", 0.4), ("w2", 0.5)]
    assert same_runs([("w0", 0.3)], base) and same_runs(base, [("w2", 0.5)]) and same_runs(base, base[::-1])
    assert not same_runs([("w0", 0.3), ("w9", 0.3)], base)  # one run differs: the treatment acted there
    assert not same_runs([("w0", 0.31)], base)  # the same weights, another figure
    assert not same_runs([(None, 0.3)], [(None, 0.3)]) and not same_runs([], base)  # no digest: no identity

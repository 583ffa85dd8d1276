"""The evaluation's Tally (trm/train/records.py): per-puzzle means and standard deviations over real rows, in
float64 and row order, and a record that continues a stopped evaluation to the figures of an unbroken one."""

from __future__ import annotations

import json

import numpy as np

from trm.train.records import EVAL_STATS, SD_STATS, Tally

COUNTS = (2, 8)


def _batches(seed: int = 0, batches: int = 3, rows: int = 5) -> list[tuple[dict, np.ndarray]]:
    """Per-row statistics of `batches` batches as the evaluator returns them (float32), the last one padded."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(batches):
        stats = {k: {name: rng.random(rows).astype(np.float32) for name in EVAL_STATS} for k in COUNTS}
        real = np.ones(rows, bool)
        if b == batches - 1:
            real[-2:] = False  # padding rows: their values must count nowhere
        out.append((stats, real))
    return out


def test_the_sd_is_the_sample_sd_of_the_real_rows():
    batches = _batches()
    tally = Tally(COUNTS)
    for stats, real in batches:
        tally.add(stats, real)
    results = tally.results()
    for k, record in zip(COUNTS, results, strict=True):
        for name in SD_STATS:
            values = np.concatenate([stats[k][name][real] for stats, real in batches]).astype(np.float64)
            assert record["count"] == len(values) == 13
            assert record[name] == values.mean()
            # Sum of squares against the two-pass formula: float64 over 13 values of order 1.
            assert abs(record[f"{name}_puzzle_sd"] - values.std(ddof=1)) < 1e-12
            assert record[f"{name}_puzzle_sd"] > 0


def test_a_tally_saved_after_a_batch_continues_to_the_unbroken_figures_bit_for_bit():
    batches = _batches(seed=1)
    unbroken = Tally(COUNTS)
    for stats, real in batches:
        unbroken.add(stats, real)
    stopped = Tally(COUNTS)
    stopped.add(*batches[0])
    continued = Tally.from_record(json.loads(json.dumps(stopped.to_record())))
    assert continued.batches == 1
    for stats, real in batches[1:]:
        continued.add(stats, real)
    assert continued.results() == unbroken.results()
    assert continued.to_record() == unbroken.to_record()


def test_no_sd_below_two_puzzles():
    stats = {k: {name: np.array([0.5, 0.9], np.float32) for name in EVAL_STATS} for k in COUNTS}
    tally = Tally(COUNTS)
    tally.add(stats, np.array([True, False]))
    assert [r["accuracy_puzzle_sd"] for r in tally.results()] == [None, None]
    assert [r["accuracy_puzzle_sd"] for r in Tally(COUNTS).results()] == [None, None]

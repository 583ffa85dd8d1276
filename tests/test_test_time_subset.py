"""The final evaluation with a test-time subset (trm/train/test_time.py): the headline on the whole test split,
unchanged; the curve on the same seeded puzzles for every run; resumable; `null` is the whole split."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tiny_run import TRAINED

from trm.cli import main as trm
from trm.data.format import SplitData, sudoku_metadata
from trm.study.estimate import evaluation_passes
from trm.study.settings import check_settings, load_schema
from trm.train import test_time
from trm.train.evaluate_checkpoint import load_eval_split
from trm.train.evaluator import Evaluator, evaluate
from trm.train.step import ModelTemplate
from trm.train.test_time import SUBSET_SEED, run_test_time_evaluation, subset_groups, take_groups
from trm.train.weights import load_weights

pytestmark = pytest.mark.slow

HEADLINE = TRAINED["train.eval_steps"]  # 2
COUNTS = (HEADLINE, 3, 5)
SUBSET = 5  # of the 12 test puzzles
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------- choosing the puzzles


def test_the_subset_is_a_pure_function_of_the_split_size_and_a_constant_seed():
    chosen = subset_groups(1000, 100)
    assert np.array_equal(chosen, subset_groups(1000, 100, SUBSET_SEED))
    assert np.array_equal(chosen, np.unique(chosen)) and len(chosen) == 100  # ascending, distinct
    assert not np.array_equal(chosen, np.arange(100))  # a permutation's first 100, not the first 100 puzzles
    assert set(subset_groups(1000, 40)) < set(chosen)  # nested: a smaller subset is part of a larger one
    assert not np.array_equal(subset_groups(1000, 100, SUBSET_SEED + 1), chosen)


def test_a_subset_of_an_augmented_split_keeps_whole_groups():
    # 4 groups (base puzzles) of 2, 1, 3 and 2 puzzles (augmentations), puzzle p holding the rows 10p..10p+9.
    group_indices = np.array([0, 2, 3, 6, 8], np.int32)
    inputs = np.arange(8)[:, None] * 10 + np.arange(10)
    split = SplitData(
        inputs=inputs,
        labels=inputs + 1,
        puzzle_identifiers=np.arange(8, dtype=np.int32),
        puzzle_indices=np.arange(9, dtype=np.int32),
        group_indices=group_indices,
        metadata=sudoku_metadata(4),
    )
    part = take_groups(split, np.array([0, 2]))
    assert part.puzzle_identifiers.tolist() == [0, 1, 3, 4, 5]  # group 0's puzzles, then group 2's
    assert np.array_equal(part.inputs, inputs[[0, 1, 3, 4, 5]]) and np.array_equal(
        part.labels, part.inputs + 1
    )
    assert part.puzzle_indices.tolist() == [0, 1, 2, 3, 4, 5] and part.group_indices.tolist() == [0, 2, 5]
    assert part.metadata["total_groups"] == 2 and split.metadata["total_groups"] == 4


def test_the_setting_reads_null_and_integers_from_the_command_line():
    schema = load_schema(str(REPO / "workflow/schemas/config.schema.yaml"))
    settings = {"test_time_subset": {"smoke": "null", "paper": "1000"}}  # as `snakemake --config` gives them
    check_settings(settings, schema, lambda _key: "--config")
    assert settings == {"test_time_subset": {"smoke": None, "paper": 1000}}


def test_the_plan_counts_the_headline_pass_and_the_subset_pass():
    config = {
        "train": {"global_batch_size": 6144, "eval_subset": 8192, "epochs": 50000, "eval_interval": 5000}
    }
    config["train"]["eval_steps"] = 16
    steps = (16, 32, 64, 128)
    whole = evaluation_passes(config, 423_168, steps, 32)
    assert whole["final"] == (1, 69 * 6144, 128) and whole["test_time"] == (0, 0, 0)
    sized = evaluation_passes(config, 423_168, steps, 32, 43_008)
    assert sized["final"] == (1, 69 * 6144, 16) and sized["test_time"] == (1, 7 * 6144, 128)
    assert sized["intermediate"] == whole["intermediate"]
    # A subset as large as the split, or no test-time counts, leaves one pass over the whole split.
    assert evaluation_passes(config, 423_168, steps, 32, 423_168) == whole
    assert evaluation_passes(config, 423_168, (), 32, 43_008)["test_time"] == (0, 0, 0)


# --------------------------------------------------------------------------- evaluating a trained checkpoint


@pytest.fixture(scope="module")
def checkpoint(trained) -> dict:  # noqa: F811
    """The trained run's weights, its test split and one evaluator (compiled once for every test below)."""
    weights = load_weights(str(trained["run"]))
    split = load_eval_split(str(trained["built"]), "test", str(trained["cache"]))
    evaluator = Evaluator(ModelTemplate(weights.model_cfg, seed=0), COUNTS)
    on_device = evaluator.put_weights(weights.params, weights.puzzle_emb, weights.buffers)
    return {"weights": weights, "split": split, "evaluator": evaluator, "on_device": on_device, **trained}


def _fresh_copy(checkpoint: dict, path: Path) -> Path:
    """The trained run without its final evaluation's files, so that the next one evaluates every count."""
    shutil.copytree(checkpoint["run"], path)
    for name in ("test_time.json", "test_time.progress.json"):
        (path / name).unlink(missing_ok=True)
    return path


def _final_evaluation(checkpoint: dict, run: Path, subset: int | None, stop=lambda _batches: False, batch=2):
    summary = {"checkpoint": "the trained run", "checkpoint_step": checkpoint["weights"].step, "subset": None}
    return run_test_time_evaluation(
        checkpoint["evaluator"],
        checkpoint["on_device"],
        checkpoint["split"],
        run_dir=str(run),
        counts=COUNTS,
        batch_size=batch,
        summary=summary,
        writer=True,
        stop=stop,
        headline=HEADLINE,
        subset=subset,
    )


def _written(run: Path) -> dict:
    return json.loads((run / "test_time.json").read_text())


def test_the_headline_is_the_whole_splits_figure_of_the_one_pass_evaluation(checkpoint, tmp_path):
    split = checkpoint["split"]
    # Before the subset: one pass of every count over the whole split, in the trainer's batches.
    one_pass = evaluate(
        checkpoint["evaluator"], checkpoint["on_device"], split, TRAINED["train.global_batch_size"]
    )
    run = _fresh_copy(checkpoint, tmp_path / "run")
    results = _final_evaluation(checkpoint, run, SUBSET, batch=TRAINED["train.global_batch_size"])
    # The same rows, batches and compiled step: the headline is bit for bit the one-pass figure, and the trainer's.
    assert results[HEADLINE] == one_pass[0] and results[HEADLINE]["count"] == len(split.inputs) == 12
    final = json.loads((checkpoint["run"] / "final.json").read_text())["test"]
    assert results[HEADLINE] == final
    written = _written(run)
    assert written["results"][0] == one_pass[0]  # test_time.json's entry for the headline count is unchanged
    # The other counts: the subset's figures, on SUBSET puzzles, as evaluating those rows alone gives them.
    rows = take_groups(split, subset_groups(12, SUBSET))
    on_subset = evaluate(
        checkpoint["evaluator"], checkpoint["on_device"], rows, TRAINED["train.global_batch_size"]
    )
    assert [results[3], results[5]] == on_subset[1:] and on_subset[0]["count"] == SUBSET
    assert written["results"] == [one_pass[0], *on_subset[1:]]
    assert (
        written["curve_results"] == on_subset
    )  # the curve: every count on the same rows, the headline's too
    assert written["test_time_subset"] == {"size": SUBSET, "seed": SUBSET_SEED}
    subset_rows = {"subset_size": SUBSET, "subset_seed": SUBSET_SEED}
    whole_rows = {"subset_size": None, "subset_seed": None}
    assert written["evaluated_rows"] == {"2": whole_rows, "3": subset_rows, "5": subset_rows}
    # The keys every reader knew stay.
    assert {"checkpoint", "checkpoint_step", "subset", "devices", "batch_size", "results"} <= set(written)


def test_null_or_a_subset_of_the_whole_split_is_one_pass_over_the_whole_split(checkpoint, tmp_path):
    one_pass = evaluate(checkpoint["evaluator"], checkpoint["on_device"], checkpoint["split"], 2)
    files = []
    for subset in (None, 12, 100):
        run = _fresh_copy(checkpoint, tmp_path / f"run-{subset}")
        results = _final_evaluation(checkpoint, run, subset)
        assert [results[count] for count in COUNTS] == one_pass
        files.append(_written(run))
    assert files[0] == files[1] == files[2]
    assert files[0]["results"] == files[0]["curve_results"] == one_pass
    assert files[0]["test_time_subset"] is None
    assert all(
        rows == {"subset_size": None, "subset_seed": None} for rows in files[0]["evaluated_rows"].values()
    )


@pytest.mark.parametrize(
    "stop_after", [3, 8]
)  # batches: inside the headline pass (6 batches), inside the subset's
def test_a_stopped_evaluation_with_a_subset_resumes_to_the_same_results(checkpoint, tmp_path, stop_after):
    unbroken = _fresh_copy(checkpoint, tmp_path / "unbroken")
    _final_evaluation(checkpoint, unbroken, SUBSET)
    run = _fresh_copy(checkpoint, tmp_path / "run")
    calls = []
    assert (
        _final_evaluation(checkpoint, run, SUBSET, stop=lambda b: calls.append(b) or len(calls) == stop_after)
        is None
    )
    assert calls == list(
        range(1, stop_after + 1)
    )  # rising from pass to pass (a preemption sync point's steps)
    progress = json.loads((run / "test_time.progress.json").read_text())
    in_subset = stop_after > 6
    assert progress["key"]["rows"]["subset_size"] == (SUBSET if in_subset else None)
    assert progress["tally"]["batches"] == stop_after - 6 * in_subset
    if in_subset:  # the headline's pass is written: not evaluated again
        assert [r["steps"] for r in _written(run)["results"]] == [HEADLINE] and not _written(run)[
            "curve_results"
        ]
    resumed = []
    _final_evaluation(checkpoint, run, SUBSET, stop=lambda b: resumed.append(b) or False)
    # 6 + 3 batches in all (12 puzzles, then 5, in batches of 2), each evaluated once.
    assert len(calls) + len(resumed) == 9
    assert _written(run) == _written(unbroken)


# ---------------------------------------------------------------------------------------- trained by `trm train`


def test_runs_of_different_seeds_score_the_curve_on_the_same_puzzles(checkpoint, tmp_path, monkeypatch):
    seen = []

    def spy(evaluator, weights, split, *args, **kwargs):
        seen.append(np.asarray(split.inputs).copy())
        return evaluate(evaluator, weights, split, *args, **kwargs)

    monkeypatch.setattr(test_time, "evaluate", spy)
    written = []
    for seed in (0, 1):
        run = tmp_path / f"seed-{seed}"
        sets = [f"--set={k}={v}" for k, v in {**TRAINED, "train.seed": seed}.items()]
        args = ["train", "--config", str(REPO / "config/base.yaml"), "--data", checkpoint["staged"]]
        args += ["--run-dir", str(run), "--cache-dir", str(checkpoint["cache"]), *sets]
        assert trm([*args, "--test-time-steps", "3,5", "--test-time-subset", str(SUBSET)]) == 0
        written.append(_written(run))
    # Each run: the whole split at eval_steps, then the subset at every count.
    whole, subset = (
        checkpoint["split"].inputs,
        np.asarray(take_groups(checkpoint["split"], subset_groups(12, SUBSET)).inputs),
    )
    assert [len(inputs) for inputs in seen] == [12, SUBSET, 12, SUBSET]
    assert np.array_equal(seen[0], whole) and np.array_equal(seen[2], whole)
    assert np.array_equal(seen[1], subset) and np.array_equal(
        seen[3], subset
    )  # the same puzzles for both seeds
    assert written[0]["results"] != written[1]["results"]  # two different models
    for evaluation in written:
        assert evaluation["test_time_subset"] == {"size": SUBSET, "seed": SUBSET_SEED}
        assert [r["count"] for r in evaluation["results"]] == [12, SUBSET, SUBSET]
        assert [r["steps"] for r in evaluation["curve_results"]] == list(COUNTS)


def test_a_subset_below_one_is_refused_in_one_line(tmp_path, capsys):
    args = [
        "train",
        "--config",
        str(REPO / "config/base.yaml"),
        "--data",
        str(tmp_path),
        "--run-dir",
        str(tmp_path),
    ]
    assert trm([*args, "--test-time-subset", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "trm train: error: argument --test-time-subset: expected an integer >= 1, got '0' (see trm train --help)"
    ]


def test_a_stopped_pass_of_another_subset_is_not_continued(checkpoint, tmp_path):
    unbroken = _fresh_copy(checkpoint, tmp_path / "unbroken")
    _final_evaluation(checkpoint, unbroken, SUBSET + 2)
    run = _fresh_copy(checkpoint, tmp_path / "run")
    calls = []
    assert (
        _final_evaluation(checkpoint, run, SUBSET, stop=lambda b: calls.append(b) or len(calls) == 8) is None
    )
    # The saved sums are of 2 batches of the 5-puzzle subset: a 7-puzzle subset starts its pass again.
    resumed = []
    _final_evaluation(checkpoint, run, SUBSET + 2, stop=lambda b: resumed.append(b) or False)
    assert resumed == [1, 2, 3, 4]  # 7 puzzles in batches of 2; the headline's pass is not evaluated again
    assert _written(run) == _written(unbroken)

"""Sampled test-time recursion (trm/train/sampled.py): sigma 0 and K = 1 is the deterministic evaluation bit for
bit; the noise is reproducible from its seed and independent of batching and of where a pass continued."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tiny_run import TRAINED
from workflow_support import study

from trm.analysis.summary import summarize
from trm.cli import main as trm
from trm.errors import UserError
from trm.study.estimate import (
    accelerator_hours,
    describe_evaluation,
    evaluation_flops,
    evaluation_passes,
    model_costs,
)
from trm.study.scale import SMOKE
from trm.train.evaluate_checkpoint import load_eval_split
from trm.train.evaluator import Evaluator, evaluate
from trm.train.final_evaluation import run_final_evaluation
from trm.train.sampled import (
    SampledEvaluator,
    SampledTally,
    choose,
    evaluate_sampled,
)
from trm.train.sampling import SAMPLED_STATS, Sampling, check_sampling, puzzles_per_batch
from trm.train.step import ModelTemplate
from trm.train.weights import load_weights

COUNTS = (TRAINED["train.eval_steps"], 4)


@pytest.fixture(scope="module")
def checkpoint(trained) -> dict:
    """The trained run's weights on the device, its test split (12 puzzles) and one evaluator."""
    weights = load_weights(str(trained["run"]))
    split = load_eval_split(str(trained["built"]), "test", str(trained["cache"]))
    evaluator = Evaluator(ModelTemplate(weights.model_cfg, seed=0), COUNTS)
    on_device = evaluator.put_weights(weights.params, weights.puzzle_emb, weights.buffers)
    return {"split": split, "evaluator": evaluator, "on_device": on_device, "step": weights.step, **trained}


def _sampled(checkpoint, trajectories, sigma, seed=0, batch=4, **kwargs):
    sampled = SampledEvaluator(checkpoint["evaluator"], trajectories, sigma, seed)
    return evaluate_sampled(sampled, checkpoint["on_device"], checkpoint["split"], batch, **kwargs)


def _logits(checkpoint, seed):
    """The Q-halt logits of 2 puzzles x 3 trajectories at sigma 0.5 after the last count."""
    sampled = SampledEvaluator(checkpoint["evaluator"], 3, 0.5, seed)
    split = checkpoint["split"]
    rows = {
        "inputs": np.repeat(split.inputs[:2], 3, axis=0).astype(np.int32),
        "labels": np.repeat(split.labels[:2], 3, axis=0).astype(np.int32),
        "puzzle_identifiers": np.zeros(6, np.int32),
        "puzzle": np.repeat(np.arange(2, dtype=np.int32), 3),
        "trajectory": np.tile(np.arange(3, dtype=np.int32), 2),
    }
    stats, _ = sampled(checkpoint["on_device"], rows)
    return stats[COUNTS[-1]]["q_halt_logit"]


# ------------------------------------------------------------------------------------- choosing an answer


def test_the_q_head_the_vote_and_the_oracle_choose_as_stated():
    # Two puzzles of 3 trajectories. Puzzle 0: answers A, A, B, B wins the Q head, A the vote, A is right.
    # Puzzle 1: answers C, D, E all once: the vote falls back on the Q head (E), and no trajectory is right.
    a, b, c, d, e = ([v] * 3 for v in range(5))
    stats = {
        "prediction": np.array([a, a, b, c, d, e]),
        "exact_accuracy": np.array([1, 1, 0, 0, 0, 0], np.float32),
        "accuracy": np.array([1, 1, 0.5, 0.25, 0.5, 0.75], np.float32),
        "q_halt_logit": np.array([0.1, 0.2, 3.0, -1, -2, 0.5], np.float32),
    }
    chosen = choose(stats, 3)
    assert chosen["q_exact_accuracy"].tolist() == [0, 0] and chosen["q_accuracy"].tolist() == [0.5, 0.75]
    assert chosen["vote_exact_accuracy"].tolist() == [1, 0] and chosen["vote_accuracy"].tolist() == [1, 0.75]
    assert chosen["oracle_exact_accuracy"].tolist() == [1, 0]
    assert np.allclose(chosen["trajectory_exact_accuracy"], [2 / 3, 0])


def test_a_batch_holds_whole_puzzles_split_evenly_over_the_devices():
    assert puzzles_per_batch(192, 1, 24, 1) == 24  # K = 1: the deterministic evaluation's batch
    assert puzzles_per_batch(192, 4, 1000, 1) == 48  # batch_size // K puzzles: 192 rows
    assert puzzles_per_batch(192, 500, 1000, 1) == 1  # K above the batch: one puzzle at a time
    assert puzzles_per_batch(6144, 16, 43008, 32) == 384 and 384 * 16 % 32 == 0
    assert puzzles_per_batch(32, 3, 1000, 4) * 3 % 4 == 0  # 3 trajectories on 4 devices: 12 rows


def test_the_plan_counts_each_ks_pass_over_the_curves_puzzles():
    config = {
        "train": {"global_batch_size": 6144, "eval_subset": 8192, "epochs": 50000, "eval_interval": 5000}
    }
    config["train"]["eval_steps"] = 16
    steps = (16, 32, 64, 128)
    plain = evaluation_passes(config, 423_168, steps, 32, 43_008)
    grid = evaluation_passes(config, 423_168, steps, 32, 43_008, (1, 4, 16, 64))
    assert plain["sampled"] == (0, 0, 0) and {**grid, "sampled": (0, 0, 0)} == plain
    # 43,008 puzzles x (1 + 4 + 16 + 64) rows, in whole batches of 6,144 rows, to the largest count: 85 times the
    # curve's pass.
    assert grid["sampled"] == (1, 85 * 43_008, 128) and grid["sampled"][1] == 85 * plain["test_time"][1]
    assert "then 3655680 rows x 128 steps sampling trajectories" in describe_evaluation(grid, steps)
    costs = {"eval_flops_per_example_step": 1.0}
    added = evaluation_flops(config, costs, 423_168, steps, 32, 43_008, (4,)) - evaluation_flops(
        config, costs, 423_168, steps, 32, 43_008
    )
    assert added == 4 * 43_008 * 128


def test_bad_settings_are_refused_naming_them():
    with pytest.raises(UserError, match="--trajectories"):
        check_sampling([4, 0], 0.3)
    with pytest.raises(UserError, match="sigma -0.1"):
        check_sampling([4], -0.1)
    with pytest.raises(UserError, match="sigma nan"):
        check_sampling([4], float("nan"))


# ------------------------------------------------------------------------------------- the evaluation


@pytest.mark.slow
def test_sigma_0_and_one_trajectory_is_the_deterministic_evaluation_bit_for_bit(checkpoint):
    deterministic = evaluate(checkpoint["evaluator"], checkpoint["on_device"], checkpoint["split"], 4)
    sampled = _sampled(checkpoint, 1, 0.0)
    for plain, chosen in zip(deterministic, sampled, strict=True):
        assert chosen["steps"] == plain["steps"] and chosen["count"] == plain["count"] == 12
        for rule in ("q", "vote"):
            assert chosen[f"{rule}_exact_accuracy"] == plain["exact_accuracy"]  # equal, not close
            assert chosen[f"{rule}_accuracy"] == plain["accuracy"]
        assert (
            chosen["oracle_exact_accuracy"] == chosen["trajectory_exact_accuracy"] == plain["exact_accuracy"]
        )
    # Without noise, K trajectories are K copies: every rule scores the deterministic figures.
    copies = _sampled(checkpoint, 3, 0.0)
    assert [r["q_accuracy"] for r in copies] == [r["accuracy"] for r in deterministic]


@pytest.mark.slow
def test_the_noise_is_reproducible_from_its_seed_whatever_the_batching_and_a_stop(checkpoint):
    first = _sampled(checkpoint, 3, 0.5, seed=7)
    assert first == _sampled(checkpoint, 3, 0.5, seed=7)
    # Other batches (2 puzzles of 3 rows, then 4 of 3), the same draws per (puzzle, trajectory, step).
    assert _sampled(checkpoint, 3, 0.5, seed=7, batch=12) == first
    # Stopped after its second batch, then continued from the tally: the same figures.
    tally = SampledTally(COUNTS)
    assert _sampled(checkpoint, 3, 0.5, seed=7, tally=tally, after_batch=lambda t: t.batches == 2) is None
    resumed = SampledTally.from_record(tally.to_record())
    assert _sampled(checkpoint, 3, 0.5, seed=7, tally=resumed) == first
    # Another seed draws other noise: the trajectories' Q-halt logits differ (the same seed: equal).
    assert not np.array_equal(_logits(checkpoint, 8), _logits(checkpoint, 7))
    assert np.array_equal(_logits(checkpoint, 7), _logits(checkpoint, 7))
    for record in first:
        assert set(SAMPLED_STATS) <= set(record) and record["trajectories"] == 3 and record["sigma"] == 0.5
        assert record["oracle_exact_accuracy"] >= max(
            record["q_exact_accuracy"], record["vote_exact_accuracy"]
        )


# ------------------------------------------------------------------------------------- a run's final evaluation


def _final(checkpoint, run: Path, stop=lambda _b: False, trajectories=(1, 3)):
    """The final evaluation of `trm train` on a copy of the trained run: a subset of 5 puzzles, noise 0.5."""
    return run_final_evaluation(
        checkpoint["evaluator"],
        checkpoint["on_device"],
        checkpoint["split"],
        run_dir=str(run),
        counts=COUNTS,
        headline=COUNTS[0],
        subset=5,
        sampling=Sampling(trajectories, 0.5),
        batch_size=4,
        summary={"checkpoint": "the trained run", "checkpoint_step": checkpoint["step"], "data": "easy"},
        writer=True,
        stop=stop,
    )


def _fresh_copy(checkpoint, path: Path) -> Path:
    """The trained run without its final evaluation's files."""
    shutil.copytree(checkpoint["run"], path)
    for name in ("test_time.json", "test_time.progress.json"):
        (path / name).unlink(missing_ok=True)
    return path


@pytest.mark.slow
def test_a_stopped_sampled_evaluation_resumes_to_the_same_figures_and_the_summary_reads_them(
    checkpoint, tmp_path
):
    whole = _fresh_copy(checkpoint, tmp_path / "whole")
    assert _final(checkpoint, whole) is not None
    written = json.loads((whole / "sampled.json").read_text())
    assert written["rows"] == {"subset_size": 5, "subset_seed": 0} and written["sigma"] == 0.5
    assert [(r["trajectories"], r["steps"], r["count"]) for r in written["results"]] == [
        (k, count, 5) for k in (1, 3) for count in COUNTS
    ]
    # Batches: 3 of the headline's 12 puzzles, 2 of the subset's 5, 2 of K = 1 (4 puzzles each), 5 of K = 3 (one
    # puzzle of 3 rows each). Stopped after the 9th, K = 3's second, then relaunched: the same file, and only K = 3's
    # last 3 batches evaluated again.
    stopped = _fresh_copy(checkpoint, tmp_path / "stopped")
    calls, resumed = [], []
    assert _final(checkpoint, stopped, stop=lambda b: calls.append(b) or len(calls) == 9) is None
    assert (stopped / "sampled.progress.json").exists()
    assert [r["trajectories"] for r in json.loads((stopped / "sampled.json").read_text())["results"]] == [
        1,
        1,
    ]
    assert _final(checkpoint, stopped, stop=lambda b: resumed.append(b) or False) is not None
    assert json.loads((stopped / "sampled.json").read_text()) == written
    assert len(resumed) == 3
    # The summary holds what the workflow asks for, and refuses what the run did not sample.
    summary = summarize(str(stopped), COUNTS, Sampling((3, 1), 0.5))
    assert [(r["trajectories"], r["steps"]) for r in summary["sampled"]] == [(3, 2), (3, 4), (1, 2), (1, 4)]
    three = summary["sampled"][0]
    assert summary["sampled_q_exact_accuracy"] == three["q_exact_accuracy"]
    assert summary["sampled_oracle_exact_accuracy"] == three["oracle_exact_accuracy"]
    with pytest.raises(UserError, match=r"no \(trajectories, steps\) \(2, 2\), \(2, 4\)"):
        summarize(str(stopped), COUNTS, Sampling((1, 2), 0.5))
    with pytest.raises(UserError, match="at noise 0.5, not step"):
        summarize(str(stopped), COUNTS, Sampling((1,), 0.3))
    assert (
        "sampled" not in summarize(str(stopped), COUNTS)
        and summarize(str(stopped), COUNTS)["sampled_vote_exact_accuracy"] is None
    )
    # A K added later is sampled alone.
    added = []
    _final(checkpoint, stopped, stop=lambda b: added.append(b) or False, trajectories=(1, 3, 2))
    assert [r["trajectories"] for r in json.loads((stopped / "sampled.json").read_text())["results"]] == [
        *(1, 1, 3, 3, 2, 2)
    ]
    assert len(added) == 3  # K = 2: 2 puzzles of 2 rows per batch


@pytest.mark.slow
def test_trm_evaluate_samples_and_refuses_bad_settings_in_one_line(trained, tmp_path, capsys):
    args = ["evaluate", "--checkpoint", str(trained["run"]), "--data", str(trained["built"]), "--steps", "2"]
    args += ["--cache-dir", str(trained["cache"])]
    out = tmp_path / "eval.json"
    assert trm([*args, "--trajectories", "1,2", "--noise", "0", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    plain, (one, two) = written["results"][0], written["sampled"]
    assert (one["trajectories"], two["trajectories"], one["sigma"]) == (1, 2, 0.0)
    assert one["q_exact_accuracy"] == two["vote_exact_accuracy"] == plain["exact_accuracy"]  # no noise
    assert (tmp_path / "eval-sampled.csv").read_text().count("\n") == 3
    for bad, named in (
        ("--trajectories=0", "--trajectories"),
        ("--noise=-1", "--noise"),
        ("--noise=nan", "--noise"),
    ):
        capsys.readouterr()
        assert trm([*args, "--trajectories", "2", bad]) == 2
        err = capsys.readouterr().err
        assert named in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2


def test_the_plan_prices_the_scales_sampled_grid_or_what_one_would_add(tmp_path):
    """The plan's `sampled:` line: at a scale that samples (smoke, K = 4), what its grid costs of the evaluation;
    where a scale samples none (the paper's default), what K = 4 and 16 would add, priced where there is a price."""
    one = {"experiments": ["exp06_c"], "replicates": {"smoke": {"baseline": 1}}}
    sampling = study(tmp_path / "k4", one)
    none = study(
        tmp_path / "none",
        {**one, "test_time_trajectories": {"smoke": []}, "accelerator": {"price_per_hour": 2.0}},
    )
    config = sampling.plan["exp06_c"].config
    costs, accelerator = model_costs(config), sampling.config["accelerator"]
    curve = (SMOKE.test_puzzles, sampling.test_time_steps, 1, sampling.test_time_subset)

    def added(grid: tuple[int, ...]) -> float:  # device-hours at the assumed FLOP rate
        flops = evaluation_flops(config, costs, *curve, grid) - evaluation_flops(config, costs, *curve)
        return accelerator_hours(flops, accelerator["peak_flops"], accelerator["utilization"])

    assert sampling.costs.sampled_hours["exp06_c"] == pytest.approx(added((4,)))
    evaluation = sampling.costs.hours["exp06_c"]["evaluation"]
    assert none.costs.hours["exp06_c"]["evaluation"] == pytest.approx(evaluation - added((4,)))
    what = "trajectories per puzzle to 32 steps on 64 test puzzles"
    (line,) = [line for line in sampling.costs.plan_text().splitlines() if line.startswith("  sampled:")]
    assert line == (
        f"  sampled:    K = 4 {what}: {added((4,)):.4g} CPU core-hours of the evaluation "
        "(test_time_trajectories.smoke)"
    )
    (line,) = [line for line in none.costs.plan_text().splitlines() if line.startswith("  sampled:")]
    assert line == (
        f"  sampled:    none (test_time_trajectories.smoke: []); K = 4 and 16 {what} would add "
        f"{added((4, 16)):.4g} CPU core-hours (${added((4, 16)) * 2:,.0f}) to the evaluation"
    )

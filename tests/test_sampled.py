"""Sampled test-time recursion (trm/train/sampled.py): sigma 0 and K = 1 is the deterministic evaluation bit for
bit; the noise is reproducible from its seed and independent of batching and of where a pass continued."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_run import TRAINED

from trm.errors import UserError
from trm.train.evaluate_checkpoint import load_eval_split
from trm.train.evaluator import Evaluator, evaluate
from trm.train.sampled import (
    SAMPLED_STATS,
    SampledEvaluator,
    SampledTally,
    check_sampling,
    choose,
    evaluate_sampled,
    puzzles_per_batch,
)
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
    return {"split": split, "evaluator": evaluator, "on_device": on_device}


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

"""Stablemax/softmax cross-entropy against float64 NumPy, loss normalisation, metrics on halted rows only."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from trm.model.act import Carry, StepOutputs
from trm.train.loss import act_loss, softmax_cross_entropy, stablemax_cross_entropy

VOCAB, LENGTH = 11, 9


def np_stablemax_ce(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Float64 transcription of the original: s(x) = x + 1 (x >= 0), 1 / (1 - x + 1e-30) (x < 0)."""
    x = logits.astype(np.float64)
    s = np.where(x < 0, 1 / (1 - x + 1e-30), x + 1)
    logp = np.log(s / s.sum(-1, keepdims=True))
    mask = labels != -100
    picked = np.take_along_axis(logp, np.where(mask, labels, 0)[..., None], -1)[..., 0]
    return -np.where(mask, picked, 0)


def np_softmax_ce(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    logp = x - x.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    mask = labels != -100
    return -np.where(mask, np.take_along_axis(logp, np.where(mask, labels, 0)[..., None], -1)[..., 0], 0)


def random_case(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(batch, LENGTH, VOCAB)) * 8).astype(np.float32)
    labels = rng.integers(0, VOCAB, (batch, LENGTH)).astype(np.int32)
    labels[0, :3] = -100
    return logits, labels


def make(logits, labels, halted, steps=None, q_halt=None):
    batch = len(labels)
    outputs = StepOutputs(
        logits=jnp.asarray(logits),
        q_halt_logits=jnp.asarray(np.zeros(batch) if q_halt is None else q_halt, jnp.float32),
        q_continue_logits=jnp.zeros((batch,), jnp.float32),
    )
    carry = Carry(
        z_H=jnp.zeros((batch, 1, 1)),
        z_L=jnp.zeros((batch, 1, 1)),
        steps=jnp.asarray(np.arange(1, batch + 1) if steps is None else steps, jnp.int32),
        halted=jnp.asarray(halted),
        inputs=jnp.zeros((batch, LENGTH), jnp.int32),
        labels=jnp.asarray(labels),
        puzzle_identifiers=jnp.zeros((batch,), jnp.int32),
    )
    return outputs, carry


def test_stablemax_and_softmax_match_float64_numpy():
    logits, labels = random_case(4)
    logits[1, 0] = [-200, -1e-3, 0, 1e-3, 50, 300, -5, 2, 3, 4, 5]  # extremes and both branches of s(x)
    np.testing.assert_allclose(
        stablemax_cross_entropy(jnp.asarray(logits), jnp.asarray(labels)),
        np_stablemax_ce(logits, labels),
        rtol=2e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        softmax_cross_entropy(jnp.asarray(logits), jnp.asarray(labels)),
        np_softmax_ce(logits, labels),
        rtol=2e-5,
        atol=1e-5,
    )
    assert np.all(np.asarray(stablemax_cross_entropy(jnp.asarray(logits), jnp.asarray(labels)))[0, :3] == 0)
    # bfloat16 logits (the TPU forward dtype) are upcast before the loss.
    bf16 = jnp.asarray(logits, jnp.bfloat16)
    assert stablemax_cross_entropy(bf16, jnp.asarray(labels)).dtype == jnp.float32


@pytest.mark.parametrize("loss", ["stablemax", "softmax"])
@pytest.mark.slow
def test_loss_is_mean_ce_per_row_summed_plus_half_bce_over_global_batch(loss):
    logits, labels = random_case(6)
    q_halt = np.array([-3.0, -0.5, 0.0, 0.7, 4.0, -20.0])
    halted = np.array([True, False, True, False, True, False])
    outputs, carry = make(logits, labels, halted, q_halt=q_halt)
    total, metrics = act_loss(outputs, carry, global_batch_size=24, loss=loss)

    ce = (np_stablemax_ce if loss == "stablemax" else np_softmax_ce)(logits, labels)
    counts = (labels != -100).sum(-1)
    lm_loss = (ce.sum(-1) / counts).sum()
    correct = np.all((logits.argmax(-1) == labels) | (labels == -100), axis=-1).astype(np.float64)
    bce = np.log1p(np.exp(-np.abs(q_halt))) + np.maximum(q_halt, 0) - q_halt * correct
    assert float(metrics["lm_loss"]) == pytest.approx(lm_loss, rel=1e-5)
    assert float(metrics["q_halt_loss"]) == pytest.approx(bce.sum(), rel=1e-5)
    assert float(total) == pytest.approx((lm_loss + 0.5 * bce.sum()) / 24, rel=1e-5)

    # Every row counts, halted or not; halves of the batch add up to the whole (micro-batches, shards).
    halves = [
        act_loss(*make(logits[s], labels[s], halted[s], q_halt=q_halt[s]), global_batch_size=24, loss=loss)[0]
        for s in (slice(0, 3), slice(3, 6))
    ]
    assert float(sum(halves)) == pytest.approx(float(total), rel=1e-5)


@pytest.mark.slow
def test_metrics_count_only_halted_rows_with_labels():
    rng = np.random.default_rng(1)
    labels = rng.integers(2, VOCAB, (5, LENGTH)).astype(np.int32)
    logits = np.full((5, LENGTH, VOCAB), -1.0, np.float32)
    predicted = labels.copy()
    predicted[1, :4] = labels[1, :4] - 1  # row 1: 5/9 right
    predicted[3, 0] = labels[3, 0] - 1  # row 3: 8/9 right
    np.put_along_axis(logits, predicted[..., None], 5.0, axis=-1)
    labels[4] = -100  # a padded row: never counted
    halted = np.array([True, True, False, True, True])
    steps = np.array([3, 16, 2, 7, 16])
    q_halt = np.array(
        [1.0, 2.0, 1.0, -1.0, 1.0]
    )  # row 0 right & q >= 0; row 1 wrong & q >= 0; row 3 wrong & q < 0

    _, metrics = act_loss(*make(logits, labels, halted, steps=steps, q_halt=q_halt), global_batch_size=5)
    # Valid rows: 0, 1, 3 (row 2 is still running, row 4 has no labels).
    assert float(metrics["count"]) == 3
    assert float(metrics["accuracy"]) == pytest.approx(1 + 5 / 9 + 8 / 9, rel=1e-6)
    assert float(metrics["exact_accuracy"]) == 1
    assert float(metrics["q_halt_accuracy"]) == 2  # rows 0 and 3
    assert float(metrics["steps"]) == 3 + 16 + 7
    assert float(metrics["steps_sq"]) == 3**2 + 16**2 + 7**2
    # The padded row still enters the loss with a zero CE (divisor max(count, 1)).
    assert np.isfinite(float(metrics["lm_loss"]))


@pytest.mark.slow
def test_padding_rows_add_nothing_to_the_losses():
    """Evaluation pads the last batch with label-less rows; they must not change any loss or metric sum."""
    logits, labels = random_case(batch=3, seed=5)
    padded_labels = labels.copy()
    padded_labels[2] = -100
    halted = np.ones(3, bool)
    _, full = act_loss(*make(logits, padded_labels, halted), global_batch_size=3)
    _, real = act_loss(*make(logits[:2], labels[:2], halted[:2]), global_batch_size=3)
    for key in real:
        np.testing.assert_allclose(float(full[key]), float(real[key]), rtol=1e-6, err_msg=key)


@pytest.mark.slow
def test_stablemax_gradient_is_finite_where_the_unused_branch_has_a_pole():
    """bfloat16 logits hit x = 1 exactly, the pole of the negative branch 1 / (1 - x)."""
    import jax

    logits = jnp.array([[[1.0, -1.0, 0.0, 2.0, 1.0]]], jnp.bfloat16)
    labels = jnp.array([[3]], jnp.int32)
    grad = jax.grad(lambda x: stablemax_cross_entropy(x, labels).sum())(logits)
    assert bool(jnp.isfinite(grad.astype(jnp.float32)).all())

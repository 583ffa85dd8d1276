"""TRM loss and metrics for one supervision step (the original's ACTLossHead).

Deviation: the original computes stablemax in float64; TPUs have no native float64, so we compute it in
float32. For x < 0 the original's 1e-30 epsilon in 1/(1 - x + eps) is below float32 (and float64)
resolution next to 1 - x >= 1, so it is kept only for fidelity of the formula.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from trm.model.act import Carry, StepOutputs

IGNORE_LABEL = -100
METRIC_KEYS = (
    "count",
    "accuracy",
    "exact_accuracy",
    "q_halt_accuracy",
    "steps",
    "steps_sq",
    "lm_loss",
    "q_halt_loss",
)


def log_stablemax(logits: jax.Array) -> jax.Array:
    """log(s(x) / sum s(x)) over the last axis, s(x) = x + 1 for x >= 0 and 1 / (1 - x) for x < 0; float32."""
    x = logits.astype(jnp.float32)
    # Each branch sees only its own half of the inputs: jnp.where differentiates both branches, and the unused
    # 1 / (1 - x) at x = 1 (common with bfloat16 logits) would give an infinite gradient and then 0 * inf = NaN.
    negative = jnp.minimum(x, 0.0)
    s = jnp.where(x < 0, 1.0 / (1.0 - negative + 1e-30), x + 1.0)
    return jnp.log(s / jnp.sum(s, axis=-1, keepdims=True))


def stablemax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-token stablemax CE [B, L] in float32; 0 where labels == -100."""
    return _cross_entropy(log_stablemax(logits), labels)


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-token softmax CE [B, L] in float32; 0 where labels == -100."""
    return _cross_entropy(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), labels)


def _cross_entropy(logprobs: jax.Array, labels: jax.Array) -> jax.Array:
    mask = labels != IGNORE_LABEL
    picked = jnp.take_along_axis(logprobs, jnp.where(mask, labels, 0)[..., None], axis=-1)[..., 0]
    return -jnp.where(mask, picked, 0.0)


CROSS_ENTROPY = {"stablemax": stablemax_cross_entropy, "softmax": softmax_cross_entropy}


def act_loss(
    outputs: StepOutputs, carry: Carry, *, global_batch_size: int, loss: str = "stablemax"
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Loss to differentiate and metric sums for one supervision step.

    carry: the carry AFTER the step (its labels, halted and steps belong to the rows just computed).
    Returns (loss, metrics):
    - loss = (lm_loss + 0.5 * q_halt_loss) / global_batch_size, where lm_loss sums the per-sequence mean CE
      over the rows and q_halt_loss sums BCE-with-logits(q_halt, sequence exactly right). Every row counts,
      halted or not. Dividing by the GLOBAL batch size makes sums over micro-batches or shards add up.
    - metrics: float32 sums over the rows that halted at this step and have a label (`count` of them):
      accuracy (per-row cell accuracy), exact_accuracy, q_halt_accuracy, steps; plus lm_loss and
      q_halt_loss summed over all rows. Divide by count (losses by global_batch_size) to log.
    """
    labels = carry.labels
    mask = labels != IGNORE_LABEL
    counts = mask.sum(-1)
    divisor = jnp.maximum(counts, 1).astype(jnp.float32)

    lm_loss = jnp.sum(CROSS_ENTROPY[loss](outputs.logits, labels).sum(-1) / divisor)

    is_correct = mask & (jnp.argmax(outputs.logits, axis=-1) == labels)
    seq_is_correct = is_correct.sum(-1) == counts
    q_halt = outputs.q_halt_logits.astype(jnp.float32)
    target = seq_is_correct.astype(jnp.float32)
    # Numerically stable BCE with logits: max(x, 0) - x*t + log(1 + exp(-|x|)).
    bce = jnp.maximum(q_halt, 0) - q_halt * target + jnp.log1p(jnp.exp(-jnp.abs(q_halt)))
    # Rows without labels (evaluation padding) count as "exactly right" in the original and add a spurious
    # BCE term; they are left out here. Training batches have no such rows, so training is unchanged.
    q_halt_loss = jnp.sum(jnp.where(counts > 0, bce, 0.0))

    total = (lm_loss + 0.5 * q_halt_loss) / global_batch_size

    valid = carry.halted & (counts > 0)
    metrics = {
        "count": valid.sum(),
        "accuracy": jnp.where(valid, is_correct.sum(-1) / divisor, 0.0).sum(),
        "exact_accuracy": (valid & seq_is_correct).sum(),
        "q_halt_accuracy": (valid & ((q_halt >= 0) == seq_is_correct)).sum(),
        "steps": jnp.where(valid, carry.steps, 0).sum(),
        "steps_sq": jnp.where(valid, jnp.square(carry.steps), 0).sum(),  # for the halt-step variance
        "lm_loss": lm_loss,
        "q_halt_loss": q_halt_loss,
    }
    metrics = {k: jax.lax.stop_gradient(v.astype(jnp.float32)) for k, v in metrics.items()}
    return total, metrics

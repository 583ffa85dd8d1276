"""Precision: sums over the batch and the sequence run in float32 under a bfloat16 forward; start states keep
their values."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_configs import model_config

from trm.model.trm import TRM, split_state


@pytest.mark.slow
def test_embedding_gradients_are_summed_in_float32_under_a_bfloat16_forward():
    # Learned positions too, so that all three tables are checked; 620 x 81 = 50,220 lookups of one token.
    cfg = model_config(
        vocab_size=11,
        seq_len=81,
        num_puzzle_identifiers=2,
        hidden_size=16,
        num_heads=2,
        puzzle_emb_len=1,
        mlp_t=False,
        pos_encodings="learned",
        forward_dtype="bfloat16",
    )
    rows, token, puzzle_id = 620, 3, 1
    graphdef, params, puzzle_emb, buffers = split_state(TRM(cfg, rngs=nnx.Rngs(0)))
    inputs = jnp.full((rows, cfg.seq_len), token, jnp.int32)
    ids = jnp.full((rows,), puzzle_id, jnp.int32)
    # Positive cotangents: the exact sum is well conditioned, so only the accumulation dtype can spoil it.
    weights = np.random.default_rng(0).uniform(0.5, 1.5, (rows, cfg.total_len, cfg.hidden_size))

    def loss(params, puzzle_emb):
        x = nnx.merge(graphdef, params, puzzle_emb, buffers).input_embeddings(inputs, ids)
        return jnp.sum(x.astype(jnp.float32) * jnp.asarray(weights, jnp.float32))

    grads, emb_grads = jax.grad(loss, argnums=(0, 1))(params, puzzle_emb)
    scale = 0.707106781 * math.sqrt(cfg.hidden_size)  # learned positions: 0.7071 * (emb + pos) * sqrt(D)
    tokens = np.asarray(grads["embed_tokens"][...])
    np.testing.assert_allclose(tokens[token], weights[:, 1:].sum((0, 1)) * scale, rtol=1e-2)
    assert np.all(np.delete(tokens, token, axis=0) == 0)
    table = np.asarray(emb_grads["puzzle_emb"][...])
    np.testing.assert_allclose(table[puzzle_id], weights[:, 0].sum(0) * scale, rtol=1e-2)
    assert np.all(table[1 - puzzle_id] == 0)
    np.testing.assert_allclose(np.asarray(grads["embed_pos"][...]), weights.sum(0) * scale, rtol=1e-2)


def test_silu_takes_its_sigmoid_in_float32():
    """In bfloat16 the sigmoid rounds once, so SiLU is off by at most two roundings (2^-7 relative) on every
    bfloat16 value in [-12, 12]; jax.nn.silu, rounding after each operation, is not. Float32 is unchanged."""
    import ml_dtypes

    from trm.model.layers import silu

    values = np.unique(np.linspace(-12, 12, 200_001).astype(ml_dtypes.bfloat16))
    exact = values.astype(np.float64) / (1.0 + np.exp(-values.astype(np.float64)))

    def relative_error(fn) -> float:
        got = np.asarray(jax.jit(fn)(jnp.asarray(values)), np.float64)
        return float(np.max(np.abs(got - exact) / np.maximum(np.abs(exact), 1e-30)))

    assert len(values) > 2000
    assert relative_error(silu) <= 2.0**-7 < relative_error(jax.nn.silu)
    x32 = np.random.default_rng(0).normal(size=10_000).astype(np.float32)
    np.testing.assert_array_equal(jax.jit(silu)(x32), jax.jit(jax.nn.silu)(x32))

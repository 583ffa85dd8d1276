"""The streaming ACT step: reset/refill, halting, exploration, fixed-step evaluation, one compile per shape."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_configs import model_config

from trm.model.act import act_step, initial_carry
from trm.model.trm import TRM, split_state
from trm.train.loss import act_loss

BATCH = 8


def tiny_model(q_halt_bias: float = -5.0, **changes) -> TRM:
    base = dict(
        vocab_size=11,
        seq_len=9,
        num_puzzle_identifiers=3,
        hidden_size=32,
        num_heads=2,
        H_cycles=2,
        L_cycles=1,
        puzzle_emb_len=2,
        halt_max_steps=4,
        forward_dtype="float32",
    )
    model = TRM(model_config(**{**base, **changes}), rngs=nnx.Rngs(0))
    model.q_head.bias[...] = jnp.array([q_halt_bias, -5.0], jnp.float32)
    return model


def make_batch(model: TRM, seed: int) -> dict[str, jax.Array]:
    cfg, rng = model.cfg, np.random.default_rng(seed)
    return {
        "inputs": jnp.asarray(rng.integers(1, cfg.vocab_size, (BATCH, cfg.seq_len)), jnp.int32),
        "labels": jnp.asarray(rng.integers(2, cfg.vocab_size, (BATCH, cfg.seq_len)), jnp.int32),
        "puzzle_identifiers": jnp.asarray(rng.integers(0, cfg.num_puzzle_identifiers, (BATCH,)), jnp.int32),
    }


def jitted_step(model: TRM, *, training: bool, **static):
    """act_step under jax.jit on the split model state; exploration_prob stays a traced argument."""
    graphdef, state = nnx.split(model)
    traces = []

    @jax.jit
    def step(state, carry, batch, rng, prob):
        traces.append(1)
        return act_step(
            nnx.merge(graphdef, state),
            carry,
            batch,
            training=training,
            rng=rng,
            exploration_prob=prob,
            **static,
        )

    def run(carry, batch, rng=None, prob=0.0):
        return step(state, carry, batch, jax.random.key(0) if rng is None else rng, jnp.float32(prob))

    run.traces = traces
    return run


@pytest.mark.slow
def test_first_step_loads_the_whole_batch():
    model = tiny_model()
    step = jitted_step(model, training=False)
    batch = make_batch(model, 0)
    carry, out = step(initial_carry(model, BATCH), batch)
    for key in ("inputs", "labels", "puzzle_identifiers"):
        np.testing.assert_array_equal(getattr(carry, key), batch[key])
    np.testing.assert_array_equal(carry.steps, 1)
    assert not carry.halted.any()
    assert out.logits.shape == (BATCH, 9, 11) and out.q_halt_logits.shape == (BATCH,)


@pytest.mark.slow
def test_halted_rows_reset_and_take_new_data_running_rows_keep_theirs():
    model = tiny_model()
    step = jitted_step(model, training=False)
    batch_a, batch_b = make_batch(model, 0), make_batch(model, 1)
    carry, _ = step(initial_carry(model, BATCH), batch_a)
    halted = jnp.array([True, False] * (BATCH // 2))
    carry = carry._replace(halted=halted)
    new, _ = step(carry, batch_b)

    h = np.asarray(halted)
    for key in ("inputs", "labels", "puzzle_identifiers"):
        np.testing.assert_array_equal(np.asarray(getattr(new, key))[h], np.asarray(batch_b[key])[h])
        np.testing.assert_array_equal(np.asarray(getattr(new, key))[~h], np.asarray(batch_a[key])[~h])
    np.testing.assert_array_equal(new.steps, np.where(h, 1, 2))

    # Latents: reset rows start from H_init/L_init on the new puzzle; running rows continue from the carry.
    cfg = model.cfg
    shape = (BATCH, cfg.total_len, cfg.hidden_size)
    fresh = model(
        jnp.broadcast_to(model.H_init[...].astype(cfg.dtype), shape),
        jnp.broadcast_to(model.L_init[...].astype(cfg.dtype), shape),
        batch_b["inputs"],
        batch_b["puzzle_identifiers"],
    )
    continued = model(carry.z_H, carry.z_L, batch_a["inputs"], batch_a["puzzle_identifiers"])
    for i, (z_fresh, z_continued, z_new) in enumerate(
        zip(fresh[:2], continued[:2], (new.z_H, new.z_L), strict=True)
    ):
        np.testing.assert_allclose(
            np.asarray(z_new)[h], np.asarray(z_fresh)[h], rtol=1e-5, atol=1e-5, err_msg=f"z {i}"
        )
        np.testing.assert_allclose(np.asarray(z_new)[~h], np.asarray(z_continued)[~h], rtol=1e-5, atol=1e-5)


def test_rows_halt_at_max_steps_then_refill():
    model = tiny_model()  # q_halt = -5: never halts early
    step = jitted_step(model, training=True)
    carry = initial_carry(model, BATCH)
    for expected_steps in (1, 2, 3, 4):
        carry, _ = step(carry, make_batch(model, expected_steps))
        np.testing.assert_array_equal(carry.steps, expected_steps)
        assert bool(carry.halted.all()) == (expected_steps == 4)
    batch = make_batch(model, 99)
    carry, _ = step(carry, batch)
    np.testing.assert_array_equal(carry.steps, 1)
    np.testing.assert_array_equal(carry.inputs, batch["inputs"])


def test_q_halt_stops_rows_in_training_but_not_in_evaluation():
    model = tiny_model(q_halt_bias=5.0)  # q_head weight is 0: every row's q_halt logit is +5
    carry, _ = jitted_step(model, training=True)(initial_carry(model, BATCH), make_batch(model, 0))
    assert carry.halted.all()
    carry, _ = jitted_step(model, training=False)(initial_carry(model, BATCH), make_batch(model, 0))
    assert not carry.halted.any()


def test_exploration_keeps_rows_running_for_a_random_minimum():
    model = tiny_model(q_halt_bias=5.0, halt_max_steps=6)
    step = jitted_step(model, training=True)
    batch = make_batch(model, 0)
    first, _ = step(initial_carry(model, BATCH), batch, prob=1.0)
    assert not first.halted.any()  # every row explores, min_halt >= 2

    # Follow rows to their first halt: with q_halt > 0 a row halts when steps >= its fresh min_halt draw.
    halt_step = np.zeros(BATCH, int)
    carry, rng = first, jax.random.key(7)
    for _ in range(5):
        rng, key = jax.random.split(rng)
        carry, _ = step(carry, batch, rng=key, prob=1.0)
        done = np.asarray(carry.halted) & (halt_step == 0)
        halt_step[done] = np.asarray(carry.steps)[done]
        carry = carry._replace(halted=jnp.zeros_like(carry.halted))  # keep every row on its puzzle
    assert np.all((halt_step >= 2) & (halt_step <= 6)) and len(set(halt_step)) > 1

    again, _ = step(first, batch, rng=jax.random.key(3), prob=1.0)
    same, _ = step(first, batch, rng=jax.random.key(3), prob=1.0)
    np.testing.assert_array_equal(again.halted, same.halted)
    no_explore, _ = step(first, batch, rng=jax.random.key(3), prob=0.0)
    assert no_explore.halted.all()
    assert len(step.traces) == 1  # the exploration probability is traced: annealing never recompiles


def test_evaluation_runs_a_fixed_number_of_steps_beyond_halt_max_steps():
    # A Q head that says halt at once and a limit of one step: evaluation still runs every row max_steps steps.
    model = tiny_model(q_halt_bias=5.0, halt_max_steps=1)
    batch = make_batch(model, 0)
    step = jitted_step(model, training=False, max_steps=2)
    carry, _ = step(initial_carry(model, BATCH), batch)
    np.testing.assert_array_equal(carry.steps, 1)
    assert not carry.halted.any()
    carry, _ = step(carry, batch)
    np.testing.assert_array_equal(carry.steps, 2)
    assert carry.halted.all()


@pytest.mark.slow
def test_train_step_compiles_once_per_depth_and_detaches_the_carry():
    model = tiny_model()
    graphdef, params, puzzle, buffers = split_state(model)
    traces = []

    @jax.jit(static_argnames=("H_cycles",))
    def train_step(params, puzzle, carry, batch, rng, prob, H_cycles=None):
        traces.append(H_cycles)

        def loss_fn(params, puzzle):
            m = nnx.merge(graphdef, params, puzzle, buffers)
            new_carry, out = act_step(
                m, carry, batch, training=True, rng=rng, exploration_prob=prob, H_cycles=H_cycles
            )
            loss, metrics = act_loss(out, new_carry, global_batch_size=BATCH)
            return loss, (new_carry, metrics)

        (loss, (new_carry, metrics)), grads = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
            params, puzzle
        )
        return loss, new_carry, grads

    carry = initial_carry(model, BATCH)
    for i in range(3):
        loss, carry, (grads, puzzle_grads) = train_step(
            params, puzzle, carry, make_batch(model, i), jax.random.key(i), jnp.float32(0.1 * i)
        )
    assert len(traces) == 1
    assert np.isfinite(float(loss))
    assert float(jnp.abs(puzzle_grads["puzzle_emb"][...]).sum()) > 0  # the prefix vector gets a gradient
    assert float(jnp.abs(grads["lm_head"]["weight"][...]).sum()) > 0
    train_step(params, puzzle, carry, make_batch(model, 5), jax.random.key(5), jnp.float32(0.1), H_cycles=1)
    assert traces == [None, 1]


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.slow
def test_new_carry_is_detached(training):
    model = tiny_model()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    batch = make_batch(model, 0)

    def latent_sum(params):
        carry, _ = act_step(
            nnx.merge(graphdef, params, rest),
            initial_carry(model, BATCH),
            batch,
            training=training,
            rng=jax.random.key(0),
        )
        return jnp.sum(carry.z_H) + jnp.sum(carry.z_L)

    grads = jax.grad(latent_sum)(params)
    assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(grads))

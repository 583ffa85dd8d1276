"""Adaptive computation time as a stream (deep supervision, as the original's ACT wrapper).

Training: every optimizer step runs ONE supervision step for every row of the batch. A row whose puzzle
has halted is reset (latents <- H_init/L_init, steps <- 0) and takes its puzzle from the incoming batch; a
running row keeps its latents, step count and puzzle, and its slice of the incoming batch is discarded.
A row halts at halt_max_steps, or earlier when its Q-halt logit is positive, except that with probability
`exploration_prob` it is made to run at least UniformInt[2, halt_max_steps] steps.

Evaluation: no Q halting; every row runs exactly `max_steps` steps (default halt_max_steps, may be larger
for test-time scaling). All functions are jit-friendly with static shapes and no host round trips.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from trm.model.trm import TRM


class Carry(NamedTuple):
    """State carried between supervision steps (a pytree). Latents [B, S, D] are in the forward dtype."""

    z_H: jax.Array
    z_L: jax.Array
    steps: jax.Array  # int32 [B]: supervision steps taken on the current puzzle
    halted: jax.Array  # bool [B]: the row takes a new puzzle at the next step
    inputs: jax.Array  # int32 [B, seq_len]
    labels: jax.Array  # int32 [B, seq_len], -100 = ignored
    puzzle_identifiers: jax.Array  # int32 [B]


class HaltDraws(NamedTuple):
    """The random numbers of halting exploration for every row of one supervision step."""

    uniform: jax.Array  # float32 [B]: the row explores when uniform < exploration_prob
    min_halt: jax.Array  # int32 [B]: an exploring row runs at least this many steps, UniformInt[2, max_steps]


def halt_draws(rng: jax.Array, num_rows: int, max_steps: int) -> HaltDraws:
    """Exploration draws for `num_rows` rows from `rng` (the same numbers however the rows are sharded)."""
    explore_key, min_halt_key = jax.random.split(rng)
    return HaltDraws(
        uniform=jax.random.uniform(explore_key, (num_rows,)),
        min_halt=jax.random.randint(min_halt_key, (num_rows,), 2, max_steps + 1),
    )


class StepOutputs(NamedTuple):
    """What one supervision step produces for the loss (gradients flow through these)."""

    logits: jax.Array  # [B, seq_len, vocab], forward dtype
    q_halt_logits: jax.Array  # float32 [B]
    q_continue_logits: jax.Array  # float32 [B]; reported only (no Q-continue loss in TRM)


def initial_carry(model: TRM, batch_size: int) -> Carry:
    """An empty carry with every row halted, so the first step loads the whole incoming batch."""
    cfg = model.cfg
    latent = jnp.zeros((batch_size, cfg.total_len, cfg.hidden_size), cfg.dtype)
    return Carry(
        z_H=latent,
        z_L=latent,
        steps=jnp.zeros((batch_size,), jnp.int32),
        halted=jnp.ones((batch_size,), bool),
        inputs=jnp.zeros((batch_size, cfg.seq_len), jnp.int32),
        labels=jnp.full((batch_size, cfg.seq_len), -100, jnp.int32),
        puzzle_identifiers=jnp.zeros((batch_size,), jnp.int32),
    )


def _rows(mask: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    """Per-row select: new where mask [B] is set, else old."""
    return jnp.where(mask.reshape(mask.shape + (1,) * (new.ndim - 1)), new, old)


def act_step(
    model: TRM,
    carry: Carry,
    batch: dict[str, jax.Array],
    *,
    training: bool,
    rng: jax.Array | None = None,
    draws: HaltDraws | None = None,
    exploration_prob: jax.Array | float | None = None,
    max_steps: int | None = None,
    H_cycles: int | None = None,
    L_cycles: int | None = None,
    remat: bool = False,
    z_L_noise: jax.Array | None = None,
) -> tuple[Carry, StepOutputs]:
    """One supervision step for every row: reset and refill halted rows, recurse, decide halting.

    batch: {"inputs" [B, seq_len], "labels" [B, seq_len], "puzzle_identifiers" [B]} (int32).
    training: static. In training, exploration needs `rng`, or `draws` made by `halt_draws` (the train step
    draws for the whole batch and hands each device its rows' draws); `exploration_prob` may be a traced
    scalar (annealing does not recompile), default the config's halt_exploration_prob.
    max_steps: static; default halt_max_steps. In evaluation it is the fixed number of steps.
    H_cycles, L_cycles: static depth overrides (curriculum). remat: static, see TRM.__call__.
    z_L_noise: [B, S, D], added to z_L after the reset and before the recursions (sampled test-time
    recursion, trm/train/sampled.py); None adds nothing (the program is then the deterministic one).
    Returns the new, detached carry and the outputs. The loss reads labels/halted/steps from the new carry.
    """
    cfg = model.cfg
    max_steps = cfg.halt_max_steps if max_steps is None else max_steps
    reset = carry.halted
    z_H = _rows(reset, model.H_init[...].astype(cfg.dtype)[None, None, :], carry.z_H)
    z_L = _rows(reset, model.L_init[...].astype(cfg.dtype)[None, None, :], carry.z_L)
    if z_L_noise is not None:
        z_L = (z_L.astype(jnp.float32) + z_L_noise).astype(cfg.dtype)
    steps = jnp.where(reset, 0, carry.steps)
    inputs = _rows(reset, batch["inputs"].astype(jnp.int32), carry.inputs)
    labels = _rows(reset, batch["labels"].astype(jnp.int32), carry.labels)
    puzzle_identifiers = _rows(reset, batch["puzzle_identifiers"].astype(jnp.int32), carry.puzzle_identifiers)

    z_H, z_L, logits, q_logits = model(
        z_H, z_L, inputs, puzzle_identifiers, H_cycles=H_cycles, L_cycles=L_cycles, remat=remat
    )
    q_halt, q_continue = q_logits[:, 0], q_logits[:, 1]

    steps = steps + 1
    halted = steps >= max_steps
    if training and max_steps > 1:
        if draws is None:
            if rng is None:
                raise ValueError("act_step(training=True) needs an rng (or draws) for halting exploration")
            draws = halt_draws(rng, steps.shape[0], max_steps)
        p = cfg.halt_exploration_prob if exploration_prob is None else exploration_prob
        halted = halted | (jax.lax.stop_gradient(q_halt) > 0)
        explore = draws.uniform < p
        halted = halted & (steps >= jnp.where(explore, draws.min_halt, 0))

    new_carry = Carry(
        z_H=jax.lax.stop_gradient(z_H),
        z_L=jax.lax.stop_gradient(z_L),
        steps=steps,
        halted=halted,
        inputs=inputs,
        labels=labels,
        puzzle_identifiers=puzzle_identifiers,
    )
    return new_carry, StepOutputs(logits, q_halt, q_continue)

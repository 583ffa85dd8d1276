"""The training state and the compiled train and eval steps.

The state is one pytree of plain arrays (pure dicts, no Flax objects), so orbax saves it as it is and jit
sees no Python objects. One train step = one supervision step for every row (spec trm.md §6): forward and
backward of the ACT step, the dense optimizer, the puzzle-embedding sign-SGD and the EMA update, fused in
one jitted function with no host round trip. Recursion depth (H_cycles, L_cycles) is static: the curriculum
gets one compiled step per distinct value, cached in `TrainStep`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from trm.model.act import Carry, act_step, evaluate_batch, initial_carry
from trm.model.config import ModelConfig
from trm.model.trm import TRM, split_state
from trm.train.ema import ema_init, ema_update, eval_params
from trm.train.loss import act_loss
from trm.train.optim import build_optimizer, build_puzzle_emb_optimizer


class TrainState(NamedTuple):
    params: Any  # pure dict of the trained parameters (fp32 masters)
    puzzle_emb: jax.Array  # [num_puzzle_identifiers, puzzle_emb_dim], trained by sign-SGD
    buffers: Any  # pure dict: H_init, L_init (frozen)
    opt_state: Any
    puzzle_emb_opt_state: Any
    ema: Any  # pure dict like params, or None when EMA is off
    carry: Carry
    rng: jax.Array  # raw key data (uint32), so it checkpoints as a plain array
    step: jax.Array  # int32 scalar: optimizer steps done


class Model:
    """The model's static structure (graphdef) and how to rebuild it from pure parameter dicts."""

    def __init__(self, cfg: ModelConfig, seed: int) -> None:
        self.cfg = cfg
        module = TRM(cfg, rngs=nnx.Rngs(seed))
        self.graphdef, params, puzzle_emb, buffers = split_state(module)
        self._templates = (params, puzzle_emb, buffers)
        self.init_params = nnx.to_pure_dict(params)
        self.init_puzzle_emb = nnx.to_pure_dict(puzzle_emb)["puzzle_emb"]
        self.init_buffers = nnx.to_pure_dict(buffers)

    def bind(self, params: Any, puzzle_emb: jax.Array, buffers: Any) -> TRM:
        """A TRM module computing with the given arrays (usable inside jit and grad)."""
        templates = jax.tree.map(lambda x: x, self._templates)
        for template, values in zip(templates, (params, {"puzzle_emb": puzzle_emb}, buffers), strict=True):
            nnx.replace_by_pure_dict(template, values)
        return nnx.merge(self.graphdef, *templates)


def init_state(model: Model, config: dict, total_steps: int, batch_rows: int) -> TrainState:
    """Fresh state: initial parameters, optimizer states, EMA copy and an all-halted carry."""
    optimizer = build_optimizer(config["optim"], total_steps)
    emb_optimizer = build_puzzle_emb_optimizer(config["optim"], total_steps)
    module = model.bind(model.init_params, model.init_puzzle_emb, model.init_buffers)
    state = TrainState(
        params=model.init_params,
        puzzle_emb=model.init_puzzle_emb,
        buffers=model.init_buffers,
        opt_state=optimizer.init(model.init_params),
        puzzle_emb_opt_state=emb_optimizer.init(model.init_puzzle_emb),
        ema=ema_init(model.init_params) if config["optim"]["ema"] else None,
        carry=initial_carry(module, batch_rows),
        rng=jax.random.key_data(jax.random.key(config["train"]["seed"])),
        step=jnp.zeros([], jnp.int32),
    )
    # Every leaf gets its own buffer (the EMA starts as the params, z_H and z_L as one zero array), since the
    # train step donates the state.
    return jax.tree.map(lambda x: jnp.array(x, copy=True), state)


class TrainStep:
    """`step(state, batch, exploration_prob, cycles) -> (state, metric sums)`, compiled once per depth."""

    def __init__(self, model: Model, config: dict, total_steps: int) -> None:
        self.model = model
        self.config = config
        self.optimizer = build_optimizer(config["optim"], total_steps)
        self.emb_optimizer = build_puzzle_emb_optimizer(config["optim"], total_steps)
        self.global_batch_size = config["train"]["global_batch_size"]
        self._compiled = jax.jit(self._step, static_argnames="cycles", donate_argnums=0)

    def __call__(
        self, state: TrainState, batch: dict, exploration_prob: jax.Array, cycles: tuple[int, int]
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        return self._compiled(state, batch, exploration_prob, cycles=cycles)

    @property
    def compilations(self) -> int:
        """Number of compiled programs so far (for tests and logs: one per depth, none after warm-up)."""
        return self._compiled._cache_size()

    def _step(self, state: TrainState, batch: dict, exploration_prob: jax.Array, *, cycles: tuple[int, int]):
        h_cycles, l_cycles = cycles
        key, step_key = jax.random.split(jax.random.wrap_key_data(state.rng))

        def loss_fn(params, puzzle_emb):
            module = self.model.bind(params, puzzle_emb, state.buffers)
            carry, outputs = act_step(
                module,
                state.carry,
                batch,
                training=True,
                rng=step_key,
                exploration_prob=exploration_prob,
                H_cycles=h_cycles,
                L_cycles=l_cycles,
            )
            loss, metrics = act_loss(
                outputs, carry, global_batch_size=self.global_batch_size, loss=self.model.cfg.loss
            )
            return loss, (carry, metrics)

        (_, (carry, metrics)), (grads, emb_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
            state.params, state.puzzle_emb
        )
        emb_updates, emb_opt_state = self.emb_optimizer.update(
            emb_grads, state.puzzle_emb_opt_state, state.puzzle_emb, touched=carry.puzzle_identifiers
        )
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        optim = self.config["optim"]
        new_state = TrainState(
            params=params,
            puzzle_emb=optax.apply_updates(state.puzzle_emb, emb_updates),
            buffers=state.buffers,
            opt_state=opt_state,
            puzzle_emb_opt_state=emb_opt_state,
            ema=None if state.ema is None else ema_update(state.ema, params, optim["ema_rate"]),
            carry=carry,
            rng=jax.random.key_data(key),
            step=state.step + 1,
        )
        return new_state, metrics


class EvalStep:
    """`evaluate(state, batch) -> metric sums` after `num_steps` supervision steps, on the EMA weights."""

    def __init__(self, model: Model, num_steps: int) -> None:
        self.model = model
        self.num_steps = num_steps
        self._compiled = jax.jit(self._evaluate)

    def __call__(self, state: TrainState, batch: dict) -> dict[str, jax.Array]:
        return self._compiled(eval_params(state.params, state.ema), state.puzzle_emb, state.buffers, batch)

    def _evaluate(self, params, puzzle_emb, buffers, batch):
        module = self.model.bind(params, puzzle_emb, buffers)
        carry, outputs = evaluate_batch(module, batch, num_steps=self.num_steps)
        _, metrics = act_loss(
            outputs, carry, global_batch_size=batch["inputs"].shape[0], loss=module.cfg.loss
        )
        return metrics

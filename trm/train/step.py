"""The training state and the compiled train and eval steps.

The state is one pytree of plain arrays (pure dicts, no Flax objects), so orbax saves it as it is and jit
sees no Python objects. One train step = one supervision step for every row (spec trm.md §6): forward and
backward of the ACT step, the dense optimizer, the puzzle-embedding sign-SGD and the EMA update, fused in
one jitted function with no host round trip. Recursion depth (H_cycles, L_cycles) is static: the curriculum
gets one compiled step per distinct value, cached in `TrainStep`.

Data parallelism: the state lives on a one-axis mesh "data" of all devices (trm/run/distributed.py); the
parameters, optimizer states and EMA are replicated, the ACT carry and the batch are split by rows. XLA inserts
the gradient all-reduce and fuses it into one combined all-reduce per (micro-)batch. Gradient accumulation
(`train.micro_batches` = k) runs the supervision step on k interleaved row subsets in a `lax.scan` and sums the
gradients; the loss is normalised by the global batch, so the sum equals the one-batch gradient.
`train.remat` rematerialises each net call of the differentiated recursion (TRM.__call__).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trm.config import batch_split_problem
from trm.errors import UserError
from trm.model.act import Carry, act_step, evaluate_batch, initial_carry
from trm.model.config import ModelConfig
from trm.model.trm import TRM, split_state
from trm.run.distributed import DATA_AXIS, batch_sharded, data_mesh, put_global, put_host_rows, replicated
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


def init_state(
    model: Model, config: dict, total_steps: int, batch_rows: int, mesh: Mesh | None = None
) -> TrainState:
    """Fresh state on `mesh` (default: all devices): initial parameters, optimizer states, EMA, all-halted carry.

    Every process computes the same values (same seeds); the carry's rows are split over the mesh.
    """
    mesh = data_mesh() if mesh is None else mesh
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
    # Each leaf becomes its own global buffer (the EMA starts as the params, z_H and z_L as one zero array),
    # since the train step donates the state.
    return jax.tree.map(put_global, state, state_shardings(state, mesh))


def state_shardings(state: TrainState, mesh: Mesh) -> TrainState:
    """Where each leaf lives: the carry split by rows over the mesh, everything else replicated."""
    whole = replicated(mesh)
    shardings = jax.tree.map(lambda _: whole, state)
    return shardings._replace(carry=jax.tree.map(lambda _: batch_sharded(mesh), state.carry))


def check_train_config(train: dict, num_devices: int) -> None:
    """Refuse, before anything compiles or is written, what the train step cannot run on `num_devices`."""
    if problem := batch_split_problem(train, num_devices):
        raise UserError(problem)


class TrainStep:
    """`step(state, batch, exploration_prob, cycles) -> (state, metric sums)`, compiled once per depth.

    `batch` holds this process's rows of the global batch (NumPy) or global arrays already on the mesh.
    """

    def __init__(self, model: Model, config: dict, total_steps: int, mesh: Mesh | None = None) -> None:
        self.model = model
        self.config = config
        self.mesh = data_mesh() if mesh is None else mesh
        self.optimizer = build_optimizer(config["optim"], total_steps)
        self.emb_optimizer = build_puzzle_emb_optimizer(config["optim"], total_steps)
        self.global_batch_size = config["train"]["global_batch_size"]
        self.micro_batches = config["train"]["micro_batches"]
        check_train_config(config["train"], self.mesh.size)
        self._compiled = None  # built at the first call, when the state's structure is known

    def __call__(
        self, state: TrainState, batch: dict, exploration_prob: jax.Array, cycles: tuple[int, int]
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        return self._jitted(state)(*self._inputs(state, batch, exploration_prob), cycles=cycles)

    def lower(self, state: TrainState, batch: dict, exploration_prob: float, cycles: tuple[int, int]):
        """The lowered step (for inspecting its HLO); arguments as for a call."""
        return self._jitted(state).lower(*self._inputs(state, batch, exploration_prob), cycles=cycles)

    @property
    def compilations(self) -> int:
        """Number of compiled programs so far (for tests and logs: one per depth, none after warm-up)."""
        return 0 if self._compiled is None else self._compiled._cache_size()

    def gradients(self, state: TrainState, batch: dict, exploration_prob: float, cycles: tuple[int, int]):
        """(new carry, metric sums, (param grads, puzzle-emb grads)) of one step, without the update (for tests)."""
        state, batch, exploration_prob = self._inputs(state, batch, exploration_prob)
        key = jax.random.split(jax.random.wrap_key_data(state.rng))[1]
        run = jax.jit(self._accumulated_gradients, static_argnames="cycles")
        return run(state, batch, key, exploration_prob, cycles=cycles)

    def _inputs(self, state: TrainState, batch: dict, exploration_prob) -> tuple:
        if not all(isinstance(v, jax.Array) for v in batch.values()):
            batch = put_host_rows(batch, self.mesh)
        return state, batch, put_global(np.float32(exploration_prob), replicated(self.mesh))

    def _jitted(self, state: TrainState):
        # Explicit output shardings: the new state must carry exactly the shardings of the state it came from
        # (a 1-device mesh would otherwise report the carry as replicated), or every step would recompile.
        if self._compiled is None:
            self._compiled = jax.jit(
                self._step,
                static_argnames="cycles",
                donate_argnums=0,
                out_shardings=(state_shardings(state, self.mesh), replicated(self.mesh)),
            )
        return self._compiled

    def _gradients(self, params, puzzle_emb, buffers, carry, batch, rng, exploration_prob, cycles):
        """One supervision step on some rows: (new carry, metric sums, (param grads, puzzle-emb grads))."""

        def loss_fn(params, puzzle_emb):
            module = self.model.bind(params, puzzle_emb, buffers)
            new_carry, outputs = act_step(
                module,
                carry,
                batch,
                training=True,
                rng=rng,
                exploration_prob=exploration_prob,
                H_cycles=cycles[0],
                L_cycles=cycles[1],
                remat=self.config["train"]["remat"],
            )
            loss, metrics = act_loss(
                outputs, new_carry, global_batch_size=self.global_batch_size, loss=self.model.cfg.loss
            )
            return loss, (new_carry, metrics)

        (_, (new_carry, metrics)), grads = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
            params, puzzle_emb
        )
        return new_carry, metrics, grads

    def _accumulated_gradients(self, state: TrainState, batch: dict, rng, exploration_prob, cycles):
        """`_gradients` over all rows in `micro_batches` parts, summed; the carry is reassembled in row order.

        Part m holds rows m, m + k, m + 2k, ...: each device's block of rows splits into k equal local parts,
        so the split moves no data between devices.
        """
        k = self.micro_batches
        args = (state.params, state.puzzle_emb, state.buffers)
        if k == 1:
            return self._gradients(*args, state.carry, batch, rng, exploration_prob, cycles)

        def split(x):
            parts = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
            return jax.lax.with_sharding_constraint(
                parts, NamedSharding(self.mesh, PartitionSpec(None, DATA_AXIS))
            )

        def merge(parts):
            return parts.swapaxes(0, 1).reshape(-1, *parts.shape[2:])

        def part(sums, xs):
            carry, rows, index = xs
            new_carry, metrics, grads = self._gradients(
                *args, carry, rows, jax.random.fold_in(rng, index), exploration_prob, cycles
            )
            return jax.tree.map(jnp.add, sums, (metrics, grads)), new_carry

        xs = (jax.tree.map(split, state.carry), jax.tree.map(split, batch), jnp.arange(k))
        first = jax.tree.map(lambda x: x[0], xs)
        _, metrics_shape, grads_shape = jax.eval_shape(
            lambda c, b, i: self._gradients(*args, c, b, rng, exploration_prob, cycles), *first
        )
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (metrics_shape, grads_shape))
        (metrics, grads), carry_parts = jax.lax.scan(part, zeros, xs)
        return jax.tree.map(merge, carry_parts), metrics, grads

    def _step(self, state: TrainState, batch: dict, exploration_prob: jax.Array, *, cycles: tuple[int, int]):
        key, step_key = jax.random.split(jax.random.wrap_key_data(state.rng))
        carry, metrics, (grads, emb_grads) = self._accumulated_gradients(
            state, batch, step_key, exploration_prob, cycles
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
    """`evaluate(state, batch) -> metric sums` after `num_steps` supervision steps, on the EMA weights.

    `batch` holds this process's rows of a global evaluation batch.
    """

    def __init__(self, model: Model, num_steps: int, mesh: Mesh | None = None) -> None:
        self.model = model
        self.num_steps = num_steps
        self.mesh = data_mesh() if mesh is None else mesh
        self._compiled = jax.jit(self._evaluate, out_shardings=replicated(self.mesh))

    def __call__(self, state: TrainState, batch: dict) -> dict[str, jax.Array]:
        batch = put_host_rows(batch, self.mesh)
        return self._compiled(eval_params(state.params, state.ema), state.puzzle_emb, state.buffers, batch)

    def _evaluate(self, params, puzzle_emb, buffers, batch):
        module = self.model.bind(params, puzzle_emb, buffers)
        carry, outputs = evaluate_batch(module, batch, num_steps=self.num_steps)
        _, metrics = act_loss(
            outputs, carry, global_batch_size=batch["inputs"].shape[0], loss=module.cfg.loss
        )
        return metrics

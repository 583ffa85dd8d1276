"""The training state and the compiled train step (evaluation: trm/train/evaluator.py).

The state is one pytree of plain arrays (pure dicts, no Flax objects), so orbax saves it as it is and jit
sees no Python objects. One train step = one supervision step for every row: forward and
backward of the ACT step, the dense optimizer, the puzzle-embedding sign-SGD and the EMA update, fused in
one jitted function with no host round trip. Recursion depth (H_cycles, L_cycles) is static: the curriculum
gets one compiled step per distinct value, cached in `TrainStep`. The hyperparameters that same-shaped runs of the
study vary (learning rates and their schedules, EMA rate, step count) enter as inputs (`Hyperparameters`), not
constants, so those runs share one compiled program through JAX's persistent compilation cache. Each update's
learning rates are computed on the host in float64, as the original does.

Data parallelism: the state lives on a one-axis mesh "data" of all devices (trm/run/distributed.py); the
parameters, optimizer states and EMA are replicated, the ACT carry and the batch are split by rows. The
gradients are written per device with `jax.shard_map` (`_local_gradients`): each device differentiates the
supervision step on its own rows, then ONE `psum` sums gradients, metric sums and the touched puzzle rows over
the devices: the step's only all-reduce, in float32, however many parameters or micro-batches. The optimizer
update then runs on the replicated state, identically on every device. Gradient accumulation
(`train.micro_batches` = k) runs the supervision step on k interleaved row subsets in a `lax.scan` and sums the
gradients; the loss is normalised by the global batch, so the sum equals the one-batch gradient.
`train.remat` rematerialises each net call of the differentiated recursion (TRM.__call__).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from trm.config import batch_split_problem
from trm.errors import UserError
from trm.model.act import Carry, HaltDraws, act_step, halt_draws, initial_carry
from trm.model.config import ModelConfig
from trm.model.trm import TRM, split_state
from trm.run.distributed import DATA_AXIS, batch_sharded, data_mesh, put_global, put_host_rows, replicated
from trm.train.ema import EmaRate, ema_init, ema_rate, ema_update
from trm.train.loss import METRIC_KEYS, act_loss
from trm.train.optim import (
    build_optimizer,
    build_puzzle_emb_optimizer,
    dense_lr_schedule,
    puzzle_emb_lr_schedule,
    touched_rows,
)


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


class Hyperparameters(NamedTuple):
    """One update's hyperparameter inputs of the train step: float32 scalars computed on the host."""

    lr: np.float32  # of the dense parameters
    puzzle_emb_lr: np.float32
    ema: EmaRate


class ModelTemplate:
    """The model without its weights: its static structure (graphdef) and how to rebuild it from pure dicts."""

    def __init__(self, cfg: ModelConfig, seed: int) -> None:
        self.cfg = cfg
        # One compiled program rather than one eager dispatch per initializer: about half the setup time of a
        # small run, the same values (nnx.Rngs(seed) draws from jax.random.key(seed) too).
        build = nnx.jit(lambda key: TRM(cfg, rngs=nnx.Rngs(jax.random.wrap_key_data(key))))
        module = build(jax.random.key_data(jax.random.key(seed)))
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


def init_state(model: ModelTemplate, config: dict, batch_rows: int, mesh: Mesh | None = None) -> TrainState:
    """Fresh state on `mesh` (default: all devices): initial parameters, optimizer states, EMA, all-halted carry.

    Every process computes the same values (same seeds); the carry's rows are split over the mesh.
    """
    mesh = data_mesh() if mesh is None else mesh
    state = _fresh_state(model, config, batch_rows)
    # Each leaf becomes its own global buffer (the EMA starts as the params, z_H and z_L as one zero array),
    # since the train step donates the state.
    return jax.tree.map(put_global, state, state_shardings(state, mesh))


def abstract_state(model: ModelTemplate, config: dict, batch_rows: int, mesh: Mesh) -> TrainState:
    """The fresh state's shapes, dtypes and shardings on `mesh`, nothing allocated: for compiling ahead of time
    (e.g. for a TPU topology's devices, which this machine cannot hold arrays on)."""
    shapes = jax.eval_shape(lambda: _fresh_state(model, config, batch_rows))
    return jax.tree.map(
        lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
        shapes,
        state_shardings(shapes, mesh),
    )


def _fresh_state(model: ModelTemplate, config: dict, batch_rows: int) -> TrainState:
    # Initial optimizer states do not depend on the learning rate (nor, then, on the run's length).
    optimizer = build_optimizer(config["optim"], learning_rate=0.0)
    emb_optimizer = build_puzzle_emb_optimizer(config["optim"], learning_rate=0.0)
    module = model.bind(model.init_params, model.init_puzzle_emb, model.init_buffers)
    return TrainState(
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


def abstract_batch(cfg: ModelConfig, rows: int, mesh: Mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """A global batch's shapes, dtypes and shardings (rows split over `mesh`), as `put_host_rows` makes it."""
    sharding = batch_sharded(mesh)
    shapes = {"inputs": (rows, cfg.seq_len), "labels": (rows, cfg.seq_len), "puzzle_identifiers": (rows,)}
    return {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding) for k, shape in shapes.items()}


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
    """`step(state, batch, exploration_prob, cycles, update=t) -> (state, metric sums)`, compiled once per depth.

    `batch` holds this process's rows of the global batch (NumPy) or global arrays already on the mesh; `update`
    is the 1-based number of the update the step makes (it picks the learning rates).
    """

    def __init__(
        self, model: ModelTemplate, config: dict, total_steps: int, mesh: Mesh | None = None
    ) -> None:
        self.model = model
        self.config = config
        self.mesh = data_mesh() if mesh is None else mesh
        optim = config["optim"]
        self.lr = dense_lr_schedule(optim, total_steps)
        self.puzzle_emb_lr = puzzle_emb_lr_schedule(optim, total_steps)
        self.ema_rate = ema_rate(optim["ema_rate"])
        self.global_batch_size = config["train"]["global_batch_size"]
        self.micro_batches = config["train"]["micro_batches"]
        check_train_config(config["train"], self.mesh.size)
        self._compiled = None  # built at the first call, when the state's structure is known

    def __call__(
        self, state: TrainState, batch: dict, exploration_prob, cycles: tuple[int, int], *, update: int
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        return self._jitted(state)(*self._inputs(state, batch, exploration_prob, update), cycles=cycles)

    def lower(
        self, state: TrainState, batch: dict, exploration_prob, cycles: tuple[int, int], *, update: int = 1
    ):
        """The lowered step (for inspecting its HLO); arguments as for a call."""
        return self._jitted(state).lower(*self._inputs(state, batch, exploration_prob, update), cycles=cycles)

    def hyperparameters(self, update: int) -> Hyperparameters:
        """The hyperparameter inputs of the 1-based `update`."""
        lr, emb_lr = self.lr(update), self.puzzle_emb_lr(update)
        return Hyperparameters(lr=np.float32(lr), puzzle_emb_lr=np.float32(emb_lr), ema=self.ema_rate)

    @property
    def compilations(self) -> int:
        """Number of compiled programs so far (for tests and logs: one per depth, none after warm-up)."""
        return 0 if self._compiled is None else self._compiled._cache_size()

    def gradients(self, state: TrainState, batch: dict, exploration_prob: float, cycles: tuple[int, int]):
        """(new carry, metric sums, (param grads, puzzle-emb grads)) of one step, without the update (for tests)."""
        run, args = self._gradients_program(state, batch, exploration_prob)
        return run(*args, cycles=cycles)[:3]

    def lower_gradients(
        self, state: TrainState, batch: dict, exploration_prob: float, cycles: tuple[int, int]
    ):
        """The program of `gradients`, lowered (for tests: its compiled text, without compiling the whole step)."""
        run, args = self._gradients_program(state, batch, exploration_prob)
        return run.lower(*args, cycles=cycles)

    def _gradients_program(self, state: TrainState, batch: dict, exploration_prob: float):
        state, batch, exploration_prob, _ = self._inputs(state, batch, exploration_prob, update=1)
        key = jax.random.split(jax.random.wrap_key_data(state.rng))[1]
        args = (state, batch, key, exploration_prob)
        return jax.jit(self._accumulated_gradients, static_argnames="cycles"), args

    def _inputs(self, state: TrainState, batch: dict, exploration_prob, update: int) -> tuple:
        # Global arrays, or abstract ones (jax.ShapeDtypeStruct with shardings) to compile ahead of time.
        abstract = (jax.Array, jax.ShapeDtypeStruct)
        if not all(isinstance(v, abstract) for v in batch.values()):
            batch = put_host_rows(batch, self.mesh)
        whole = replicated(self.mesh)
        hyper = self.hyperparameters(update)
        if isinstance(exploration_prob, jax.ShapeDtypeStruct):
            scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=whole)
            return state, batch, exploration_prob, jax.tree.map(lambda _: scalar, hyper)
        if not isinstance(exploration_prob, jax.Array):
            exploration_prob = put_global(np.float32(exploration_prob), whole)
        return state, batch, exploration_prob, jax.tree.map(lambda x: put_global(x, whole), hyper)

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

    def _gradients(self, params, puzzle_emb, buffers, carry, batch, draws, exploration_prob, cycles):
        """One supervision step on some rows: (new carry, metric sums, (param grads, puzzle-emb grads))."""

        def loss_fn(params, puzzle_emb):
            module = self.model.bind(params, puzzle_emb, buffers)
            new_carry, outputs = act_step(
                module,
                carry,
                batch,
                training=True,
                draws=draws,
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
        """(new carry, metric sums, (param grads, puzzle-emb grads), touched puzzle rows) of one step, all rows.

        The exploration draws are made here for the whole batch, so they do not depend on the device count;
        each device then gets its rows of everything (`_local_gradients`).
        """
        rows, whole = PartitionSpec(DATA_AXIS), PartitionSpec()
        per_device = jax.shard_map(
            functools.partial(self._local_gradients, cycles=cycles),
            mesh=self.mesh,
            in_specs=(whole, whole, whole, rows, rows, rows, whole),
            out_specs=(rows, whole, whole, whole),
        )
        draws = self._halt_draws(rng, state.carry.steps.shape[0])
        return per_device(
            state.params, state.puzzle_emb, state.buffers, state.carry, batch, draws, exploration_prob
        )

    def _halt_draws(self, rng: jax.Array, num_rows: int) -> HaltDraws:
        """Every row's exploration draws: micro-batch part m (rows m, m + k, ...) draws from fold_in(rng, m)."""
        k, max_steps = self.micro_batches, self.model.cfg.halt_max_steps
        if k == 1:
            return halt_draws(rng, num_rows, max_steps)
        parts = [halt_draws(jax.random.fold_in(rng, m), num_rows // k, max_steps) for m in range(k)]
        return jax.tree.map(lambda *p: _merge_parts(jnp.stack(p)), *parts)

    def _local_gradients(self, params, puzzle_emb, buffers, carry, batch, draws, exploration_prob, *, cycles):
        """Inside shard_map, on this device's rows: its gradients summed over the `micro_batches` parts, then
        summed over the devices by the step's one all-reduce.

        Part m holds this device's rows m, m + k, m + 2k, ...: the same rows as part m of the global batch.
        """
        # Differentiate this device's copy of the weights ("varying"): its own rows' gradients, summed below.
        # Left invariant, JAX would all-reduce every gradient leaf inside the backward pass instead.
        params, puzzle_emb = jax.lax.pcast((params, puzzle_emb), DATA_AXIS, to="varying")
        k = self.micro_batches
        args = (params, puzzle_emb, buffers)
        if k == 1:
            new_carry, metrics, grads = self._gradients(*args, carry, batch, draws, exploration_prob, cycles)
        else:

            def part(sums, xs):
                carry, rows, draws = xs
                new_carry, metrics, grads = self._gradients(
                    *args, carry, rows, draws, exploration_prob, cycles
                )
                return jax.tree.map(jnp.add, sums, (metrics, grads)), new_carry

            # Zero sums typed per device ("varying"), like the per-part values added to them.
            metric_zeros = {key: jnp.zeros([], jnp.float32) for key in METRIC_KEYS}
            zeros = (
                jax.lax.pcast(metric_zeros, DATA_AXIS, to="varying"),
                jax.tree.map(jnp.zeros_like, (params, puzzle_emb)),
            )
            xs = jax.tree.map(lambda x: _split_parts(x, k), (carry, batch, draws))
            (metrics, grads), carry_parts = jax.lax.scan(part, zeros, xs)
            new_carry = jax.tree.map(_merge_parts, carry_parts)
        touched = touched_rows(new_carry.puzzle_identifiers, puzzle_emb.shape[0]).astype(jnp.float32)
        # The one all-reduce of the step: gradients, metric sums and touched puzzle rows, summed in float32.
        metrics, grads, touched = jax.lax.psum((metrics, grads, touched), DATA_AXIS)
        return new_carry, metrics, grads, touched > 0

    def _step(
        self,
        state: TrainState,
        batch: dict,
        exploration_prob: jax.Array,
        hyper: Hyperparameters,
        *,
        cycles: tuple[int, int],
    ):
        key, step_key = jax.random.split(jax.random.wrap_key_data(state.rng))
        carry, metrics, (grads, emb_grads), touched = self._accumulated_gradients(
            state, batch, step_key, exploration_prob, cycles
        )
        optim = self.config["optim"]
        emb_optimizer = build_puzzle_emb_optimizer(optim, hyper.puzzle_emb_lr)
        emb_updates, emb_opt_state = emb_optimizer.update(
            emb_grads, state.puzzle_emb_opt_state, state.puzzle_emb, touched=touched
        )
        updates, opt_state = build_optimizer(optim, hyper.lr).update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = TrainState(
            params=params,
            puzzle_emb=optax.apply_updates(state.puzzle_emb, emb_updates),
            buffers=state.buffers,
            opt_state=opt_state,
            puzzle_emb_opt_state=emb_opt_state,
            ema=None if state.ema is None else ema_update(state.ema, params, hyper.ema),
            carry=carry,
            rng=jax.random.key_data(key),
            step=state.step + 1,
        )
        return new_state, metrics


def _split_parts(x: jax.Array, k: int) -> jax.Array:
    """Rows [n, ...] -> k parts [k, n / k, ...]; part m holds rows m, m + k, m + 2k, ..."""
    return x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)


def _merge_parts(parts: jax.Array) -> jax.Array:
    """The inverse of `_split_parts`: k parts [k, n / k, ...] -> rows [n, ...] in row order."""
    return parts.swapaxes(0, 1).reshape(-1, *parts.shape[2:])

"""Optimisers of the study (exp09): AdamATan2 (the baseline), AdamW and Lion for the dense
parameters, and the sign-SGD of the puzzle-embedding table.

All are optax transformations built for one update's learning rate, a float32 scalar (traced in the train step),
which the train step computes on the host in float64 as the original does: `dense_lr_schedule` and
`puzzle_emb_lr_schedule` at the 1-based update number, so the first update uses lr(1) = base/warmup.
Weight decay is decoupled and multiplied by the learning rate in all of them: p <- p - lr*wd*p - lr*step,
the decay using the old p. This is the AdamATan2 rule of the `adam-atan2` package and also what optax.adamw and optax.lion
do (they chain `add_decayed_weights(wd)` before `scale_by_learning_rate(lr)`); tests/test_optim.py checks it.
Remaining differences between the three are the step direction itself: AdamW adds eps = 1e-8 to sqrt(v_hat)
where AdamATan2 uses atan2 with no epsilon; Lion steps by sign(b1*m + (1-b1)*g) and keeps no second moment.
No optimizer clips gradients (the original does not).

Typical use in a train step, at its 1-based update number t:

    dense_tx = build_optimizer(config["optim"], dense_lr_schedule(config["optim"], total_steps)(t))
    emb_tx = build_puzzle_emb_optimizer(config["optim"], puzzle_emb_lr_schedule(config["optim"], total_steps)(t))
    updates, dense_state = dense_tx.update(dense_grads, dense_state, dense_params)
    dense_params = optax.apply_updates(dense_params, updates)
    updates, emb_state = emb_tx.update(emb_grad, emb_state, emb_table, touched=batch["puzzle_identifiers"])
    emb_table = optax.apply_updates(emb_table, updates)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from trm.errors import UserError
from trm.train.schedule import make_lr_schedule

OPTIMIZERS = ("adam_atan2", "adamw", "lion")


class AdamAtan2State(NamedTuple):
    count: jnp.ndarray  # number of updates done; the next one is update count + 1
    mu: optax.Params  # first moment, float32
    nu: optax.Params  # second moment, float32


def adam_atan2(
    learning_rate: float | jax.Array, b1: float, b2: float, weight_decay: float
) -> optax.GradientTransformation:
    """AdamATan2 exactly as the PyPI `adam-atan2` 0.0.3 kernel TRM ran, per element at update t:

        p <- p * (1 - lr_t * wd)
        m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
        p <- p - (lr_t / (1 - b1^t)) * atan2(m, sqrt(v) / sqrt(1 - b2^t))

    No epsilon, a = b = 1, weight decay on every leaf. Both terms use the old p, so the update returned is
    -lr_t*wd*p - (lr_t/(1-b1^t))*atan2(...). `learning_rate` is lr_t. Moments and the
    arithmetic are float32; the update is cast to each parameter's dtype.
    """

    def init_fn(params):
        zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params)
        return AdamAtan2State(count=jnp.zeros([], jnp.int32), mu=zeros, nu=zeros)

    def update_fn(grads, state, params=None):
        if params is None:
            raise ValueError(
                "adam_atan2 needs the params for its weight decay: call update(grads, state, params)"
            )
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        lr = jnp.asarray(learning_rate, jnp.float32)
        step_size = lr / (1.0 - b1**t)
        v_scale = jnp.sqrt(1.0 - b2**t)
        mu = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g.astype(jnp.float32), state.mu, grads)
        nu = jax.tree.map(
            lambda v, g: b2 * v + (1.0 - b2) * jnp.square(g.astype(jnp.float32)), state.nu, grads
        )

        def update(p, m, v):
            step = -lr * weight_decay * p.astype(jnp.float32) - step_size * jnp.arctan2(
                m, jnp.sqrt(v) / v_scale
            )
            return step.astype(p.dtype)

        return jax.tree.map(update, params, mu, nu), AdamAtan2State(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


class SignSgdState(NamedTuple):
    count: jnp.ndarray  # number of updates done


def puzzle_emb_sign_sgd(
    learning_rate: float | jax.Array, weight_decay: float
) -> optax.GradientTransformationExtraArgs:
    """Sign-SGD of the puzzle-embedding table (the original's sign-SGD of sparse embeddings): for each row touched by the batch,

        p <- p * (1 - lr_t * wd) - lr_t * sign(sum of the batch's gradients for that row)

    and untouched rows are left exactly as they are (no decay). The table's gradient from a gather is already
    the per-row sum. `update(grads, state, params, touched=...)` takes `touched` as either the batch's
    puzzle_identifiers (integer ids, any shape) or a boolean mask over the table's rows (leading axis).
    Works on a single table or a pytree of tables that share the row axis.
    """

    def init_fn(params):
        del params
        return SignSgdState(count=jnp.zeros([], jnp.int32))

    def update_fn(grads, state, params=None, *, touched):
        if params is None:
            raise ValueError(
                "puzzle_emb_sign_sgd needs the table: call update(grads, state, params, touched=...)"
            )
        count = optax.safe_increment(state.count)
        lr = jnp.asarray(learning_rate, jnp.float32)

        def update(p, g):
            mask = touched_rows(touched, p.shape[0]).reshape((-1,) + (1,) * (p.ndim - 1))
            step = -lr * weight_decay * p.astype(jnp.float32) - lr * jnp.sign(g.astype(jnp.float32))
            return jnp.where(mask, step, 0.0).astype(p.dtype)

        return jax.tree.map(update, params, grads), SignSgdState(count=count)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def touched_rows(touched: jnp.ndarray, num_rows: int) -> jnp.ndarray:
    """Boolean mask [num_rows] of the rows a batch touches, from its ids (any shape) or an existing mask."""
    touched = jnp.asarray(touched)
    if touched.dtype == jnp.bool_:
        if touched.shape != (num_rows,):
            raise ValueError(f"touched-row mask has shape {touched.shape}, the table has {num_rows} rows")
        return touched
    return jnp.zeros(num_rows, jnp.bool_).at[touched.reshape(-1)].set(True, mode="drop")


def dense_lr_schedule(optim_cfg: dict, total_steps: int) -> Callable[[int], float]:
    """Learning rate of the dense parameters per 1-based update, in float64 (for the train step and the logs)."""
    return make_lr_schedule(
        optim_cfg["lr"], optim_cfg["lr_warmup_steps"], total_steps, optim_cfg["lr_min_ratio"]
    )


def puzzle_emb_lr_schedule(optim_cfg: dict, total_steps: int) -> Callable[[int], float]:
    """Learning rate of the puzzle-embedding table: its own base lr, the same warm-up/cosine shape."""
    return make_lr_schedule(
        optim_cfg["puzzle_emb_lr"], optim_cfg["lr_warmup_steps"], total_steps, optim_cfg["lr_min_ratio"]
    )


def build_optimizer(optim_cfg: dict, learning_rate: float | jax.Array) -> optax.GradientTransformation:
    """Optimizer of the dense parameters selected by `optim.optimizer` (adam_atan2 | adamw | lion), at
    `learning_rate` (one update's).

    Uses optim.beta1, beta2 and weight_decay; AdamW keeps optax's eps = 1e-8. Raises UserError for an unknown
    optimizer name.
    """
    name = optim_cfg["optimizer"]
    b1, b2, wd = optim_cfg["beta1"], optim_cfg["beta2"], optim_cfg["weight_decay"]
    if name == "adam_atan2":
        return adam_atan2(learning_rate, b1=b1, b2=b2, weight_decay=wd)
    if name == "adamw":
        return optax.adamw(learning_rate, b1=b1, b2=b2, eps=1e-8, weight_decay=wd)
    if name == "lion":
        return optax.lion(learning_rate, b1=b1, b2=b2, weight_decay=wd)
    raise UserError(f"optim.optimizer = {name!r}: unknown optimizer; choose one of {', '.join(OPTIMIZERS)}")


def build_puzzle_emb_optimizer(
    optim_cfg: dict, learning_rate: float | jax.Array
) -> optax.GradientTransformationExtraArgs:
    """Sign-SGD of the puzzle-embedding table at `learning_rate` (one update's), with
    optim.puzzle_emb_weight_decay."""
    return puzzle_emb_sign_sgd(learning_rate, weight_decay=optim_cfg["puzzle_emb_weight_decay"])

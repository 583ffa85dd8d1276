"""Exponential moving average of the dense parameters.

The shadow starts as a copy of the initial params and after every optimizer step becomes
rate*shadow + (1-rate)*param. Only the dense params are averaged: the puzzle-embedding table (and the frozen
H/L init buffers) are not, and evaluation takes them from the live model. With `optim.ema: false` the
trainer keeps `ema = None` and evaluation uses the raw params; `eval_params` makes that choice in one place.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax


class EmaRate(NamedTuple):
    """The EMA's two weights as float32 scalars, `mix` = 1 - `keep` taken in float64 on the host (as the
    original's Python float is) before rounding. A pytree, so the train step takes it as an input and runs that
    differ only in their EMA rate share one compiled program."""

    keep: np.float32  # weight of the shadow: optim.ema_rate
    mix: np.float32  # weight of the new params: 1 - optim.ema_rate


def ema_rate(rate: float) -> EmaRate:
    return EmaRate(np.float32(rate), np.float32(1.0 - rate))


def ema_init(params: optax.Params) -> optax.Params:
    """Shadow copy of the initial params (a fresh array per leaf, same dtype)."""
    return jax.tree.map(jnp.array, params)


def ema_update(ema: optax.Params, params: optax.Params, rate: EmaRate) -> optax.Params:
    """One EMA step: rate*ema + (1-rate)*params, leaf by leaf, in the shadow's dtype; jit-friendly."""
    return jax.tree.map(lambda e, p: (rate.keep * e + rate.mix * p).astype(e.dtype), ema, params)


def eval_params(params: optax.Params, ema: optax.Params | None) -> optax.Params:
    """Dense params to evaluate and checkpoint as "the model": the EMA shadow when EMA is on, else the raw."""
    return params if ema is None else ema

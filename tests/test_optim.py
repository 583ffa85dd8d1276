"""Optimisers (exp09) against float64 NumPy transcriptions of their formulas."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import yaml

from trm.errors import UserError
from trm.train.ema import ema_init, ema_rate, ema_update, eval_params
from trm.train.optim import (
    AdamAtan2State,
    build_optimizer,
    build_puzzle_emb_optimizer,
    dense_lr_schedule,
    puzzle_emb_lr_schedule,
)

BASE_CONFIG = Path(__file__).resolve().parents[1] / "config" / "base.yaml"
WARMUP, TOTAL, MIN_RATIO = 3, 10, 0.1


def optim_config(**overrides) -> dict:
    """The baseline optim section with a short warm-up and a real cosine so every step's lr differs."""
    optim = copy.deepcopy(yaml.safe_load(BASE_CONFIG.read_text())["optim"])
    optim.update(
        lr_warmup_steps=WARMUP, lr_min_ratio=MIN_RATIO, lr=1e-2, puzzle_emb_lr=1e-2, weight_decay=0.5
    )
    optim.update(overrides)
    return optim


def np_lr(step: int, base: float) -> float:
    if step < WARMUP:
        return base * step / WARMUP
    progress = (step - WARMUP) / (TOTAL - WARMUP)
    return base * (MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def gradient_sequence(num_steps: int, rng: np.random.Generator) -> list[dict]:
    """Per step: a leaf with random grads (zeroed at steps 2 and 4), a bias-like leaf, and an always-zero leaf."""
    grads = []
    for t in range(1, num_steps + 1):
        w = rng.normal(size=(3, 4)) * (0.0 if t in (2, 4) else 1.0)
        grads.append({"w": w, "b": rng.normal(size=(4,)), "zero": np.zeros((2,))})
    return grads


def initial_params(rng: np.random.Generator) -> dict:
    return {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=(4,)), "zero": rng.normal(size=(2,))}


def run_optax(cfg: dict, params: dict, grads: list[dict]) -> list[dict]:
    """Apply the configured optimizer over the gradient sequence as the train step does: under jit, with each
    update's learning rate from `dense_lr_schedule` as an input. The float32 params after every step."""
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    state = build_optimizer(cfg, 0.0).init(params)
    lr = dense_lr_schedule(cfg, TOTAL)

    @jax.jit
    def step(params, state, g, lr):
        updates, state = build_optimizer(cfg, lr).update(g, state, params)
        return optax.apply_updates(params, updates), state

    history = []
    for t, g in enumerate(grads, start=1):
        g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g)
        params, state = step(params, state, g, np.float32(lr(t)))
        history.append(jax.tree.map(np.asarray, params))
    return history


def reference_adam_atan2(params, grads, base_lr, b1, b2, wd):
    """Spec §8.1 line by line, float64."""
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    p = {k: x.copy() for k, x in params.items()}
    history = []
    for t, g in enumerate(grads, start=1):
        lr = np_lr(t, base_lr)
        for k in p:
            p[k] = p[k] * (1 - lr * wd)
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            p[k] = p[k] - (lr / (1 - b1**t)) * np.arctan2(m[k], np.sqrt(v[k]) / np.sqrt(1 - b2**t))
        history.append({k: x.copy() for k, x in p.items()})
    return history


def reference_adamw(params, grads, base_lr, b1, b2, wd, eps=1e-8):
    """PyTorch-style AdamW: p <- p(1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps), float64."""
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    p = {k: x.copy() for k, x in params.items()}
    history = []
    for t, g in enumerate(grads, start=1):
        lr = np_lr(t, base_lr)
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            m_hat, v_hat = m[k] / (1 - b1**t), v[k] / (1 - b2**t)
            p[k] = p[k] * (1 - lr * wd) - lr * m_hat / (np.sqrt(v_hat) + eps)
        history.append({k: x.copy() for k, x in p.items()})
    return history


def reference_lion(params, grads, base_lr, b1, b2, wd):
    """Lion (Chen et al. 2023): p <- p(1 - lr wd) - lr sign(b1 m + (1-b1) g); m <- b2 m + (1-b2) g."""
    m = {k: np.zeros_like(v) for k, v in params.items()}
    p = {k: x.copy() for k, x in params.items()}
    history = []
    for t, g in enumerate(grads, start=1):
        lr = np_lr(t, base_lr)
        for k in p:
            p[k] = p[k] * (1 - lr * wd) - lr * np.sign(b1 * m[k] + (1 - b1) * g[k])
            m[k] = b2 * m[k] + (1 - b2) * g[k]
        history.append({k: x.copy() for k, x in p.items()})
    return history


REFERENCES = {"adam_atan2": reference_adam_atan2, "adamw": reference_adamw, "lion": reference_lion}


@pytest.mark.parametrize(
    "name, beta2", [("adam_atan2", 0.95), ("adamw", 0.95), ("adamw", 0.999), ("lion", 0.99)]
)
def test_optimizer_matches_float64_reference(name, beta2):
    rng = np.random.default_rng(0)
    params, grads = initial_params(rng), gradient_sequence(TOTAL, rng)
    cfg = optim_config(optimizer=name, beta2=beta2)
    got = run_optax(cfg, params, grads)
    want = REFERENCES[name](params, grads, cfg["lr"], cfg["beta1"], beta2, cfg["weight_decay"])
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        for key in w:
            np.testing.assert_allclose(
                g[key], w[key], rtol=1e-5, atol=1e-6, err_msg=f"{name} step {step} {key}"
            )


def test_adam_atan2_state_is_float32_and_zero_grads_give_pure_decay():
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), initial_params(rng))
    lr1 = np_lr(1, 1e-2)
    tx = build_optimizer(optim_config(optimizer="adam_atan2"), lr1)
    state = tx.init(params)
    assert isinstance(state, AdamAtan2State)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves((state.mu, state.nu)))
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    updates, state = tx.update(zero_grads, state, params)
    # atan2(0, 0) = 0, so only the decoupled decay remains (no NaN from the missing epsilon).
    for key in params:
        np.testing.assert_allclose(updates[key], -lr1 * 0.5 * np.asarray(params[key]), rtol=1e-6)
    assert int(state.count) == 1


@pytest.mark.parametrize("name", ["adam_atan2", "adamw", "lion"])
def test_first_update_uses_lr_of_step_one_and_decay_is_lr_times_wd(name):
    """Zero gradients isolate the decay: update_t = -lr(t) * wd * p_old, with t = 1 on the first update."""
    cfg = optim_config(optimizer=name, lr_warmup_steps=2000, lr_min_ratio=1.0, lr=1e-4, weight_decay=1.0)
    lr = dense_lr_schedule(cfg, total_steps=100_000)
    params = {"p": jnp.full((4,), 2.0, jnp.float32)}
    state = build_optimizer(cfg, 0.0).init(params)
    zero = {"p": jnp.zeros((4,), jnp.float32)}
    for t in (1, 2):
        updates, state = build_optimizer(cfg, lr(t)).update(zero, state, params)
        np.testing.assert_allclose(
            updates["p"], -(1e-4 * t / 2000) * 1.0 * np.asarray(params["p"]), rtol=1e-6
        )
        params = optax.apply_updates(params, updates)


def test_unknown_optimizer_is_a_user_error_naming_the_field():
    with pytest.raises(UserError, match=r"optim\.optimizer = 'sgd'.*adam_atan2, adamw, lion"):
        build_optimizer(optim_config(optimizer="sgd"), 1e-4)


def test_lr_schedules_follow_the_config_for_logging():
    cfg = optim_config(lr=2e-3, puzzle_emb_lr=5e-2)
    for t in (1, 2, WARMUP, 6, TOTAL):
        assert float(dense_lr_schedule(cfg, TOTAL)(t)) == pytest.approx(np_lr(t, 2e-3), rel=1e-6)
        assert float(puzzle_emb_lr_schedule(cfg, TOTAL)(t)) == pytest.approx(np_lr(t, 5e-2), rel=1e-6)


def run_sign_sgd(touched_kind: str):
    cfg = optim_config(puzzle_emb_lr=1e-2, puzzle_emb_weight_decay=0.5)
    lr_of = puzzle_emb_lr_schedule(cfg, TOTAL)
    rng = np.random.default_rng(2)
    table0 = rng.normal(size=(6, 4))
    grads = [rng.normal(size=(6, 4)) for _ in range(3)]
    grads[1][3, :2] = 0.0  # a touched row with some zero gradient: sign 0, decay only
    ids = [np.array([1, 3, 3]), np.array([3, 5]), np.array([1])]
    table = jnp.asarray(table0, jnp.float32)
    state = build_puzzle_emb_optimizer(cfg, 0.0).init(table)

    @jax.jit
    def step(table, state, g, touched, lr):
        updates, state = build_puzzle_emb_optimizer(cfg, lr).update(g, state, table, touched=touched)
        return optax.apply_updates(table, updates), state

    want = table0.copy()
    for t, (g, batch_ids) in enumerate(zip(grads, ids, strict=True), start=1):
        touched = batch_ids if touched_kind == "ids" else np.isin(np.arange(6), batch_ids)
        table, state = step(
            table, state, jnp.asarray(g, jnp.float32), jnp.asarray(touched), np.float32(lr_of(t))
        )
        lr = np_lr(t, 1e-2)
        rows = np.unique(batch_ids)
        want[rows] = want[rows] * (1 - lr * 0.5) - lr * np.sign(g[rows])
        np.testing.assert_allclose(np.asarray(table), want, rtol=1e-6, atol=1e-7)
    return table0, np.asarray(table)


@pytest.mark.parametrize("touched_kind", ["ids", "mask"])
def test_puzzle_emb_sign_sgd_updates_and_decays_only_touched_rows(touched_kind):
    table0, table = run_sign_sgd(touched_kind)
    untouched = [0, 2, 4]
    np.testing.assert_array_equal(table[untouched], table0[untouched].astype(np.float32))
    assert not np.allclose(table[[1, 3, 5]], table0[[1, 3, 5]])


def test_ema_matches_manual_average_and_eval_params_picks_it():
    rng = np.random.default_rng(3)
    params = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "b": jnp.asarray(rng.normal(size=(2,)))}
    ema = ema_init(params)
    want = {k: np.asarray(v, np.float64) for k, v in params.items()}  # initial shadow = initial params
    for key in want:
        np.testing.assert_array_equal(np.asarray(ema[key]), want[key])
    update = jax.jit(ema_update)
    rate = 0.9
    for _ in range(4):
        params = {k: v + jnp.asarray(rng.normal(size=v.shape), jnp.float32) for k, v in params.items()}
        ema = update(ema, params, ema_rate(rate))
        want = {k: rate * want[k] + (1 - rate) * np.asarray(params[k], np.float64) for k in want}
        for key in want:
            np.testing.assert_allclose(np.asarray(ema[key]), want[key], rtol=1e-6, atol=1e-7)
    assert eval_params(params, ema) is ema
    assert eval_params(params, None) is params


def test_ema_weight_of_the_params_is_one_minus_rate_in_float64():
    """As the original's Python float: 1 - 0.999 rounded once to float32, not float32(1) - float32(0.999)."""
    rate = ema_rate(0.999)
    assert (rate.keep, rate.mix) == (np.float32(0.999), np.float32(1.0 - 0.999))
    assert rate.mix != np.float32(1.0) - np.float32(0.999)

"""The TRM network: layers against NumPy, parameter counts, init, precision, recursion gradients, FLOPs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_configs import SUDOKU, model_config

from trm.cli import main as trm_main
from trm.config import load_config
from trm.errors import UserError
from trm.model.config import ModelConfig, swiglu_width
from trm.model.flops import (
    count_params,
    flops_per_example_step,
    forward_flops_per_example_step,
    head_flops,
    net_flops,
)
from trm.model.layers import Block, apply_rope, rms_norm, rope_tables
from trm.model.trm import TRM, Buffer, PuzzleEmbedding, num_params, split_state


def tiny(**changes) -> ModelConfig:
    base = dict(
        vocab_size=11,
        seq_len=9,
        num_puzzle_identifiers=3,
        hidden_size=64,
        num_heads=4,
        H_cycles=2,
        L_cycles=2,
        puzzle_emb_len=4,
        forward_dtype="float32",
    )
    return model_config(**{**base, **changes})


def random_batch(cfg: ModelConfig, batch_size: int, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    inputs = rng.integers(1, cfg.vocab_size, (batch_size, cfg.seq_len)).astype(np.int32)
    ids = rng.integers(0, cfg.num_puzzle_identifiers, (batch_size,)).astype(np.int32)
    return jnp.asarray(inputs), jnp.asarray(ids)


def start_latents(model: TRM, batch_size: int) -> tuple[jax.Array, jax.Array]:
    cfg = model.cfg
    shape = (batch_size, cfg.total_len, cfg.hidden_size)
    return (
        jnp.broadcast_to(model.H_init[...].astype(cfg.dtype), shape),
        jnp.broadcast_to(model.L_init[...].astype(cfg.dtype), shape),
    )


# ----------------------------------------------------------------------------------------- NumPy references


def np_rms(x: np.ndarray, eps: float, axis: int = -1) -> np.ndarray:
    return x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=axis, keepdims=True) + eps)


def np_swiglu(x: np.ndarray, layer) -> np.ndarray:
    w_gu, w_down = np.asarray(layer.gate_up_proj.weight[...]), np.asarray(layer.down_proj.weight[...])
    inner = w_down.shape[0]
    gu = x @ w_gu
    gate, up = gu[..., :inner], gu[..., inner:]
    return (gate / (1 + np.exp(-gate)) * up) @ w_down


def np_rope(x: np.ndarray, theta: float) -> np.ndarray:
    """Element by element: pairs (i, i + half) rotate by angle p * theta^(-2i/head_dim)."""
    _, length, _, head_dim = x.shape
    half = head_dim // 2
    out = np.empty_like(x, dtype=np.float64)
    for p in range(length):
        for i in range(half):
            angle = p * theta ** (-2 * i / head_dim)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[:, p, :, i], x[:, p, :, i + half]
            out[:, p, :, i] = a * c - b * s
            out[:, p, :, i + half] = b * c + a * s
    return out


def np_attention(h: np.ndarray, attn, theta: float | None) -> np.ndarray:
    batch, length, width = h.shape
    heads = attn.num_heads
    head_dim = width // heads
    qkv = h @ np.asarray(attn.qkv_proj.weight[...])
    q, k, v = (
        qkv[..., i * width : (i + 1) * width].reshape(batch, length, heads, head_dim) for i in range(3)
    )
    if theta is not None:
        q, k = np_rope(q, theta), np_rope(k, theta)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, width)
    return out @ np.asarray(attn.o_proj.weight[...])


def np_block(h: np.ndarray, block: Block, cfg: ModelConfig) -> np.ndarray:
    eps = cfg.rms_norm_eps
    if cfg.mlp_t:
        t = h.transpose(0, 2, 1)  # [B, D, S]
        t = np_rms(t + np_swiglu(t, block.mlp_t), eps)  # the norm runs over the sequence positions
        h = t.transpose(0, 2, 1)
    else:
        theta = cfg.rope_theta if cfg.pos_encodings == "rope" else None
        h = np_rms(h + np_attention(h, block.self_attn, theta), eps)
    return np_rms(h + np_swiglu(h, block.mlp), eps)


# ------------------------------------------------------------------------------------------------- layers


def test_rms_norm_matches_numpy_over_any_axis():
    x = np.random.default_rng(0).normal(size=(2, 5, 7)).astype(np.float32) * 3
    for axis in (-1, 1):
        np.testing.assert_allclose(
            rms_norm(jnp.asarray(x), 1e-5, axis=axis), np_rms(x, 1e-5, axis), rtol=1e-5
        )
    # Computed in float32 even for bfloat16 input, returned in bfloat16.
    out = rms_norm(jnp.asarray(x, jnp.bfloat16), 1e-5)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np_rms(x.astype(jnp.bfloat16).astype(np.float32), 1e-5), rtol=1e-2
    )


def test_rope_matches_numpy_half_split():
    x = np.random.default_rng(1).normal(size=(2, 20, 3, 8)).astype(np.float32)
    cos, sin = rope_tables(20, 8, 10000.0)
    np.testing.assert_allclose(
        apply_rope(jnp.asarray(x), cos, sin), np_rope(x, 10000.0), rtol=1e-5, atol=1e-5
    )


def test_swiglu_width_rounds_up_to_the_multiple():
    assert swiglu_width(512, 4, 256) == 1536  # the original's widths (multiple 256)
    assert swiglu_width(97, 4, 256) == 512  # round(258.67) = 259 -> 512
    assert swiglu_width(916, 4, 256) == 2560
    assert swiglu_width(32, 4, 16) == 96  # round(85.33) = 85 -> 96: about 3 x 32, as 1536 is 3 x 512
    assert swiglu_width(17, 4, 16) == 48


@pytest.mark.parametrize("variant", [{"mlp_t": True}, {"mlp_t": False, "pos_encodings": "rope"}])
@pytest.mark.slow
def test_block_matches_numpy(variant):
    cfg = tiny(**variant)
    block = Block(cfg, rngs=nnx.Rngs(0))
    h = np.random.default_rng(2).normal(size=(2, cfg.total_len, cfg.hidden_size)).astype(np.float32)
    rope = rope_tables(cfg.total_len, cfg.head_dim, cfg.rope_theta) if cfg.pos_encodings == "rope" else None
    np.testing.assert_allclose(block(jnp.asarray(h), rope), np_block(h, block, cfg), rtol=2e-4, atol=2e-4)


def test_mlp_t_contraction_of_the_tpu_equals_the_flattened_matmul_of_other_platforms():
    """Linear.along_leading_axis compiles to a contraction over x's leading axis on TPU (no re-tiling copies) and
    to a flattened matmul elsewhere: the same sums, here both evaluated on the CPU (one well-conditioned
    contraction of 16 terms in float32: equal to float32 rounding)."""
    from trm.model.layers import _flattened_matmul, _leading_contraction

    keys = jax.random.split(jax.random.key(0), 2)
    weight = jax.random.normal(keys[0], (16, 24), jnp.float32)
    x = jax.random.normal(keys[1], (16, 3, 5), jnp.float32)
    expected = np.einsum("io,ibd->obd", np.asarray(weight, np.float64), np.asarray(x, np.float64))
    for form in (_flattened_matmul, _leading_contraction):
        y = jax.jit(form)(weight, x)
        assert y.shape == (24, 3, 5)
        np.testing.assert_allclose(np.asarray(y, np.float64), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_mlp_t_normalises_over_the_sequence_axis():
    # Zero channel MLP leaves out = rms_channels(rms_sequence(h + mix)); the sequence norm gives every
    # channel unit RMS across positions before the channel norm, which a channel-only norm would not.
    cfg = tiny(mlp_t=True)
    block = Block(cfg, rngs=nnx.Rngs(0))
    block.mlp.down_proj.weight[...] = jnp.zeros_like(block.mlp.down_proj.weight[...])
    block.mlp_t.down_proj.weight[...] = jnp.zeros_like(block.mlp_t.down_proj.weight[...])
    h = np.random.default_rng(3).normal(size=(1, cfg.total_len, cfg.hidden_size)) * np.linspace(
        0.1, 10, cfg.hidden_size
    )
    out = np.asarray(block(jnp.asarray(h, jnp.float32), None))
    np.testing.assert_allclose(out, np_rms(np_rms(h, cfg.rms_norm_eps, axis=1), cfg.rms_norm_eps), rtol=1e-4)
    assert not np.allclose(out, np_rms(h, cfg.rms_norm_eps), rtol=1e-2)


# -------------------------------------------------------------------------------------------------- model


@pytest.mark.slow
def test_input_embedding_prefix_layout():
    cfg = tiny(puzzle_emb_ndim=80)  # wider than D: spills into prefix position 1
    model = TRM(cfg, rngs=nnx.Rngs(0))
    table = np.random.default_rng(4).normal(size=(cfg.num_puzzle_identifiers, 80)).astype(np.float32)
    model.puzzle_emb[...] = jnp.asarray(table)
    inputs, ids = random_batch(cfg, 3)
    x = np.asarray(model.input_embeddings(inputs, ids))
    scale = math.sqrt(cfg.hidden_size)
    assert x.shape == (3, cfg.prefix_len + cfg.seq_len, cfg.hidden_size)
    flat_prefix = x[:, : cfg.prefix_len].reshape(3, -1)
    np.testing.assert_allclose(flat_prefix[:, :80], table[np.asarray(ids)] * scale, rtol=1e-6)
    assert np.all(flat_prefix[:, 80:] == 0)
    tokens = np.asarray(model.embed_tokens[...])[np.asarray(inputs)]
    np.testing.assert_allclose(x[:, cfg.prefix_len :], tokens * scale, rtol=1e-6)


@pytest.mark.slow
def test_outputs_shapes_dtypes_and_q_init():
    for dtype in ("float32", "bfloat16"):
        cfg = tiny(forward_dtype=dtype, mlp_t=False, pos_encodings="rope")
        model = TRM(cfg, rngs=nnx.Rngs(0))
        inputs, ids = random_batch(cfg, 4)
        z_H, z_L, logits, q = model(*start_latents(model, 4), inputs, ids)
        assert z_H.shape == z_L.shape == (4, cfg.total_len, cfg.hidden_size)
        assert z_H.dtype == z_L.dtype == logits.dtype == cfg.dtype
        assert logits.shape == (4, cfg.seq_len, cfg.vocab_size)
        assert q.dtype == jnp.float32 and q.shape == (4, 2)
        assert np.all(np.asarray(q) == -5.0)  # weight 0, bias -5


@pytest.mark.slow
def test_init_distributions_and_state_kinds():
    cfg = tiny(hidden_size=256, num_heads=4)
    model = TRM(cfg, rngs=nnx.Rngs(0))
    w = np.asarray(model.layers[0].mlp.gate_up_proj.weight[...])  # fan_in 256
    assert w.dtype == np.float32
    assert abs(w.std() * 16 - 1) < 0.02  # corrected truncated normal: actual std = 1/sqrt(fan_in)
    assert np.abs(w).max() <= 2 / 16 / 0.87962566 + 1e-6
    emb = np.asarray(model.embed_tokens[...])
    assert np.abs(emb).max() <= 2 / 16 / 0.87962566 + 1e-6
    for start in (model.H_init[...], model.L_init[...]):  # float32 holding bfloat16 values, as the original's
        assert start.dtype == jnp.float32
        np.testing.assert_array_equal(start, start.astype(jnp.bfloat16).astype(jnp.float32))
    assert not np.array_equal(np.asarray(model.H_init[...]), np.asarray(model.L_init[...]))
    assert isinstance(model.H_init, Buffer) and isinstance(model.puzzle_emb, PuzzleEmbedding)
    assert np.all(np.asarray(model.puzzle_emb[...]) == 0)

    graphdef, params, puzzle, buffers = split_state(model)
    paths = {
        name: {path for path, _ in nnx.to_flat_state(state)}
        for name, state in [("params", params), ("puzzle", puzzle), ("buffers", buffers)]
    }
    assert paths["buffers"] == {("H_init",), ("L_init",)}
    assert paths["puzzle"] == {("puzzle_emb",)}
    assert ("embed_tokens",) in paths["params"] and ("q_head", "bias") in paths["params"]
    assert all(path[0] not in ("H_init", "L_init", "puzzle_emb") for path in paths["params"])
    rebuilt = nnx.merge(graphdef, params, puzzle, buffers)
    inputs, ids = random_batch(cfg, 2)
    np.testing.assert_array_equal(
        rebuilt(*start_latents(rebuilt, 2), inputs, ids)[2], model(*start_latents(model, 2), inputs, ids)[2]
    )


@pytest.mark.parametrize(
    "variant",
    [
        {"mlp_t": True, "pos_encodings": "none"},
        {"mlp_t": False, "pos_encodings": "rope"},
        {"mlp_t": False, "pos_encodings": "learned", "L_layers": 3, "expansion": 2},
    ],
)
@pytest.mark.slow
def test_param_count_of_built_model_matches_analytic(variant):
    cfg = tiny(**variant)
    assert num_params(TRM(cfg, rngs=nnx.Rngs(0))) == count_params(cfg)


def test_published_param_counts():
    mlp_t = {256: (4, 1_483_778), 384: (6, 2_666_498), 512: (8, 5_028_866), 768: (8, 9_753_602)}
    mlp_t |= {1024: (8, 17_624_066), 1536: (8, 38_083_586)}
    for hidden, (heads, expected) in mlp_t.items():
        assert count_params(model_config(hidden_size=hidden, num_heads=heads)) == expected
    attention = model_config(mlp_t=False, pos_encodings="rope")
    assert count_params(attention) == 6_828_034
    # The real 512-wide models, built abstractly (no memory, no compute).
    for cfg, expected in [(model_config(), 5_028_866), (attention, 6_828_034)]:
        assert num_params(nnx.eval_shape(lambda cfg=cfg: TRM(cfg, rngs=nnx.Rngs(0)))) == expected


def test_published_flops():
    mlp_t, attention = model_config(), model_config(mlp_t=False, pos_encodings="rope")
    assert flops_per_example_step(mlp_t) == pytest.approx(4.272e10, rel=1e-3)
    assert flops_per_example_step(attention) == pytest.approx(4.763e10, rel=1e-3)
    assert 16 * forward_flops_per_example_step(mlp_t) == pytest.approx(4.101e11, rel=1e-3)
    assert 16 * forward_flops_per_example_step(attention) == pytest.approx(4.572e11, rel=1e-3)
    # Depth overrides: T=1, n=2 -> 3 net calls forward, all 3 differentiated (backward = 2x forward).
    assert flops_per_example_step(mlp_t, 1, 2) == 3 * (3 * net_flops(mlp_t) + head_flops(mlp_t))


@pytest.mark.slow
def test_gradient_flows_only_through_the_last_recursion():
    cfg = tiny(H_cycles=3, L_cycles=2)
    model = TRM(cfg, rngs=nnx.Rngs(0))
    inputs, ids = random_batch(cfg, 2)
    z_H0, z_L0 = start_latents(model, 2)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_from_latents(z_H, z_L):
        return jnp.sum(model(z_H, z_L, inputs, ids)[2] ** 2)

    # The carried latents only reach the output through the T-1 stopped recursions.
    grads = jax.grad(loss_from_latents, argnums=(0, 1))(z_H0, z_L0)
    assert all(np.all(np.asarray(g) == 0) for g in grads)

    # Parameter gradient equals that of one recursion started from the (constant) state after T-1 recursions.
    z_H, z_L = z_H0, z_L0
    x = model.input_embeddings(inputs, ids)
    for _ in range(2):
        z_H, z_L = model.recursion(z_H, z_L, x, 2)

    def full(p):
        m = nnx.merge(graphdef, p, rest)
        return jnp.sum(m(z_H0, z_L0, inputs, ids)[2] ** 2)

    def last_only(p):
        m = nnx.merge(graphdef, p, rest)
        h, _ = m.recursion(z_H, z_L, m.input_embeddings(inputs, ids), 2)
        return jnp.sum(m.lm_head(h[:, cfg.prefix_len :]) ** 2)

    def all_differentiated(p):
        m = nnx.merge(graphdef, p, rest)
        zh, zl, x = z_H0, z_L0, m.input_embeddings(inputs, ids)
        for _ in range(3):
            zh, zl = m.recursion(zh, zl, x, 2)
        return jnp.sum(m.lm_head(zh[:, cfg.prefix_len :]) ** 2)

    grad_full = jax.grad(full)(params)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
        grad_full,
        jax.grad(last_only)(params),
    )
    differences = jax.tree.map(
        lambda a, b: float(jnp.max(jnp.abs(a - b))), grad_full, jax.grad(all_differentiated)(params)
    )
    assert max(jax.tree.leaves(differences)) > 1e-3  # the check above can tell the two apart


# ------------------------------------------------------------------------------------------ config / CLI


@pytest.mark.parametrize(
    "change, field",
    [
        ({"mlp_t": False, "hidden_size": 100, "num_heads": 8}, "arch.hidden_size"),
        ({"forward_dtype": "float8"}, "arch.forward_dtype"),
        ({"pos_encodings": "alibi"}, "arch.pos_encodings"),
        ({"loss": "mse"}, "arch.loss"),
        ({"no_ACT_continue": False}, "arch.no_ACT_continue"),
        ({"H_cycles": 0}, "arch.H_cycles"),
        ({"rms_norm_eps": "1e-5"}, "arch.rms_norm_eps"),
        ({"puzzle_emb_ndim": 10_000}, "arch.puzzle_emb_ndim"),
    ],
)
def test_config_validation_names_the_field(change, field):
    with pytest.raises(UserError, match=field.replace(".", r"\.")):
        tiny(**change)


def test_from_dict_takes_a_resolved_arch_and_needs_dataset_sizes():
    arch = load_config(overrides=["arch.hidden_size=128"])["arch"]
    assert ModelConfig.from_dict(arch, SUDOKU).total_len == 97
    with pytest.raises(UserError, match="seq_len"):
        ModelConfig.from_dict(arch, {"vocab_size": 11, "num_puzzle_identifiers": 1})


def test_model_info_cli(tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text("arch:\n  mlp_t: false\n  pos_encodings: rope\n")
    assert trm_main(["model-info", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "6,828,034" in out and "4.763e+10" in out
    assert trm_main(["model-info", "--set", "arch.hidden_size=256", "--set", "arch.num_heads=4"]) == 0
    assert "1,483,778" in capsys.readouterr().out
    assert trm_main(["model-info", "--set", "arch.forward_dtype=f8"]) == 2
    assert "arch.forward_dtype" in capsys.readouterr().err
    assert trm_main(["model-info", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err

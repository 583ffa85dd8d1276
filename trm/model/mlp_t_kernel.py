"""The MLP-T's SwiGLU along the leading axis as one TPU kernel per block of columns (Pallas), with its backward.

y[:, n] = W_down^T (silu(g) * u) with [g; u] = W_gate_up^T x[:, n], for x [S, B, D] and each of its B * D
columns n independently. XLA computes this as two matmuls with the [2 * inner, B, D] gate|up output written
to HBM by the first and read back by the second (0.2 GB per call at the baseline); here each grid step keeps
its block's gate|up on chip, so a call reads x and writes y only. The backward recomputes gate|up from x
(one more matmul) instead of saving anything, and accumulates the weight gradients in float32 per block of
rows. Used on TPU only, where `arch.mlp_t_kernel` allows it (trm/model/layers.py); the results match the plain
formulation up to the order of the float32 sums of the weight gradients (tests/test_mlp_t_kernel.py runs both on
CPU in interpret mode; trm/train/kernel_check.py on a run's device before its first step).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from trm.model import mlp_t_path
from trm.model.mlp_t_path import COLUMNS, ROWS, fits

if TYPE_CHECKING:
    from jax.experimental import pallas as pl

# The blocks and dtypes the kernel takes are stated with the rule that chooses it (trm/model/mlp_t_path.py).
DTYPES = tuple(jnp.dtype(name) for name in mlp_t_path.DTYPES)


def _pallas():
    """Pallas and its TPU settings, imported when a kernel is built: the import takes 0.1 s, which every process
    that builds the model paid, though only a TPU runs the kernel (and the tests, interpreted)."""
    from jax.experimental import pallas
    from jax.experimental.pallas import tpu

    return pallas, tpu


def applies(x: jax.Array, *weights: jax.Array) -> bool:
    """Whether x [S, B, D] splits into whole blocks and, inside shard_map, the weights vary over the same mesh
    axes as x (as the train step's do), so that their gradients are x's sums (else the caller keeps the plain
    formulation)."""
    same_axes = all(jax.typeof(w).mat == jax.typeof(x).mat for w in weights)
    return x.ndim == 3 and fits(*x.shape[1:]) and x.dtype in DTYPES and same_axes


def _like(x: jax.Array, shape: tuple[int, ...], dtype) -> jax.ShapeDtypeStruct:
    """An output of a kernel on x: per device, varying over x's mesh axes inside shard_map."""
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(x).mat)


def _silu_parts(g: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(silu(g), sigmoid(g) in float32) with layers.silu's roundings: the sigmoid rounded once to g's dtype."""
    s32 = jax.nn.sigmoid(g.astype(jnp.float32))
    return g * s32.astype(g.dtype), s32


def _gate_up(w_gate_up_t: jax.Array, xb: jax.Array) -> tuple[jax.Array, jax.Array]:
    gu = jnp.dot(w_gate_up_t, xb, preferred_element_type=jnp.float32).astype(xb.dtype)
    inner = gu.shape[0] // 2
    return gu[:inner], gu[inner:]


def _forward_kernel(x_ref, w_gate_up_t_ref, w_down_t_ref, y_ref):
    for b in range(ROWS):  # static: a TPU cannot index the tiled B axis at a dynamic row
        xb = x_ref[:, b, :]
        gate, up = _gate_up(w_gate_up_t_ref[...], xb)
        h = _silu_parts(gate)[0] * up
        y_ref[:, b, :] = jnp.dot(w_down_t_ref[...], h, preferred_element_type=jnp.float32).astype(y_ref.dtype)


def _backward_kernel(x_ref, dy_ref, w_gate_up_t_ref, w_gate_up_ref, w_down_ref, dx_ref, dwgu_ref, dwd_ref):
    pl = _pallas()[0]

    @pl.when(pl.program_id(1) == 0)
    def _():
        dwgu_ref[...] = jnp.zeros_like(dwgu_ref)
        dwd_ref[...] = jnp.zeros_like(dwd_ref)

    along_columns = (((1,), (1,)), ((), ()))  # a @ b^T: the sum over this block's columns
    for b in range(ROWS):
        xb, dyb = x_ref[:, b, :], dy_ref[:, b, :]
        gate, up = _gate_up(w_gate_up_t_ref[...], xb)
        silu_gate, s32 = _silu_parts(gate)
        h = silu_gate * up
        dh = jnp.dot(w_down_ref[...], dyb, preferred_element_type=jnp.float32).astype(xb.dtype)
        dwd_ref[...] += jax.lax.dot_general(h, dyb, along_columns, preferred_element_type=jnp.float32)
        d_up = dh * silu_gate
        d_silu = dh * up
        # d silu / d gate as autodiff writes it for layers.silu: through the product, then the sigmoid.
        d_sigmoid = ((d_silu * gate).astype(jnp.float32) * (s32 * (1 - s32))).astype(xb.dtype)
        d_gate = d_silu * s32.astype(xb.dtype) + d_sigmoid
        d_gate_up = jnp.concatenate([d_gate, d_up], axis=0)
        dx = jnp.dot(w_gate_up_ref[...], d_gate_up, preferred_element_type=jnp.float32)
        dx_ref[:, b, :] = dx.astype(dx_ref.dtype)
        dwgu_ref[...] += jax.lax.dot_general(xb, d_gate_up, along_columns, preferred_element_type=jnp.float32)


def _column_block(length: int) -> pl.BlockSpec:
    return _pallas()[0].BlockSpec((length, ROWS, COLUMNS), lambda i, j: (0, i, j))


def _whole(shape: tuple[int, ...]) -> pl.BlockSpec:
    return _pallas()[0].BlockSpec(shape, lambda i, j: (0,) * len(shape))


def _grid(x: jax.Array) -> tuple[int, int]:
    return x.shape[1] // ROWS, x.shape[2] // COLUMNS


def _itemsize(x: jax.Array) -> int:
    return jnp.dtype(x.dtype).itemsize


def _forward(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array, interpret: bool) -> jax.Array:
    length, inner = x.shape[0], w_down.shape[0]
    columns = x.shape[1] * x.shape[2]
    weight_bytes = (w_gate_up.size + w_down.size) * _itemsize(x)
    pl, pltpu = _pallas()
    return pl.pallas_call(
        _forward_kernel,
        out_shape=_like(x, x.shape, x.dtype),
        grid=_grid(x),
        in_specs=[_column_block(length), _whole((2 * inner, length)), _whole((length, inner))],
        out_specs=_column_block(length),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        cost_estimate=pl.CostEstimate(
            flops=2 * length * columns * 3 * inner,
            transcendentals=columns * inner,
            bytes_accessed=2 * x.size * _itemsize(x) + weight_bytes,
        ),
        interpret=interpret,
    )(x, w_gate_up.T, w_down.T)


def _backward(x, dy, w_gate_up, w_down, interpret: bool):
    length, inner = x.shape[0], w_down.shape[0]
    columns = x.shape[1] * x.shape[2]
    row_blocks = _grid(x)[0]
    per_row_block = [(row_blocks, length, 2 * inner), (row_blocks, inner, length)]
    weight_bytes = 2 * w_gate_up.size * _itemsize(x) + w_down.size * _itemsize(x)
    pl, pltpu = _pallas()
    dx, dwgu, dwd = pl.pallas_call(
        _backward_kernel,
        out_shape=[_like(x, x.shape, x.dtype)] + [_like(x, shape, jnp.float32) for shape in per_row_block],
        grid=_grid(x),
        in_specs=[
            _column_block(length),
            _column_block(length),
            _whole((2 * inner, length)),
            _whole((length, 2 * inner)),
            _whole((inner, length)),
        ],
        out_specs=[
            _column_block(length),
            pl.BlockSpec((None, length, 2 * inner), lambda i, j: (i, 0, 0)),
            pl.BlockSpec((None, inner, length), lambda i, j: (i, 0, 0)),
        ],
        # Rows of blocks in parallel (both cores of a v4 chip); each accumulates its weight gradients
        # over its column blocks in turn.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        cost_estimate=pl.CostEstimate(
            flops=2 * length * columns * 8 * inner,
            transcendentals=columns * inner,
            bytes_accessed=3 * x.size * _itemsize(x) + weight_bytes + 4 * row_blocks * 3 * inner * length,
        ),
        interpret=interpret,
    )(x, dy, w_gate_up.T, w_gate_up, w_down)
    return dx, dwgu.sum(0).astype(w_gate_up.dtype), dwd.sum(0).astype(w_down.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def swiglu_along_leading_axis(
    x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array, interpret: bool = False
) -> jax.Array:
    """down(silu(gate) * up) along the leading axis of x [S, B, D]; w_gate_up [S, 2 * inner] (gate first) and
    w_down [inner, S] in x's dtype. interpret=True runs the kernels on any platform (for tests)."""
    return _forward(x, w_gate_up, w_down, interpret)


def _vjp_forward(x, w_gate_up, w_down, interpret):
    return _forward(x, w_gate_up, w_down, interpret), (x, w_gate_up, w_down)


def _vjp_backward(interpret, residuals, dy):
    return _backward(*residuals[:1], dy, *residuals[1:], interpret)


swiglu_along_leading_axis.defvjp(_vjp_forward, _vjp_backward)

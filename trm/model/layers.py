"""Building blocks of the TRM network: linear, RMSNorm, RoPE, SwiGLU, attention and the post-norm block.

Master weights are float32 and are cast to the activation dtype at use; RMSNorm, RoPE and the attention
softmax compute in float32. Kernels are stored [in_features, out_features] (the transpose of PyTorch's).
Module and attribute names follow the original's state_dict (the mapping: trm/model/torch_io.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from trm.model import mlp_t_kernel, mlp_t_path
from trm.model.config import ModelConfig, swiglu_width

# The std of a standard normal truncated to [-2, 2]; dividing by it makes the truncated sample's std exact.
TRUNC_NORMAL_STD = 0.87962566103423978


def trunc_normal(key: jax.Array, shape: tuple[int, ...], std: float) -> jax.Array:
    """JAX-style corrected truncated normal: float32 values in [-2, 2]*std/0.8796 with actual std `std`."""
    return jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32) * (std / TRUNC_NORMAL_STD)


def rms_norm(x: jax.Array, eps: float, axis: int = -1) -> jax.Array:
    """Parameter-free RMSNorm over `axis`, computed in float32 and cast back (eps inside the rsqrt)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=axis, keepdims=True) + eps)
    return x32.astype(x.dtype)


def rope_tables(length: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin tables [length, head_dim] in float32, half-split layout (the angles repeated twice)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = jnp.outer(jnp.arange(length, dtype=jnp.float32), inv_freq)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x [B, S, heads, head_dim] by position: x*cos + rot(x)*sin with rot(a, b) = (-b, a), in float32."""
    x32 = x.astype(jnp.float32)
    a, b = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-b, a], axis=-1)
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).astype(x.dtype)


def silu(x: jax.Array) -> jax.Array:
    """x * sigmoid(x), the sigmoid computed in float32 and rounded once to x's dtype, the product in x's dtype.

    In float32 these are jax.nn.silu's own ops. In bfloat16 XLA:CPU rounds after each operation, so the sigmoid
    of jax.nn.silu (negate, exp, add, divide) rounds four times: over every bfloat16 value in [-12, 12] its
    relative error reaches 9.6e-3, ours 7.1e-3 (two roundings), PyTorch's kernel 3.9e-3 (one); and the smoke
    baseline's CPU step takes 0.14 s of CPU time instead of 0.17 s. Computing the product in float32 too
    (PyTorch's one rounding) made the baseline's train step compiled for a v4-64 take 16% more HBM and a 9%
    longer roofline.
    """
    return x * jax.nn.sigmoid(x.astype(jnp.float32)).astype(x.dtype)


class Linear(nnx.Module):
    """y = x @ W (+ b); LeCun truncated-normal init (std 1/sqrt(in_features)); weights cast to x's dtype."""

    def __init__(self, in_features: int, out_features: int, *, rngs: nnx.Rngs, bias: bool = False):
        std = 1.0 / math.sqrt(in_features)
        self.weight = nnx.Param(trunc_normal(rngs.params(), (in_features, out_features), std))
        self.bias = nnx.Param(jnp.zeros((out_features,), jnp.float32)) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x @ self.weight[...].astype(x.dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(x.dtype)
        return y

    def along_leading_axis(self, x: jax.Array) -> jax.Array:
        """The same map (no bias) applied along the LEADING axis: y[o, ...] = sum_i W[i, o] x[i, ...].

        No transposes of x (MLP-T on sequence-major input). On TPU, one contraction over the leading axis of x
        as it is: a TPU stores arrays in tiles over their last two axes, so flattening x to 2-D re-tiled every
        MLP-T input and output in HBM (docs/tpu.md, "Where the step's bytes go"). Elsewhere, one [out, in] x
        [in, rest] matmul of x flattened to 2-D: free there, and on CPU the fastest form (the 3-D contraction
        makes XLA:CPU transpose in the backward, 2.3x slower in float32). The same sums either way; the
        choice is made when the step is compiled for its platform.
        """
        return along_leading_axis(self.weight[...].astype(x.dtype), x)


def along_leading_axis(weight: jax.Array, x: jax.Array) -> jax.Array:
    """y[o, ...] = sum_i weight[i, o] x[i, ...], in the form for the platform compiled for (Linear's)."""
    return jax.lax.platform_dependent(weight, x, tpu=_leading_contraction, default=_flattened_matmul)


def _flattened_matmul(weight: jax.Array, x: jax.Array) -> jax.Array:
    y = jnp.einsum("io,in->on", weight, x.reshape(x.shape[0], -1))
    return y.reshape(weight.shape[1], *x.shape[1:])


def _leading_contraction(weight: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.einsum("io,i...->o...", weight, x)


class SwiGLU(nnx.Module):
    """down(silu(gate) * up) over the last axis, with a fused gate|up projection (gate first), no biases."""

    def __init__(self, width: int, expansion: float, multiple: int, *, rngs: nnx.Rngs, fused: bool = True):
        inner = swiglu_width(width, expansion, multiple)
        self.gate_up_proj = Linear(width, 2 * inner, rngs=rngs)
        self.down_proj = Linear(inner, width, rngs=rngs)
        self.fused = fused  # may along_leading_axis use the fused kernel (arch.mlp_t_kernel not plain)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = jnp.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(silu(gate) * up)

    def along_leading_axis(self, x: jax.Array) -> jax.Array:
        """The same SwiGLU applied along the leading axis of x (e.g. the sequence axis of [S, B, D]).

        On TPU, inside shard_map (the train step: per-device arrays), one fused kernel per block of columns
        (trm/model/mlp_t_kernel.py) keeps the [2 * inner, columns] gate|up block on chip instead of writing
        it to HBM and reading it back (docs/tpu.md, "Where the step's bytes go"). Elsewhere, and where the
        compiler partitions the arrays itself (a Pallas kernel would be given whole, gathered arrays), or
        with `fused` off (arch.mlp_t_kernel: plain), the plain formulation below; on CPU and GPU it is the
        only one, so their results are unchanged.
        """
        weights = (self.gate_up_proj.weight[...].astype(x.dtype), self.down_proj.weight[...].astype(x.dtype))
        if self.fused and _per_device_arrays() and mlp_t_kernel.applies(x, *weights):
            return jax.lax.platform_dependent(
                x,
                *weights,
                tpu=mlp_t_kernel.swiglu_along_leading_axis,
                default=self._plain_along_leading_axis,
            )
        return self._plain_along_leading_axis(x)

    def _plain_along_leading_axis(self, x: jax.Array, *_weights: jax.Array) -> jax.Array:
        weights = (self.gate_up_proj.weight[...], self.down_proj.weight[...])
        return plain_swiglu_along_leading_axis(x, *(w.astype(x.dtype) for w in weights))


def plain_swiglu_along_leading_axis(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """SwiGLU.along_leading_axis's plain formulation as a function of its weights (in x's dtype): what the
    fused kernel is checked against (trm/train/kernel_check.py)."""
    gate, up = jnp.split(along_leading_axis(w_gate_up, x), 2, axis=0)
    return along_leading_axis(w_down, silu(gate) * up)


def _per_device_arrays() -> bool:
    """Whether the code being traced sees per-device arrays: inside shard_map over every axis of its mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and set(mesh.manual_axes) == set(mesh.axis_names)


class Attention(nnx.Module):
    """Non-causal multi-head self-attention with a fused [Q|K|V] projection (head-major) and optional RoPE."""

    def __init__(self, hidden_size: int, num_heads: int, *, rngs: nnx.Rngs):
        self.num_heads = num_heads
        self.qkv_proj = Linear(hidden_size, 3 * hidden_size, rngs=rngs)
        self.o_proj = Linear(hidden_size, hidden_size, rngs=rngs)

    def __call__(self, h: jax.Array, rope: tuple[jax.Array, jax.Array] | None) -> jax.Array:
        batch, length, width = h.shape
        head_dim = width // self.num_heads
        qkv = self.qkv_proj(h).reshape(batch, length, 3, self.num_heads, head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        probs = jax.nn.softmax(scores / math.sqrt(head_dim), axis=-1).astype(v.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, width)
        return self.o_proj(out)


class Block(nnx.Module):
    """Post-norm block: h = rms(h + mix(h)); h = rms(h + SwiGLU(h)).

    The token mixer is attention, or with `mlp_t` a SwiGLU across the sequence axis (width = total length)
    whose residual is normalised over the SEQUENCE axis, as in the original MLP-T.

    The net runs blocks on sequence-major activations [S, B, D] (`seq_major=True`): there the MLP-T mixer
    is one plain matmul over S for the whole batch, with no transposes forward or backward (on CPU the
    transposes of the [B, S, D] form cost as much as the mixer's matmuls). Attention works in [B, S, D].
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.eps = cfg.rms_norm_eps
        if cfg.mlp_t:
            fused = cfg.mlp_t_kernel != mlp_t_path.PLAIN
            self.mlp_t = SwiGLU(cfg.total_len, cfg.expansion, cfg.swiglu_multiple, rngs=rngs, fused=fused)
        else:
            self.self_attn = Attention(cfg.hidden_size, cfg.num_heads, rngs=rngs)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.expansion, cfg.swiglu_multiple, rngs=rngs)

    def __call__(
        self, h: jax.Array, rope: tuple[jax.Array, jax.Array] | None, *, seq_major: bool = False
    ) -> jax.Array:
        """h: [B, S, D], or [S, B, D] with seq_major; returns the same layout."""
        if not seq_major:
            return self(h.swapaxes(0, 1), rope, seq_major=True).swapaxes(0, 1)
        if hasattr(self, "mlp_t"):
            h = rms_norm(h + self.mlp_t.along_leading_axis(h), self.eps, axis=0)  # mix and norm along S
        else:
            h = rms_norm(h + self.self_attn(h.swapaxes(0, 1), rope).swapaxes(0, 1), self.eps)
        return rms_norm(h + self.mlp(h), self.eps)

"""The MLP-T's fused TPU kernel (trm/model/mlp_t_kernel.py): its sums against the plain formulation (run on the
CPU in Pallas' interpret mode), and that it is chosen only when the step is compiled for a TPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, PartitionSpec
from model_configs import model_config

from trm.model import mlp_t_kernel
from trm.model.layers import Block, SwiGLU, silu

pytestmark = pytest.mark.slow  # about 6 s each: interpret-mode Pallas and a TPU-branch trace


def plain(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array) -> jax.Array:
    gate, up = jnp.split(jnp.einsum("io,i...->o...", w_gate_up, x), 2, axis=0)
    return jnp.einsum("io,i...->o...", w_down, silu(gate) * up)


def test_kernel_forward_and_backward_equal_the_plain_formulation_to_float32_rounding():
    """Two row blocks by two column blocks, in float32 on random inputs of unit scale (the weights scaled by
    1/sqrt(fan-in) as at init). Both sides add the same products in another order (the kernel: per block, the
    weight gradients then summed over blocks), so they differ by float32 rounding of sums of up to
    B * D = 4096 terms: 1e-5 of the output's scale is about 80 float32 ulps (2^-23), far below any error
    in the formulation (a wrong term changes the result at its own scale, 1e-2 or more)."""
    length, inner = 13, 32
    x_shape = (length, 2 * mlp_t_kernel.ROWS, 2 * mlp_t_kernel.COLUMNS)
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], x_shape, jnp.float32)
    w_gate_up = jax.random.normal(keys[1], (length, 2 * inner), jnp.float32) / np.sqrt(length)
    w_down = jax.random.normal(keys[2], (inner, length), jnp.float32) / np.sqrt(inner)
    dy = jax.random.normal(keys[3], x_shape, jnp.float32)
    assert mlp_t_kernel.applies(x, w_gate_up, w_down)

    def kernel(*args):
        return mlp_t_kernel.swiglu_along_leading_axis(*args, True)

    y, backward = jax.vjp(kernel, x, w_gate_up, w_down)
    y_plain, backward_plain = jax.vjp(plain, x, w_gate_up, w_down)
    for name, got, expected in zip(
        ("y", "dx", "dw_gate_up", "dw_down"), (y, *backward(dy)), (y_plain, *backward_plain(dy)), strict=True
    ):
        assert got.shape == expected.shape and got.dtype == expected.dtype, name
        scale = float(jnp.max(jnp.abs(expected)))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * scale, err_msg=name)


def per_device_swiglu(mlp: SwiGLU, x: jax.Array):
    """mlp.along_leading_axis and its gradients as the train step runs them: in shard_map, the weights varying."""
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    graphdef, state = nnx.split(mlp)

    def local(state, x):
        state = jax.lax.pcast(state, "data", to="varying")

        def total(state, x):
            return jnp.sum(nnx.merge(graphdef, state).along_leading_axis(x).astype(jnp.float32) ** 2)

        return jax.lax.psum(jax.value_and_grad(total, argnums=(0, 1))(state, x), "data")

    rows = PartitionSpec(None, "data")
    return jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(), rows), out_specs=PartitionSpec())
    )


def test_the_kernel_is_compiled_for_tpu_only_and_the_cpu_keeps_the_plain_formulation_bit_for_bit():
    mlp = SwiGLU(16, 4.0, 256, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (16, mlp_t_kernel.ROWS, mlp_t_kernel.COLUMNS)).astype(
        jnp.bfloat16
    )
    step = per_device_swiglu(mlp, x)
    state = nnx.split(mlp)[1]
    for platform, fused in (("cpu", False), ("tpu", True)):
        text = step.trace(state, x).lower(lowering_platforms=(platform,)).as_text()
        assert ("tpu_custom_call" in text) == fused, platform
    # Shapes that do not split into whole blocks, and float16 (which the kernel does not compile for), keep
    # the plain formulation on TPU too.
    for other in (x[:, :, : mlp_t_kernel.COLUMNS // 2], x.astype(jnp.float16)):
        text = step.trace(state, other).lower(lowering_platforms=("tpu",)).as_text()
        assert "tpu_custom_call" not in text, (other.shape, other.dtype)
    # arch.mlp_t_kernel: plain turns it off on TPU; the model's blocks pass the setting on.
    off = per_device_swiglu(SwiGLU(16, 4.0, 256, rngs=nnx.Rngs(0), fused=False), x)
    assert "tpu_custom_call" not in off.trace(state, x).lower(lowering_platforms=("tpu",)).as_text()
    for setting, fused in (("auto", True), ("fused", True), ("plain", False)):
        assert Block(model_config(mlp_t_kernel=setting), rngs=nnx.Rngs(0)).mlp_t.fused == fused, setting

    # On the CPU: the same value and gradients as the plain formulation outside shard_map, bit for bit.
    def total(state, x):
        mlp = nnx.merge(nnx.split(SwiGLU(16, 4.0, 256, rngs=nnx.Rngs(0)))[0], state)
        gate, up = jnp.split(mlp.gate_up_proj.along_leading_axis(x), 2, axis=0)
        y = mlp.down_proj.along_leading_axis(silu(gate) * up)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    got = step(state, x)
    expected = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))(state, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

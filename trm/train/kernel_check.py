"""The fused MLP-T kernel checked on the run's own device before its first step: the kernel against the plain
formulation, forward and gradients, on one small batch of the run's shapes.

The kernel (trm/model/mlp_t_kernel.py) is compared with the plain formulation only in Pallas' interpret mode on
a CPU (tests/test_mlp_t_kernel.py); Mosaic's lowering on a chip could differ (matmul precision, tiling, a
layout the interpreter forgives), and every run would then train on wrong numbers without a sign. So a run whose
train step uses the kernel (trm/model/mlp_t_path.py) first runs both on one block of its own [S, 8, D]
activations with its own SwiGLU's weights at their initial scale, and compares y, dx and the two weight
gradients. A mismatch stops the run with one line naming the error, the tolerance and the setting that turns
the kernel off; there is no silent fallback. Every host checks its own device; the result is the run dir's
kernel_check.json.
"""

from __future__ import annotations

import json
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trm import storage
from trm.errors import UserError
from trm.model import mlp_t_kernel, mlp_t_path
from trm.model.config import ModelConfig
from trm.model.layers import SwiGLU, plain_swiglu_along_leading_axis
from trm.run import distributed, layout

# The largest difference allowed between kernel and plain formulation, as a fraction of the largest magnitude
# of the plain result, for each of y, dx and the weight gradients, by forward dtype. Both sides round where the
# other does; they differ by the order of float32 sums (the weight gradients: per block, then over blocks)
# and, in bfloat16, by results that land on the other side of a rounding boundary. Measured in Pallas' TPU
# interpreter on a CPU (3 seeds, D 128 and 512, S 97, inner 512): at most 3.6e-3 in bfloat16 (0.9 of its unit
# in the last place, 2^-8) and 1.9e-6 in float32 (16 units of 2^-23). The tolerances are 4 times that, rounded
# up to whole units: 4 units in bfloat16, 64 in float32. A wrong formulation or layout changes a result at its
# own scale (errors of order 1).
TOLERANCE = {"bfloat16": 4 * 2.0**-8, "float32": 64 * 2.0**-23}
SEED = 0
# Forces the check where the kernel is not compiled (tests: a CPU in Pallas' interpret mode, as if on a TPU).
INTERPRET = False


def check_run(config: dict, cfg: ModelConfig, devices: int, run_dir: str, writer: bool) -> dict | None:
    """`check` a run's kernel: write the result to the run dir (`writer`) and stop on a mismatch, on every host.
    None: the step does not use the kernel, nothing checked."""
    result = check(config, cfg, devices)
    if result is None:
        return None
    if writer:
        record = json.dumps(result, indent=1, sort_keys=True) + "\n"
        storage.write_text(layout.path(run_dir, layout.KERNEL_CHECK), record)
    if not result["passed"]:
        raise UserError(failure_line(result))
    return result


def check(config: dict, cfg: ModelConfig, devices: int) -> dict | None:
    """`compare` on every host where `config`'s train step on `devices` devices of this platform uses the kernel
    (UserError for a `fused` setting that cannot), with every host's worst ratio of error to tolerance and
    whether all passed; None where the step does not use the kernel."""
    platform = "tpu" if INTERPRET else jax.local_devices()[0].platform
    if not mlp_t_path.uses_kernel(config, platform, devices):
        return None
    result = compare(cfg, interpret=INTERPRET)
    # Every host's worst ratio, so that all stop together on any host's mismatch.
    ratios = [float(r) for r in distributed.gather_strings(repr(result["worst_ratio"]))]
    result["hosts_worst_ratio"] = ratios
    result["passed"] = max(ratios) <= 1.0
    return result


def failure_line(result: dict) -> str:
    """The one line a mismatch stops a run with: this host's numbers, or the host that failed."""
    ratios = result["hosts_worst_ratio"]
    host = int(np.argmax(ratios))
    return mismatch_line(result) if host == jax.process_index() else _other_host_line(host, ratios)


def compare(cfg: ModelConfig, interpret: bool = False) -> dict[str, Any]:
    """The fused kernel against the plain formulation on this process's first device, forward and gradients, on
    one block of rows of `cfg`'s MLP-T shapes: each array's largest difference over the plain result's largest
    magnitude, and the tolerance of the forward dtype."""
    dtype = jnp.dtype(cfg.dtype)
    mlp = SwiGLU(cfg.total_len, cfg.expansion, cfg.swiglu_multiple, rngs=nnx.Rngs(SEED))
    weights = (mlp.gate_up_proj.weight[...].astype(dtype), mlp.down_proj.weight[...].astype(dtype))
    shape = (cfg.total_len, mlp_t_path.ROWS, cfg.hidden_size)
    x_key, dy_key = jax.random.split(jax.random.key(SEED + 1))
    # Unit-scale activations, as the RMS-normed inputs of the MLP-T are.
    x = jax.random.normal(x_key, shape, jnp.float32).astype(dtype)
    dy = jax.random.normal(dy_key, shape, jnp.float32).astype(dtype)

    # Pallas' TPU interpreter where forced (XLA:CPU cannot run the generic interpreter's bfloat16 dots with float32
    # results: "Unsupported element type for DotThunk"). Imported here, as mlp_t_kernel imports Pallas: 0.1 s.
    mode = False
    if interpret:
        from jax.experimental.pallas import tpu as pltpu

        mode = pltpu.InterpretParams()

    def fused(*args):
        return mlp_t_kernel.swiglu_along_leading_axis(*args, mode)

    def outputs(formulation, x, dy, *weights):
        y, backward = jax.vjp(formulation, x, *weights)
        return (y, *backward(dy))

    started = time.perf_counter()
    # On this host's own device. The arrays are arguments, not constants of the program: XLA would fold the
    # whole computation at compile time.
    x, dy, weights = jax.device_put((x, dy, weights), jax.local_devices()[0])
    got = jax.jit(outputs, static_argnums=0)(fused, x, dy, *weights)
    expected = jax.jit(outputs, static_argnums=0)(plain_swiglu_along_leading_axis, x, dy, *weights)
    tolerance = TOLERANCE[cfg.forward_dtype]
    errors = {}
    for name, a, b in zip(("y", "dx", "dw_gate_up", "dw_down"), got, expected, strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        scale = float(np.max(np.abs(b))) or 1.0
        errors[name] = float(np.max(np.abs(a - b))) / scale if np.all(np.isfinite(a)) else float("inf")
    worst = max(errors, key=errors.get)
    return {
        "device": str(jax.local_devices()[0].device_kind),
        "platform": jax.local_devices()[0].platform,
        "interpret": interpret,
        "dtype": cfg.forward_dtype,
        "shape": list(shape),
        "relative_errors": errors,
        "worst": worst,
        "tolerance": tolerance,
        "worst_ratio": errors[worst] / tolerance,
        "seconds": round(time.perf_counter() - started, 2),
    }


def mismatch_line(result: dict) -> str:
    """The one line a mismatch stops the run with: the numbers and the setting that turns the kernel off."""
    worst = result["worst"]
    return (
        f"the fused MLP-T kernel disagrees with the plain formulation on this {result['device']}: {worst} differs "
        f"by {result['relative_errors'][worst]:.3g} of its scale, over the {result['dtype']} tolerance "
        f"{result['tolerance']:.3g} (shape {result['shape']}); train with {mlp_t_path.SETTING}=plain "
        "(the plain formulation) and report it"
    )


def _other_host_line(host: int, ratios: list[float]) -> str:
    return (
        f"the fused MLP-T kernel disagrees with the plain formulation on host {host} ({ratios[host]:.3g} x the "
        f"tolerance; its log says more); train with {mlp_t_path.SETTING}=plain (the plain formulation)"
    )

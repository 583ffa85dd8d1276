"""The first supervision step's logits on this process's accelerator against the same weights and batch computed on
its CPU: the whole forward (embeddings, every recursion, the heads) compiled for the accelerator, checked against
the platform every test of this repository runs on. `trm canary` reports it (trm/study/canary.py).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from trm.model.act import act_step, initial_carry
from trm.train.step import ModelTemplate

# The largest difference allowed, as a fraction of the largest |logit| on the CPU, by forward dtype. Not yet
# measured on an accelerator (this machine has only its CPU, where the two sides are the same program): the two
# compilers round at different points through H_cycles x (L_cycles + 1) x L_layers blocks (42 at the baseline),
# so a bfloat16 or float16 forward gets 16 units in the last place of bfloat16 (2^-4), and a float32 forward
# 2^-7 (a TPU's default float32 matmul runs bfloat16 passes). A wrong program (a kernel, a layout) is off at the
# logits' own scale. The first GPU or TPU canary's figure is the one to tighten these with.
TOLERANCE = {"bfloat16": 2.0**-4, "float16": 2.0**-4, "float32": 2.0**-7}
ROWS = 8  # rows of the batch compared: the CPU computes them too


def compare_logits(model: ModelTemplate, batch: dict[str, Any]) -> dict[str, Any]:
    """The initial weights' first-step logits for the first ROWS rows of `batch` on this process's first device
    and on its CPU: the largest difference over the CPU's largest |logit|, and the dtype's tolerance."""
    device = jax.local_devices()[0]  # this host's own: jax.devices()[0] is host 0's
    # This host's CPU too: jax.devices("cpu")[0] is host 0's, which another host can only reach through a
    # collective that host 0 does not join. RuntimeError where JAX was started without its CPU backend.
    cpu = jax.local_devices(backend="cpu")[0]
    rows = {name: np.asarray(values)[:ROWS] for name, values in batch.items()}
    weights = (model.init_params, model.init_puzzle_emb, model.init_buffers)
    on_device, on_cpu = (logits_on(model, target, weights, rows) for target in (device, cpu))
    scale = float(np.max(np.abs(on_cpu))) or 1.0
    finite = bool(np.all(np.isfinite(on_device)))
    error = float(np.max(np.abs(on_device - on_cpu))) / scale if finite else float("inf")
    dtype = model.cfg.forward_dtype
    return {
        "device": device.device_kind,
        "rows": len(rows["inputs"]),
        "relative_error": error,
        "tolerance": TOLERANCE[dtype],
        "dtype": dtype,
        "passed": error <= TOLERANCE[dtype],
    }


def logits_on(model: ModelTemplate, device: Any, weights: tuple, rows: dict[str, np.ndarray]) -> np.ndarray:
    """The first supervision step's logits (float32) of `weights` on `rows`, computed on `device`."""

    def first_step(weights, rows):
        trm = model.bind(*weights)
        _, outputs = act_step(trm, initial_carry(trm, len(rows["inputs"])), rows, training=False)
        return outputs.logits.astype(jnp.float32)

    return np.asarray(jax.jit(first_step)(*jax.device_put((weights, rows), device)))

"""The real train and evaluation steps compile for TPU v4 topologies, here on the CPU (no TPU needed), through
`trm compile-check`'s own code (trm/launch/compile_check.py `compile_steps`).

libtpu (pulled by the `dev` extra as jax[tpu]) compiles for a topology description: the compiler a slice runs,
the technique of MaxText's ahead-of-time compilation. The state and batch are abstract (`abstract_state`,
`abstract_batch`): nothing is allocated. The compile runs in a subprocess, so libtpu never becomes a backend of
the test session's JAX.

Why it matters: libtpu 0.0.42.1's algebraic simplifier emits invalid HLO for a dot whose operand is a row
broadcast of a vector (e.g. the gradient of `(h[:, 0] @ w)[:, 0].sum()` at a few hundred rows, on any number of
4 or more devices), an error no CPU test can see; our steps have no such dot, and this test keeps it so. And
"one all-reduce per step" holds on TPU only because the step writes it out (XLA's own partitioning made three).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# Tiny models in the paper's forward dtype. Wide enough (128) that matmuls dominate the FLOPs, as at paper
# scale, so the compiler's count and the analytic one (which ignores elementwise work) can be compared.
TINY = [
    "arch.hidden_size=128",
    "arch.num_heads=2",
    "arch.L_layers=1",
    "arch.H_cycles=2",
    "arch.L_cycles=1",
    "arch.forward_dtype=bfloat16",
]
# (accelerator, overrides): plain on a v4-8 (4 devices, one host); accumulation with remat on a v4-64
# (32 devices, 8 hosts of 2x2x1 chips), 8 rows per device (4 per micro-batch part).
CASES = {
    "plain": ("v4-8", ["train.global_batch_size=64"]),
    "kernel_off": ("v4-8", ["train.global_batch_size=64", "arch.mlp_t_kernel=plain"]),
    "accumulate_remat": (
        "v4-64",
        ["train.global_batch_size=256", "train.micro_batches=2", "train.remat=true"],
    ),
}

COMPILE = textwrap.dedent(
    r"""
    import json, sys
    from trm.config import experiment_path, load_config
    from trm.launch.accelerators import accelerator
    from trm.launch.compile_check import compile_steps, topology_devices

    tiny, cases = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    out = {}
    for name, (chip, sets) in cases.items():
        devices = topology_devices(accelerator(chip))
        out[name] = compile_steps(load_config(experiment_path("exp01c"), tiny + sets), accelerator(chip))
        out[name]["topology"] = [devices[0].device_kind, len({d.process_index for d in devices})]
    print(json.dumps(out))
    """
)


def test_real_steps_compile_for_v4_slices_with_one_all_reduce_and_the_analytic_flops():
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # TPU programs: no cache
    # libtpu otherwise takes a machine-wide lock (/tmp/libtpu_lockfile), held while any process uses it.
    env.update(JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, json.dumps(TINY), json.dumps(CASES)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert (out["plain"]["devices"], out["plain"]["topology"]) == (4, ["TPU v4", 1]), out["plain"]
    shape = (out["accumulate_remat"]["devices"], out["accumulate_remat"]["topology"])
    assert shape == (32, ["TPU v4", 8]), out["accumulate_remat"]

    for name in CASES:
        # One explicit all-reduce per step (gradients, metric sums, touched puzzle rows), also with
        # accumulation; XLA left to itself all-reduced every part's gradients, most of them in bfloat16.
        collectives = out[name]["train"]["collectives"]
        assert collectives["all-reduce"] == 1 and sum(collectives.values()) == 1, (name, collectives)
        # The one evaluator's step moves nothing between devices: its per-puzzle statistics stay on their
        # device until the host gathers them.
        assert sum(out[name]["eval"]["collectives"].values()) == 0, (name, out[name]["eval"])

    # The compiler's FLOPs per chip against trm/model/flops.py's count (`trm model-info`) for the chip's rows.
    # Integer counts of a fixed program, no rounding noise: the analytic count has the matmuls only (and the
    # lm_head on all 97 positions where the model runs it on the 81 cells), so the compiler's is a few
    # percent above it at width 128 (elementwise work grows with the width, matmuls with its square).
    # The train step also runs the MLP-T kernel's recomputation of gate|up in its backward (compiled, not model
    # FLOPs; the count per chip's rows, exact).
    for step in ("train", "eval"):
        plain = out["plain"][step]
        extra = recomputed_flops(CASES["plain"]) if step == "train" else 0
        assert 1.0 <= (plain["flops"] - extra) / plain["model_flops"] < 1.05, (step, plain)
    # arch.mlp_t_kernel: plain compiles the step without the kernel: no recomputation, the analytic FLOPs (and
    # another program than the kernel's: XLA counts the plain MLP-T's elementwise work itself).
    assert recomputed_flops(CASES["kernel_off"]) == 0 < recomputed_flops(CASES["plain"])
    off = out["kernel_off"]["train"]
    assert 1.0 <= off["flops"] / off["model_flops"] < 1.05 and off["flops"] != out["plain"]["train"]["flops"]
    # With accumulation the compiled loop body is counted once per micro-batch; remat adds the recomputed
    # forward of the differentiated recursion (at most one more forward of it: 1 + 1/3 of the train FLOPs).
    accumulated = out["accumulate_remat"]["train"]
    extra = recomputed_flops(CASES["accumulate_remat"])
    assert 1.0 <= (accumulated["flops"] - extra) / accumulated["model_flops"] < 1.4, accumulated


def recomputed_flops(case: tuple[str, list[str]]) -> int:
    """FLOPs per chip of the fused MLP-T kernel's recomputation in a case's train step (trm/model/flops.py)."""
    from trm.config import experiment_path, load_config
    from trm.data.format import sudoku_metadata
    from trm.launch.accelerators import accelerator
    from trm.model.config import ModelConfig
    from trm.model.flops import mlp_t_recompute_flops_per_example_step
    from trm.model.mlp_t_path import uses_kernel

    chip, sets = case
    config = load_config(experiment_path("exp01c"), TINY + sets)
    rows_per_chip = config["train"]["global_batch_size"] // accelerator(chip).chips
    cfg = ModelConfig.from_dict(config["arch"], sudoku_metadata(1))
    if not uses_kernel(config, "tpu", accelerator(chip).chips):  # the rule the plan states, checked here
        return 0  # the plain formulation, no recomputation
    return rows_per_chip * mlp_t_recompute_flops_per_example_step(cfg)

"""The real train and evaluation steps compile for a TPU v4-64 topology, here on the CPU (no TPU needed).

libtpu (pulled by the `dev` extra as jax[tpu]) compiles for a topology description: the compiler a slice runs,
the technique of MaxText's ahead-of-time compilation. The state and batch are
abstract (`abstract_state`, `abstract_batch`): nothing is allocated. The compile runs in a subprocess, so libtpu
never becomes a backend of the test session's JAX.

Why it matters: libtpu 0.0.42.1's algebraic simplifier emits invalid HLO for a dot whose operand is a row
broadcast of a vector (e.g. the gradient of `(h[:, 0] @ w)[:, 0].sum()` at a few hundred rows, on any number of
devices), an error no CPU test can see; our steps have no such dot, and this test keeps it so. And "one
all-reduce per step" holds on TPU only because the step writes it out (XLA's own partitioning made three).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = "v4:2x4x4"  # a v4-64: 32 devices (megacore chips), 8 hosts of 2x2x1 chips
# A tiny model in the paper's forward dtype; 256 rows = 8 per device (4 per micro-batch part).
TINY = {
    "arch.hidden_size": 32,
    "arch.num_heads": 2,
    "arch.L_layers": 1,
    "arch.H_cycles": 2,
    "arch.L_cycles": 1,
    "arch.forward_dtype": "bfloat16",
    "train.global_batch_size": 256,
    "train.eval_steps": 2,
}
VARIANTS = {"plain": {}, "accumulate_remat": {"train.micro_batches": 2, "train.remat": True}}

COMPILE = textwrap.dedent(
    r"""
    import json, re, sys, time
    import jax, numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh
    from trm.config import load_config
    from trm.data.format import sudoku_metadata
    from trm.run.distributed import DATA_AXIS, replicated
    from trm.model.config import ModelConfig
    from trm.train.evaluator import Evaluator
    from trm.train.step import Model, TrainStep, abstract_batch, abstract_state

    topology, tiny, variants = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    devices = topologies.get_topology_desc(
        topology_name=topology, platform="tpu", chip_config_name="megacore",
        chips_per_host_bounds=(2, 2, 1), num_slices=1,
    ).devices
    mesh = Mesh(np.array(devices), (DATA_AXIS,))

    def summary(lowered):
        start = time.perf_counter()
        compiled = lowered.compile()
        hlo = compiled.as_text()
        ops = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
        return {
            "collectives": {op: len(re.findall(rf"\b{op}(?:-start)?\(", hlo)) for op in ops},
            "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
            "compile_seconds": round(time.perf_counter() - start, 1),
        }

    out = {"devices": len(devices), "kind": devices[0].device_kind, "hosts": len({d.process_index for d in devices})}
    for name, extra in variants.items():
        sets = {**tiny, **extra}
        config = load_config("config/base.yaml", [f"{k}={v}" for k, v in sets.items()], base=None)
        cfg = ModelConfig.from_dict(config["arch"], sudoku_metadata(1))
        model = Model(cfg, seed=0)
        rows = config["train"]["global_batch_size"]
        state = abstract_state(model, config, 10, rows, mesh)
        batch = abstract_batch(cfg, rows, mesh)
        prob = jax.ShapeDtypeStruct((), np.float32, sharding=replicated(mesh))
        step = TrainStep(model, config, total_steps=10, mesh=mesh)
        out[name] = summary(step.lower(state, batch, prob, (cfg.H_cycles, cfg.L_cycles)))
    evaluator = Evaluator(model, (config["train"]["eval_steps"],), mesh)
    weights = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated(mesh)),
        (state.params, state.puzzle_emb, state.buffers),
    )
    out["eval"] = summary(evaluator.lower(weights, batch))
    print(json.dumps(out))
    """
)


def test_real_steps_compile_for_a_v4_64_with_one_all_reduce_per_train_step():
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # TPU programs: no cache
    # libtpu otherwise takes a machine-wide lock (/tmp/libtpu_lockfile), held while any process uses it.
    env.update(JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, TOPOLOGY, json.dumps(TINY), json.dumps(VARIANTS)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert (out["devices"], out["kind"], out["hosts"]) == (32, "TPU v4", 8), out

    for name in VARIANTS:
        # One explicit all-reduce per step (gradients, metric sums, touched puzzle rows), also with
        # accumulation; XLA left to itself all-reduced every part's gradients, most of them in bfloat16.
        collectives = out[name]["collectives"]
        assert collectives["all-reduce"] == 1 and sum(collectives.values()) == 1, (name, out[name])
    # The one evaluator's step moves nothing between devices: its per-puzzle statistics stay on their device
    # until the host gathers them.
    assert sum(out["eval"]["collectives"].values()) == 0, out["eval"]

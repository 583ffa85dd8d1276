"""Benchmark: throughput of the real fused train step (trm.train.step.TrainStep) on this machine.

For each case (hidden width, forward dtype) of the Sudoku MLP-T baseline, builds the model, optimizers and
state exactly as the trainer does (load_config over config/base.yaml, Model, TrainStep, init_state), feeds
random Sudoku-shaped batches and times steady-state steps. In the same run, and interleaved with the train
steps so that load from other processes hits both alike, it times a plain jitted square matmul of the
same total FLOP count as one train step. Reported per case:

- examples/s and achieved GFLOP/s (examples/s x flops_per_example_step, spec trm.md §13);
- achieved / matmul: the fraction of this CPU's plain-matmul rate the step reaches (transfers across
  machines);
- ratio to the original PyTorch TRM's figures in spec performance.md (4.13 / 2.64 / 20.8 examples/s) and,
  with --torch, to a PyTorch transcription of the step run here (trm.md §4-§8; needs `pip install torch`);
- compile time (first call minus a steady step) and the compile count after warm-up (must stay 1).

Absolute figures drift with machine load; compare the ratios. XLA_FLAGS, if set, is printed with the table.

    .venv/bin/python benchmarks/bench_train_step.py [--cases 512:float32 512:bfloat16 128:float32]
        [--batch 16] [--steps 5] [--torch]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from trm.config import load_config
from trm.model.config import ModelConfig
from trm.model.flops import flops_per_example_step
from trm.train.step import Model, TrainStep, init_state

SUDOKU_META = {"vocab_size": 11, "seq_len": 81, "num_puzzle_identifiers": 1}
# Examples/s of the original PyTorch TRM at batch 16 on a 2-core CPU (spec performance.md).
ORIGINAL_EXAMPLES_PER_S = {(512, "float32"): 4.13, (512, "bfloat16"): 2.64, (128, "float32"): 20.8}
TOTAL_STEPS = 100_000  # only shapes the lr schedule; warm-up is irrelevant to throughput


def parse_case(text: str) -> tuple[int, str]:
    """'512:float32' -> (512, 'float32')."""
    width, _, dtype = text.partition(":")
    if not width.isdigit() or dtype not in ("float32", "bfloat16", "float16"):
        raise argparse.ArgumentTypeError(f"case {text!r}: expected WIDTH:DTYPE, e.g. 512:float32")
    return int(width), dtype


def random_batch(rng: np.random.Generator, batch: int) -> dict[str, jax.Array]:
    """Sudoku-shaped batch: inputs 1..10 (blank or digit), labels 2..10 (digits), one puzzle identifier."""
    seq_len = SUDOKU_META["seq_len"]
    return {
        "inputs": jnp.asarray(rng.integers(1, 11, (batch, seq_len), dtype=np.int32)),
        "labels": jnp.asarray(rng.integers(2, 11, (batch, seq_len), dtype=np.int32)),
        "puzzle_identifiers": jnp.zeros((batch,), jnp.int32),
    }


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of fn() until its result is ready."""
    start, cpu_start = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    return time.perf_counter() - start, time.process_time() - cpu_start


class MatmulBaseline:
    """A jitted [n, n] x [n, n] product with 2 n^3 closest to `flops`, in `dtype`."""

    def __init__(self, flops: float, dtype: str) -> None:
        self.n = round((flops / 2) ** (1 / 3))
        self.flops = 2 * self.n**3
        keys = jax.random.split(jax.random.key(0))
        self.a, self.b = (jax.random.normal(k, (self.n, self.n), dtype) for k in keys)
        self.matmul = jax.jit(jnp.matmul)
        jax.block_until_ready(self.matmul(self.a, self.b))

    def time(self) -> tuple[float, float]:
        return timed(lambda: self.matmul(self.a, self.b))


def bench_case(width: int, dtype: str, batch: int, steps: int, torch_step) -> dict:
    overrides = [
        f"arch.hidden_size={width}",
        f"arch.forward_dtype={dtype}",
        f"train.global_batch_size={batch}",
    ]
    config = load_config(None, overrides)
    cfg = ModelConfig.from_dict(config["arch"], SUDOKU_META)
    model = Model(cfg, seed=0)
    train_step = TrainStep(model, config, TOTAL_STEPS)
    state = init_state(model, config, TOTAL_STEPS, batch)
    cycles = (cfg.H_cycles, cfg.L_cycles)
    exploration = jnp.float32(cfg.halt_exploration_prob)
    rng = np.random.default_rng(0)
    batches = [random_batch(rng, batch) for _ in range(4)]

    def one_step(i: int):
        nonlocal state
        state, metrics = train_step(state, batches[i % len(batches)], exploration, cycles)
        return state, metrics

    first, _ = timed(lambda: one_step(0))
    one_step_flops = batch * flops_per_example_step(cfg)
    baseline = MatmulBaseline(one_step_flops, dtype)
    step_times, matmul_times, torch_times = [], [], []
    for i in range(1, steps + 1):
        step_times.append(timed(lambda i=i: one_step(i)))
        matmul_times.append(baseline.time())
        if torch_step is not None:
            torch_times.append(torch_step.time())
    step_s, step_cpu_s = (statistics.median(t) for t in zip(*step_times, strict=True))
    matmul_s, matmul_cpu_s = (statistics.median(t) for t in zip(*matmul_times, strict=True))
    examples_per_s = batch / step_s
    return {
        "case": f"{width} {dtype}",
        "examples_per_s": examples_per_s,
        "gflops": one_step_flops / step_s / 1e9,
        "matmul_gflops": baseline.flops / matmul_s / 1e9,
        "matmul_n": baseline.n,
        "ratio_matmul": (one_step_flops / step_s) / (baseline.flops / matmul_s),
        "ratio_matmul_cpu": (one_step_flops / step_cpu_s) / (baseline.flops / matmul_cpu_s),
        "ratio_original": examples_per_s / ORIGINAL_EXAMPLES_PER_S.get((width, dtype), float("nan")),
        "torch_examples_per_s": batch / statistics.median(t[0] for t in torch_times) if torch_times else None,
        "step_s": step_s,
        "step_cpu_s": step_cpu_s,
        "compile_s": first - step_s,
        "compilations": train_step.compilations,
    }


def print_table(rows: list[dict], batch: int) -> None:
    print(
        f"\nbatch {batch}, {jax.device_count()} CPU device(s), XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}"
    )
    header = (
        f"{'case':<14} {'ex/s':>6} {'GFLOP/s':>7} {'matmul GFLOP/s (n)':>18} {'/matmul':>7} {'(cpu)':>6} "
        f"{'/original':>9} {'torch ex/s':>10} {'step s':>6} {'cpu s':>6} {'compile s':>9} {'compiles':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        torch_text = "-" if r["torch_examples_per_s"] is None else f"{r['torch_examples_per_s']:.2f}"
        matmul = f"{r['matmul_gflops']:.0f} ({r['matmul_n']})"
        print(
            f"{r['case']:<14} {r['examples_per_s']:6.2f} {r['gflops']:7.1f} {matmul:>18} "
            f"{r['ratio_matmul']:7.2f} {r['ratio_matmul_cpu']:6.2f} {r['ratio_original']:9.2f} {torch_text:>10} "
            f"{r['step_s']:6.2f} {r['step_cpu_s']:6.2f} {r['compile_s']:9.1f} {r['compilations']:8d}"
        )
    print(
        "/matmul: achieved FLOP/s over the plain matmul's, from wall time and (cpu) from process CPU time;\n"
        "/original: examples/s over the original PyTorch TRM's in spec performance.md (batch 16, 2 cores)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        type=parse_case,
        default=[(512, "float32"), (512, "bfloat16"), (128, "float32")],
        metavar="WIDTH:DTYPE",
        help="hidden width and forward dtype per case (default: 512:float32 512:bfloat16 128:float32)",
    )
    parser.add_argument("--batch", type=int, default=16, help="rows per train step (default 16)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per case after warm-up (default 5)")
    parser.add_argument("--torch", action="store_true", help="also time a PyTorch transcription of the step")
    args = parser.parse_args()
    rows = []
    for width, dtype in args.cases:
        torch_step = None
        if args.torch:
            from benchmarks.torch_train_step import TorchTrainStep

            torch_step = TorchTrainStep(width, dtype, args.batch)
        rows.append(bench_case(width, dtype, args.batch, args.steps, torch_step))
        print(rows[-1], flush=True)
    print_table(rows, args.batch)


if __name__ == "__main__":
    main()

"""Benchmark on a GPU: our train step against the ORIGINAL PyTorch TRM's own train step, same GPU, same run.

For each batch size, each side runs in its own process, one after the other (never two on the GPU at once):

- ours: the fused train step (trm.train.step.TrainStep) exactly as the trainer builds it from config/base.yaml
  (the Sudoku MLP-T baseline, bfloat16 forward) with `train.global_batch_size` = the batch, on JAX's default
  device;
- original: the original's `pretrain.create_model` (its model, ACT loss head and optimizers, with its default
  torch.compile) and `pretrain.train_batch` followed by its `EMAHelper.update`, as its training loop runs
  them, from the checkout given by --original-repo (fetched for the benchmark, never committed; see
  benchmarks/original_trm.py for what is replaced when not installed: wandb, hydra, and adam_atan2 if its CUDA
  extension is missing).

Both get random Sudoku-shaped batches (inputs 1..10, labels 2..10, one puzzle identifier) and synchronise
with the device after every step (the original's train_batch copies its metrics to the host every step; ours
waits for the new state). Reported per side and batch: the median step time over --steps steps after
--warmup warm-up steps, examples/s, achieved TFLOP/s (examples/s x trm.model.flops.flops_per_example_step,
42.7 GFLOP per example, the same model on both sides), the first --warmup steps' times and the compile time
(first step minus a steady one), and for ours the fraction of a plain jitted matmul's rate of the same FLOP
count, measured in the same process. Every ratio printed is between figures measured in this run.

Without CUDA the original side refuses (its create_model and train_batch are CUDA-only); ours then runs on
the CPU, at a tiny size, to check the script (--sides ours --batches 2 --steps 2 --warmup 1).

    python benchmarks/bench_gpu_step.py --original-repo PATH [--batches 192 768] [--steps 30] [--warmup 3]
        [--sides ours original] [--torch-compile on|off] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARK = "RESULT "
TOTAL_STEPS = 100_000  # only shapes our lr schedule; irrelevant to throughput
MATMUL_MAX_FLOPS = 2 * 16384**3  # the reference matmul's size at most (three 16384^2 bf16 matrices: 1.5 GiB)


def run_ours(batch: int, steps: int, warmup: int) -> dict:
    import flax
    import jax
    import jax.numpy as jnp
    import jaxlib
    import numpy as np
    from bench_train_step import SUDOKU_META, MatmulBaseline, random_batch, timed

    from trm.config import load_config
    from trm.model.config import ModelConfig
    from trm.model.flops import flops_per_example_step
    from trm.train.step import ModelTemplate, TrainStep, init_state

    config = load_config(None, [f"train.global_batch_size={batch}"])
    cfg = ModelConfig.from_dict(config["arch"], SUDOKU_META)
    model = ModelTemplate(cfg, seed=0)
    train_step = TrainStep(model, config, TOTAL_STEPS)
    state = init_state(model, config, batch)
    exploration, cycles = jnp.float32(cfg.halt_exploration_prob), (cfg.H_cycles, cfg.L_cycles)
    rng = np.random.default_rng(0)
    batches = [random_batch(rng, batch) for _ in range(4)]

    def one_step(i: int):
        nonlocal state
        state, metrics = train_step(state, batches[i % len(batches)], exploration, cycles, update=i + 1)
        return state, metrics

    first = [timed(lambda i=i: one_step(i))[0] for i in range(warmup)]
    times = [timed(lambda i=i: one_step(i))[0] for i in range(warmup, warmup + steps)]
    flops = batch * flops_per_example_step(cfg)
    matmul = MatmulBaseline(min(flops, MATMUL_MAX_FLOPS), "bfloat16")
    matmul_s = statistics.median(matmul.time()[0] for _ in range(max(steps, 5)))
    device = jax.devices()[0]
    return {
        "side": "ours",
        "batch": batch,
        "dtype": cfg.forward_dtype,
        "first_steps_s": first,
        "step_s": statistics.median(times),
        "step_s_min": min(times),
        "step_s_max": max(times),
        "flops_per_step": flops,
        "compilations": train_step.compilations,
        "matmul_n": matmul.n,
        "matmul_tflops": matmul.flops / matmul_s / 1e12,
        "device": f"{device.platform}: {device.device_kind}",
        "versions": f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}",
    }


def run_original(batch: int, steps: int, warmup: int, repo: Path, compile_mode: str) -> dict:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            "original side: no CUDA device; the original's create_model and train_batch run on CUDA only "
            "(run with --sides ours on a CPU)"
        )
    if compile_mode == "off":
        os.environ["DISABLE_COMPILE"] = "1"  # the original's own switch (pretrain.create_model)
    from original_trm import OPTIMIZER, import_original, sudoku_config

    from trm.data.format import sudoku_metadata
    from trm.model.config import ModelConfig
    from trm.model.flops import flops_per_example_step

    pretrain = import_original(repo)
    from models.ema import EMAHelper

    with tempfile.TemporaryDirectory() as tmp:
        raw = sudoku_config(repo, batch, "unused", epochs=100_000, eval_interval=100_000, checkpoint_path=tmp)
        config = pretrain.PretrainConfig(**raw)
        meta = pretrain.PuzzleDatasetMetadata(**(sudoku_metadata(1) | {"total_groups": 1000}))
        torch.random.manual_seed(config.seed)
        train_state = pretrain.init_train_state(config, meta, rank=0, world_size=1)
        ema = EMAHelper(mu=config.ema_rate)
        ema.register(train_state.model)
        gen = torch.Generator().manual_seed(0)
        batches = [
            {
                "inputs": torch.randint(1, 11, (batch, 81), generator=gen, dtype=torch.int32),
                "labels": torch.randint(2, 11, (batch, 81), generator=gen, dtype=torch.int32),
                "puzzle_identifiers": torch.zeros(batch, dtype=torch.int32),
            }
            for _ in range(4)
        ]

        def one_step(i: int) -> float:
            start = time.perf_counter()
            pretrain.train_batch(config, train_state, batches[i % 4], batch, rank=0, world_size=1)
            ema.update(train_state.model)
            torch.cuda.synchronize()
            return time.perf_counter() - start

        first = [one_step(i) for i in range(warmup)]
        times = [one_step(i) for i in range(warmup, warmup + steps)]
    from trm.config import load_config

    # The same model as ours (config/base.yaml is the original's Sudoku MLP-T recipe), so the same FLOPs.
    arch = sudoku_config(repo, batch, "", 1, 1, "")["arch"]
    cfg = ModelConfig.from_dict(load_config(None, [])["arch"], sudoku_metadata(1))
    return {
        "side": "original",
        "batch": batch,
        "dtype": arch["forward_dtype"],
        "first_steps_s": first,
        "step_s": statistics.median(times),
        "step_s_min": min(times),
        "step_s_max": max(times),
        "flops_per_step": batch * flops_per_example_step(cfg),
        "torch_compile": compile_mode,
        "optimizer": OPTIMIZER["name"],
        "device": f"cuda: {torch.cuda.get_device_name()}",
        "versions": f"torch {torch.__version__}",
    }


def worker(args: argparse.Namespace) -> None:
    if args.worker == "ours":
        result = run_ours(args.batch, args.steps, args.warmup)
    else:
        result = run_original(args.batch, args.steps, args.warmup, args.original_repo, args.torch_compile)
    print(MARK + json.dumps(result), flush=True)


def spawn(side: str, batch: int, args: argparse.Namespace) -> dict | None:
    command = [sys.executable, __file__, "--worker", side, "--batch", str(batch)]
    command += [
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--torch-compile",
        args.torch_compile,
    ]
    if args.original_repo:
        command += ["--original-repo", str(args.original_repo)]
    print(f"== {side}, batch {batch}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    sys.stderr.write(proc.stderr[-4000:])
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        print(f"   {side} batch {batch} failed (exit {proc.returncode})", flush=True)
        return None
    result = json.loads(lines[-1][len(MARK) :])
    result["process_s"] = time.perf_counter() - start
    steady = result["step_s"]
    result["compile_s"] = result["first_steps_s"][0] - steady
    result["examples_per_s"] = batch / steady
    result["tflops"] = result["flops_per_step"] / steady / 1e12
    print(f"   {json.dumps(result)}", flush=True)
    return result


def print_table(results: list[dict]) -> None:
    by_key = {(r["side"], r["batch"]): r for r in results}
    print(
        f"\n{'side':<9} {'batch':>5} {'step ms':>8} {'(min-max)':>15} {'ex/s':>8} {'TFLOP/s':>7} "
        f"{'compile s':>9}"
    )
    for r in results:
        spread = f"{r['step_s_min'] * 1e3:.1f}-{r['step_s_max'] * 1e3:.1f}"
        print(
            f"{r['side']:<9} {r['batch']:>5} {r['step_s'] * 1e3:8.1f} {spread:>15} "
            f"{r['examples_per_s']:8.0f} "
            f"{r['tflops']:7.1f} {r['compile_s']:9.1f}"
        )
    for batch in sorted({r["batch"] for r in results}):
        ours, original = by_key.get(("ours", batch)), by_key.get(("original", batch))
        if ours and original:
            print(
                f"batch {batch}: ours / original examples/s = "
                f"{ours['examples_per_s'] / original['examples_per_s']:.2f}"
            )
        if ours:
            print(
                f"batch {batch}: ours at {ours['tflops'] / ours['matmul_tflops']:.0%} of a plain bf16 matmul "
                f"({ours['matmul_n']}^3: {ours['matmul_tflops']:.0f} TFLOP/s, same process)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", nargs="+", type=int, default=[192, 768])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per side and batch (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first steps (default 3; >= 1)")
    parser.add_argument("--sides", nargs="+", choices=["ours", "original"], default=["ours", "original"])
    parser.add_argument(
        "--original-repo", type=Path, help="a TinyRecursiveModels checkout (for the original side)"
    )
    parser.add_argument(
        "--torch-compile", choices=["on", "off"], default="on", help="the original's (default on)"
    )
    parser.add_argument("--out", type=Path, help="write every result as JSON here")
    parser.add_argument("--worker", choices=["ours", "original"], help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be >= 1")
    if args.worker:
        worker(args)
        return
    if "original" in args.sides and args.original_repo is None:
        parser.error("the original side needs --original-repo PATH (or --sides ours)")
    results = [r for batch in args.batches for side in args.sides if (r := spawn(side, batch, args))]
    print_table(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    if len(results) < len(args.batches) * len(args.sides):
        sys.exit(1)


if __name__ == "__main__":
    main()

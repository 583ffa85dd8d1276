"""Benchmark: what gradient accumulation (train.micro_batches) costs and saves.

For each case, builds the real train step (trm.train.step.TrainStep) on one device at the same global batch
and reports XLA's own memory figures for the compiled step (temporary buffers = activations and workspace,
independent of machine load) and the median steady-state step time (drifts with machine load; compare
cases within one run). Results feed docs/multihost.md.

    .venv/bin/python benchmarks/bench_accumulation.py [--hidden 128] [--batch 64] [--steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from trm.config import load_config
from trm.data.format import sudoku_metadata
from trm.model.config import ModelConfig
from trm.train.step import ModelTemplate, TrainStep, init_state

CASES = [1, 2, 4]  # micro_batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batch = {
        "inputs": rng.integers(1, 11, (args.batch, 81)).astype(np.int32),
        "labels": rng.integers(1, 11, (args.batch, 81)).astype(np.int32),
        "puzzle_identifiers": np.zeros(args.batch, np.int32),
    }
    print(f"hidden {args.hidden}, global batch {args.batch}, float32, one device")
    print("micro_batches  temp MiB  args MiB  step ms")
    for micro_batches in CASES:
        sets = [
            f"arch.hidden_size={args.hidden}",
            "arch.forward_dtype=float32",
            f"train.global_batch_size={args.batch}",
            f"train.micro_batches={micro_batches}",
        ]
        config = load_config("config/base.yaml", sets, base=None)
        model = ModelTemplate(ModelConfig.from_dict(config["arch"], sudoku_metadata(1000)), seed=0)
        step = TrainStep(model, config, total_steps=1000)
        state = init_state(model, config, args.batch)
        cycles = (config["arch"]["H_cycles"], config["arch"]["L_cycles"])
        memory = step.lower(state, batch, 0.1, cycles).compile().memory_analysis()
        state, metrics = step(state, batch, 0.1, cycles, update=1)  # compile
        times = []
        for update in range(2, args.steps + 2):
            start = time.perf_counter()
            state, metrics = step(state, batch, 0.1, cycles, update=update)
            metrics["count"].block_until_ready()
            times.append(time.perf_counter() - start)
        print(
            f"{micro_batches:13d} {memory.temp_size_in_bytes / 2**20:9.1f} "
            f"{memory.argument_size_in_bytes / 2**20:9.1f} {1000 * statistics.median(times):8.0f}"
        )


if __name__ == "__main__":
    main()

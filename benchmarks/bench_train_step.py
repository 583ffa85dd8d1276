"""Benchmark: throughput of the real fused train step (trm.train.step.TrainStep) on this machine.

For each case (hidden width, forward dtype) of the Sudoku MLP-T baseline, builds the model, optimizers and
state exactly as the trainer does (load_config over config/base.yaml, Model, TrainStep, init_state), feeds
random Sudoku-shaped batches and times steady-state steps. In the same run it times a plain jitted square
matmul of the same total FLOP count as one train step and, with --torch, after every case, a PyTorch
transcription of the step (not interleaved: PyTorch's OpenMP workers spin on the cores after each of its steps
and slow whatever runs next). The process runs under the allocator setting the workflow's hosts get
(trm.launch.local.MALLOC_HUGE_PAGES), re-executing itself if needed; --default-malloc keeps the environment as
it is. Reported per case:

- examples/s and achieved GFLOP/s (examples/s x flops_per_example_step, trm/model/flops.py);
- achieved / matmul: the fraction of this CPU's plain-matmul rate the step reaches (transfers across
  machines);
- ratio to the original PyTorch TRM's figures in spec performance.md (4.13 / 2.64 / 20.8 examples/s) and,
  with --torch, to a PyTorch transcription of the step run here (needs `pip install torch`);
- compile time (first call minus a steady step) and the compile count after warm-up (must stay 1).

Absolute figures drift with machine load; compare the ratios, on an otherwise idle machine. Each step is also
timed in process CPU seconds, which load from other processes inflates far less than wall time (on a machine
shared by other jobs, the "(cpu)" ratio is the steadier one). XLA_FLAGS and GLIBC_TUNABLES are printed with the
table.

    .venv/bin/python benchmarks/bench_train_step.py [--cases 512:float32 512:bfloat16 128:float32]
        [--batch 16] [--steps 5] [--torch] [--default-malloc]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from trm.config import load_config
from trm.data.format import sudoku_metadata
from trm.launch.local import MALLOC_HUGE_PAGES, with_tunable
from trm.model.config import ModelConfig
from trm.model.flops import flops_per_example_step
from trm.model.layers import swiglu_width
from trm.train.step import Model, TrainStep, init_state

SUDOKU_META = sudoku_metadata(1)
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


class TorchTrainStep:
    """A plain PyTorch transcription of the original's train step (eager, as the original runs on CPU).

    Sudoku MLP-T: embedding with the 16-position puzzle prefix, 2 post-norm blocks (MLP-T mixer normalised
    over the sequence, channel SwiGLU), 2 no-grad recursions and 1 differentiated one (6 L cycles each),
    lm and Q heads, stablemax cross-entropy in float64 plus Q-halt BCE, AdamATan2 and the EMA. Weights are
    float32 masters cast to the forward dtype at use, as in the original's CastedLinear. The ACT carry
    bookkeeping and the puzzle-embedding sign-SGD are left out (negligible work).
    """

    def __init__(self, width: int, dtype: str, batch: int, threads: int) -> None:
        import torch

        self.torch = torch
        torch.manual_seed(0)
        torch.set_num_threads(threads)
        arch = load_config(overrides=[f"arch.hidden_size={width}", f"arch.forward_dtype={dtype}"])["arch"]
        cfg = ModelConfig.from_dict(arch, SUDOKU_META)
        self.cfg, self.dtype = cfg, getattr(torch, dtype)
        length, inner_t, inner_c = cfg.total_len, swiglu_width(cfg.total_len, 4), swiglu_width(width, 4)

        def weight(fan_in: int, fan_out: int) -> torch.Tensor:
            return (torch.randn(fan_out, fan_in) / math.sqrt(fan_in)).requires_grad_()

        self.params = {"embed": (torch.randn(cfg.vocab_size, width) / math.sqrt(width)).requires_grad_()}
        for i in range(cfg.L_layers):
            self.params |= {
                f"{i}.mlp_t.gate_up": weight(length, 2 * inner_t),
                f"{i}.mlp_t.down": weight(inner_t, length),
                f"{i}.mlp.gate_up": weight(width, 2 * inner_c),
                f"{i}.mlp.down": weight(inner_c, width),
            }
        self.params |= {"lm_head": weight(width, cfg.vocab_size), "q_head": weight(width, 2)}
        self.adam = {name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in self.params.items()}
        self.ema = {name: p.detach().clone() for name, p in self.params.items()}
        self.step_count = 0
        self.z_H = torch.randn(batch, length, width).to(self.dtype)
        self.z_L = torch.randn(batch, length, width).to(self.dtype)
        self.inputs = torch.randint(1, 11, (batch, cfg.seq_len))
        self.labels = torch.randint(2, 11, (batch, cfg.seq_len))

    def _linear(self, x, name: str):
        return x @ self.params[name].to(x.dtype).t()

    def _swiglu(self, x, name: str):
        gate, up = self._linear(x, f"{name}.gate_up").chunk(2, dim=-1)
        return self._linear(self.torch.nn.functional.silu(gate) * up, f"{name}.down")

    def _rms(self, x):
        x32 = x.float()
        return (x32 * self.torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.cfg.rms_norm_eps)).to(
            x.dtype
        )

    def _net(self, h, injection):
        h = h + injection
        for i in range(self.cfg.L_layers):
            t = h.transpose(1, 2)
            h = self._rms(t + self._swiglu(t, f"{i}.mlp_t")).transpose(1, 2)
            h = self._rms(h + self._swiglu(h, f"{i}.mlp"))
        return h

    def _recursion(self, z_H, z_L, x):
        for _ in range(self.cfg.L_cycles):
            z_L = self._net(z_L, z_H + x)
        return self._net(z_H, z_L), z_L

    def step(self) -> None:
        torch, cfg = self.torch, self.cfg
        tokens = self.params["embed"].to(self.dtype)[self.inputs]
        prefix = torch.zeros(tokens.shape[0], cfg.prefix_len, cfg.hidden_size, dtype=self.dtype)
        x = math.sqrt(cfg.hidden_size) * torch.cat([prefix, tokens], dim=1)
        z_H, z_L = self.z_H, self.z_L
        with torch.no_grad():
            for _ in range(cfg.H_cycles - 1):
                z_H, z_L = self._recursion(z_H, z_L, x)
        z_H, z_L = self._recursion(z_H, z_L, x)
        self.z_H, self.z_L = z_H.detach(), z_L.detach()
        logits = self._linear(z_H[:, cfg.prefix_len :], "lm_head").double()
        q_halt = self._linear(z_H[:, 0], "q_head")[:, 0].float()
        s = torch.where(logits < 0, 1 / (1 - logits + 1e-30), logits + 1)
        logprobs = torch.log(s / s.sum(-1, keepdim=True))
        lm_loss = -logprobs.gather(-1, self.labels[..., None]).squeeze(-1).mean(-1)
        correct = (logits.argmax(-1) == self.labels).all(-1).float()
        q_loss = torch.nn.functional.binary_cross_entropy_with_logits(q_halt, correct, reduction="none")
        ((lm_loss.float() + 0.5 * q_loss).sum() / logits.shape[0]).backward()
        self._optimizer_step(lr=1e-4, betas=(0.9, 0.95), weight_decay=1.0, ema_rate=0.999)

    def _optimizer_step(self, lr: float, betas: tuple[float, float], weight_decay: float, ema_rate: float):
        torch = self.torch
        self.step_count += 1
        bias1, bias2 = 1 - betas[0] ** self.step_count, 1 - betas[1] ** self.step_count
        with torch.no_grad():
            for name, p in self.params.items():
                m, v = self.adam[name]
                m.lerp_(p.grad, 1 - betas[0])
                v.lerp_(p.grad.square(), 1 - betas[1])
                p.mul_(1 - lr * weight_decay).add_(torch.atan2(m / bias1, (v / bias2).sqrt()), alpha=-lr)
                self.ema[name].lerp_(p, 1 - ema_rate)
                p.grad = None

    def time(self) -> tuple[float, float]:
        return timed(self.step)


def bench_case(width: int, dtype: str, batch: int, steps: int) -> dict:
    overrides = [
        f"arch.hidden_size={width}",
        f"arch.forward_dtype={dtype}",
        f"train.global_batch_size={batch}",
    ]
    config = load_config(None, overrides)
    cfg = ModelConfig.from_dict(config["arch"], SUDOKU_META)
    model = Model(cfg, seed=0)
    train_step = TrainStep(model, config, TOTAL_STEPS)
    state = init_state(model, config, batch)
    cycles = (cfg.H_cycles, cfg.L_cycles)
    exploration = jnp.float32(cfg.halt_exploration_prob)
    rng = np.random.default_rng(0)
    batches = [random_batch(rng, batch) for _ in range(4)]

    def one_step(i: int):
        nonlocal state
        state, metrics = train_step(state, batches[i % len(batches)], exploration, cycles, update=i + 1)
        return state, metrics

    first, _ = timed(lambda: one_step(0))
    one_step_flops = batch * flops_per_example_step(cfg)
    baseline = MatmulBaseline(one_step_flops, dtype)
    step_times = [timed(lambda i=i: one_step(i)) for i in range(1, steps + 1)]
    matmul_times = [baseline.time() for _ in range(steps)]
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
        "torch_examples_per_s": None,
        "ratio_torch": None,
        "torch_cpu_s": None,
        "step_s": step_s,
        "step_cpu_s": step_cpu_s,
        "compile_s": first - step_s,
        "compilations": train_step.compilations,
    }


def print_table(rows: list[dict], batch: int) -> None:
    print(
        f"\nbatch {batch}, {jax.device_count()} CPU device(s), XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}"
    )
    header = (
        f"{'case':<14} {'ex/s':>6} {'GFLOP/s':>7} {'matmul GFLOP/s (n)':>18} {'/matmul':>7} {'(cpu)':>6} "
        f"{'/original':>9} {'torch ex/s (cpu s) ours/it':>26} {'step s':>6} {'cpu s':>6} {'compile s':>9} "
        f"{'compiles':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        torch_text = "-"
        if r["torch_examples_per_s"] is not None:
            torch_text = f"{r['torch_examples_per_s']:.2f} ({r['torch_cpu_s']:.2f}) x{r['ratio_torch']:.2f}"
        matmul = f"{r['matmul_gflops']:.0f} ({r['matmul_n']})"
        print(
            f"{r['case']:<14} {r['examples_per_s']:6.2f} {r['gflops']:7.1f} {matmul:>18} "
            f"{r['ratio_matmul']:7.2f} {r['ratio_matmul_cpu']:6.2f} {r['ratio_original']:9.2f} {torch_text:>26} "
            f"{r['step_s']:6.2f} {r['step_cpu_s']:6.2f} {r['compile_s']:9.1f} {r['compilations']:8d}"
        )
    print(
        "/matmul: achieved FLOP/s over the plain matmul's, from wall time and (cpu) from process CPU time;\n"
        "/original: examples/s over the original PyTorch TRM's in spec performance.md (batch 16, 2 cores);\n"
        "cpu s: process CPU seconds per step (both threads); torch: the --torch transcription, same run, and our\n"
        "examples/s over its"
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
    parser.add_argument(
        "--torch",
        action="store_true",
        help="also time a PyTorch transcription of the step (pip install torch)",
    )
    parser.add_argument("--torch-threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="run under the environment's allocator settings, not the workflow hosts' huge pages",
    )
    args = parser.parse_args()
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if not args.default_malloc and with_tunable(tunables, *MALLOC_HUGE_PAGES) != tunables:
        # glibc reads its tunables only when a process starts.
        os.environ["GLIBC_TUNABLES"] = with_tunable(tunables, *MALLOC_HUGE_PAGES)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    rows = []
    for width, dtype in args.cases:
        rows.append(bench_case(width, dtype, args.batch, args.steps))
        print(rows[-1], flush=True)
    # PyTorch only after every JAX case: interleaved with its steps, ours ran at half speed (hidden 128: 21 against
    # 45 examples/s alone), as PyTorch's OpenMP workers go on spinning on both cores after each of its steps.
    if args.torch:
        for row, (width, dtype) in zip(rows, args.cases, strict=True):
            torch_step = TorchTrainStep(width, dtype, args.batch, args.torch_threads)
            torch_step.step()  # warm-up
            times = [torch_step.time() for _ in range(args.steps)]
            wall, cpu = (statistics.median(t) for t in zip(*times, strict=True))
            row.update(
                torch_examples_per_s=args.batch / wall, torch_cpu_s=cpu, ratio_torch=wall / row["step_s"]
            )
    print_table(rows, args.batch)


if __name__ == "__main__":
    main()

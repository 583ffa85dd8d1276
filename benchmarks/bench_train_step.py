"""Benchmark: throughput of the real fused train step (trm.train.step.TrainStep) on this machine's CPU.

For each case (hidden width, forward dtype) of the Sudoku MLP-T baseline, builds the model, optimizers and
state exactly as the trainer does (load_config over config/base.yaml, ModelTemplate, TrainStep, init_state), feeds
random Sudoku-shaped batches and times steady-state steps. In the same run it times a plain jitted square
matmul of the same total FLOP count as one train step and, on request, the PyTorch side:

- --torch: a PyTorch transcription of the original's step (`TorchTrainStep`, below; needs torch);
- --original-repo PATH: the ORIGINAL TRM's own model, loss head, optimizers and EMA from a checkout of
  github.com/SamsungSAILMontreal/TinyRecursiveModels (fetched for the benchmark, never committed), eager, as
  the original runs on a CPU (benchmarks/original_trm.py `OriginalTrainStep`; needs torch, pydantic, einops).

Every ratio printed is between figures measured in this run; there are no figures from elsewhere. The whole
measurement is repeated --rounds times; in each round every case times ours, then the matmul, then each
PyTorch side, --steps steps each, after one untimed step (which also absorbs PyTorch's OpenMP workers, which
go on spinning on the cores for a while after each of its steps and slow whatever runs next). Reported per
case: the median over rounds of each round's median step, and for each ratio its median and its range over
the rounds:

- examples/s and achieved GFLOP/s (examples/s x flops_per_example_step, trm/model/flops.py);
- /matmul: the fraction of this CPU's plain-matmul rate the step reaches, from wall time and (cpu) from
  process CPU time, which load from other processes inflates far less (transfers across machines);
- ours over the transcription's and over the original's examples/s;
- compile time (first call minus a steady step) and the compile count after warm-up (must stay 1).

The process runs under the allocator setting the workflow's hosts get (trm.launch.local.MALLOC_HUGE_PAGES),
re-executing itself if needed; --default-malloc keeps the environment as it is. Absolute figures drift with
machine load: compare the ratios, on an otherwise idle machine. XLA_FLAGS and GLIBC_TUNABLES are printed with
the table. On a GPU, benchmarks/bench_gpu_step.py times ours against the original's own step
(docs/performance.md).

    .venv/bin/python benchmarks/bench_train_step.py [--cases 512:float32 512:bfloat16 128:float32]
        [--batch 16] [--steps 5] [--rounds 3] [--torch] [--original-repo PATH] [--default-malloc]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from trm.config import load_config
from trm.data.format import sudoku_metadata
from trm.launch.local import MALLOC_HUGE_PAGES, with_tunable
from trm.model.config import ModelConfig, swiglu_width
from trm.model.flops import flops_per_example_step
from trm.train.step import ModelTemplate, TrainStep, init_state

SUDOKU_META = sudoku_metadata(1)
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
        length, inner_t, inner_c = (
            cfg.total_len,
            swiglu_width(cfg.total_len, 4, cfg.swiglu_multiple),
            swiglu_width(width, 4, cfg.swiglu_multiple),
        )

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


class JaxTrainStep:
    """Our train step as the trainer builds it; compiled and run once at construction (that call timed)."""

    def __init__(self, width: int, dtype: str, batch: int) -> None:
        overrides = [
            f"arch.hidden_size={width}",
            f"arch.forward_dtype={dtype}",
            f"train.global_batch_size={batch}",
        ]
        config = load_config(None, overrides)
        self.cfg = cfg = ModelConfig.from_dict(config["arch"], SUDOKU_META)
        model = ModelTemplate(cfg, seed=0)
        self.train_step = TrainStep(model, config, TOTAL_STEPS)
        self.state = init_state(model, config, batch)
        self.cycles = (cfg.H_cycles, cfg.L_cycles)
        self.exploration = jnp.float32(cfg.halt_exploration_prob)
        rng = np.random.default_rng(0)
        self.batches = [random_batch(rng, batch) for _ in range(4)]
        self.updates = 0
        self.first_s = timed(self._step)[0]

    def _step(self):
        self.updates += 1
        batch = self.batches[self.updates % len(self.batches)]
        self.state, metrics = self.train_step(
            self.state, batch, self.exploration, self.cycles, update=self.updates
        )
        return self.state, metrics

    def time(self) -> tuple[float, float]:
        return timed(self._step)


class TimedStep:
    """A PyTorch step object (TorchTrainStep, OriginalTrainStep) with time() -> (wall s, process CPU s)."""

    def __init__(self, step) -> None:
        self.step = step

    def time(self) -> tuple[float, float]:
        start, cpu_start = time.perf_counter(), time.process_time()
        self.step.step()
        return time.perf_counter() - start, time.process_time() - cpu_start


def build_runners(width: int, dtype: str, args: argparse.Namespace) -> dict:
    """The timed sides of one case: ours, the matmul and the PyTorch sides asked for, in timing order."""
    ours = JaxTrainStep(width, dtype, args.batch)
    runners = {"ours": ours}
    runners["matmul"] = MatmulBaseline(args.batch * flops_per_example_step(ours.cfg), dtype)
    if args.torch:
        runners["torch"] = TimedStep(TorchTrainStep(width, dtype, args.batch, args.torch_threads))
    if args.original_repo:
        from original_trm import OriginalTrainStep

        step = OriginalTrainStep(args.original_repo, width, dtype, args.batch, args.torch_threads)
        runners["original"] = TimedStep(step)
    return runners


def measure(cases: list[tuple[int, str]], args: argparse.Namespace) -> list[dict]:
    """Per case: {side: [(wall, cpu) median per round]} over --rounds rounds, and the compile figures."""
    runners = {case: build_runners(*case, args) for case in cases}
    samples = {case: {side: [] for side in sides} for case, sides in runners.items()}
    for round_ in range(args.rounds):
        for case, sides in runners.items():
            for side, runner in sides.items():
                runner.time()  # untimed: warm-up, and lets the previous side's worker threads settle
                times = [runner.time() for _ in range(args.steps)]
                samples[case][side].append(tuple(statistics.median(t) for t in zip(*times, strict=True)))
            print(f"round {round_ + 1}, case {case}: {samples[case]}", flush=True)
    rows = []
    for (width, dtype), sides in samples.items():
        ours = runners[(width, dtype)]["ours"]
        step_flops = args.batch * flops_per_example_step(ours.cfg)
        rows.append(
            {
                "case": f"{width} {dtype}",
                "samples": sides,
                "step_flops": step_flops,
                "matmul": runners[(width, dtype)]["matmul"],
                "compile_s": ours.first_s - statistics.median(w for w, _ in sides["ours"]),
                "compilations": ours.train_step.compilations,
            }
        )
    return rows


def spread(values: list[float]) -> str:
    """'median (min-max)' of per-round values; the median alone for one round."""
    text = f"{statistics.median(values):.2f}"
    return text if len(values) == 1 else f"{text} ({min(values):.2f}-{max(values):.2f})"


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    print(
        f"\nbatch {args.batch}, {jax.device_count()} CPU device(s), {args.rounds} round(s) of {args.steps} "
        f"steps, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}"
    )
    header = (
        f"{'case':<14} {'ex/s':>6} {'GFLOP/s':>7} {'matmul GFLOP/s (n)':>18} {'/matmul':>16} {'(cpu)':>16} "
        f"{'torch ex/s':>10} {'ours/torch':>16} {'orig ex/s':>9} {'ours/original':>16} {'compile s':>9} "
        f"{'compiles':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        sides, matmul = r["samples"], r["matmul"]
        ours_wall = [w for w, _ in sides["ours"]]
        ours_s = statistics.median(ours_wall)
        vs_matmul = [
            (r["step_flops"] / w) / (matmul.flops / m)
            for w, (m, _) in zip(ours_wall, sides["matmul"], strict=True)
        ]
        vs_matmul_cpu = [
            (r["step_flops"] / c) / (matmul.flops / m)
            for (_, c), (_, m) in zip(sides["ours"], sides["matmul"], strict=True)
        ]
        matmul_s = statistics.median(m for m, _ in sides["matmul"])
        texts = {}
        for side in ("torch", "original"):
            if side in sides:
                wall = [w for w, _ in sides[side]]
                texts[side] = (
                    f"{args.batch / statistics.median(wall):.2f}",
                    spread([w / o for w, o in zip(wall, ours_wall, strict=True)]),
                )
        torch_text, original_text = texts.get("torch", ("-", "-")), texts.get("original", ("-", "-"))
        print(
            f"{r['case']:<14} {args.batch / ours_s:6.2f} {r['step_flops'] / ours_s / 1e9:7.1f} "
            f"{f'{matmul.flops / matmul_s / 1e9:.0f} ({matmul.n})':>18} {spread(vs_matmul):>16} "
            f"{spread(vs_matmul_cpu):>16} {torch_text[0]:>10} {torch_text[1]:>16} {original_text[0]:>9} "
            f"{original_text[1]:>16} {r['compile_s']:9.1f} {r['compilations']:8d}"
        )
    print(
        "median over rounds (range over rounds in brackets); /matmul: achieved FLOP/s over the plain\n"
        "matmul's, from wall time and (cpu) from process CPU time; ours/torch, ours/original: our\n"
        "examples/s over the PyTorch transcription's (--torch) and over the original's own code\n"
        "(--original-repo), "
        "each measured in this run"
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
    parser.add_argument(
        "--steps", type=int, default=5, help="timed steps per side, case and round (default 5)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="repeats of the whole measurement (default 3)")
    parser.add_argument(
        "--torch",
        action="store_true",
        help="also time a PyTorch transcription of the step (pip install torch)",
    )
    parser.add_argument(
        "--original-repo",
        type=Path,
        help="also time the original TRM's own step from this TinyRecursiveModels checkout (CPU, eager)",
    )
    parser.add_argument("--torch-threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="run under the environment's allocator settings, not the workflow hosts' huge pages",
    )
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be >= 1")
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if not args.default_malloc and with_tunable(tunables, *MALLOC_HUGE_PAGES) != tunables:
        # glibc reads its tunables only when a process starts.
        os.environ["GLIBC_TUNABLES"] = with_tunable(tunables, *MALLOC_HUGE_PAGES)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    print_table(measure(args.cases, args), args)


if __name__ == "__main__":
    main()

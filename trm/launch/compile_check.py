"""Compile experiments' real train and evaluation steps for a TPU slice, here (no TPU needed): does each fit?

    trm compile-check exp01c exp06_f --accelerator v4-64
    trm compile-check exp01f --set train.micro_batches=2

libtpu (`pip install -e '.[tpu]'`) compiles for a slice's topology on any machine: the compiler the slice runs.
The step's state and batch are abstract (shapes, dtypes and shardings; nothing is allocated), at the
experiment's own (paper-scale) config. Per chip it prints: HBM for the arguments (state and batch), the
temporaries and in total against the chip's capacity; FLOPs and bytes per step as the compiler counts them;
the collectives; a roofline step time (FLOPs at peak or bytes at full HBM bandwidth, whichever is slower) and
the MFU it implies (the analytic model FLOPs of trm/model/flops.py over peak x that time). The same for the
evaluation step (one supervision step on a batch of train.global_batch_size rows).

A roofline is a best case: every FLOP at peak and every byte (as the compiler counts them) at full
bandwidth, with nothing else in the way. docs/tpu.md says how far to trust it.

When a step does not fit, the command fails naming the numbers and the `train.micro_batches` or
`train.remat` to try. Compiling a paper-scale train step takes minutes on a CPU: with --cache DIR each
result is kept as DIR/<step hash>.json and reused by every experiment with the same step (trm/launch/accelerators.py
`step_config`, and the step's source code: `step_hash`), which is what the workflow's `compile_check` target does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

from trm import storage
from trm.config import (
    add_overrides_argument,
    batch_split_problem,
    experiment_ids,
    experiment_path,
    load_config,
)
from trm.errors import UserError
from trm.launch import tpu_options
from trm.launch.accelerators import (
    ACCELERATORS,
    COMPILE_AGAIN,
    GIB,
    Accelerator,
    accelerator,
    step_config,
    step_figures,
    step_hash,
)
from trm.model.mlp_t_path import path_name

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
INSTALL_HINT = "pip install -e '.[tpu]' (libtpu for the pinned jax, i.e. pip install 'jax[tpu]==JAX')"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "experiments", nargs="+", metavar="EXPERIMENT", help="experiment ids (config/experiments/), or all"
    )
    parser.add_argument(
        "--accelerator",
        default=tpu_options.defaults()["accelerator_type"],
        choices=list(ACCELERATORS),
        help="slice type (default: launch.tpu.accelerator_type of config/config.yaml, %(default)s)",
    )
    add_overrides_argument(parser)
    parser.add_argument(
        "--cache", metavar="DIR", help="reuse and keep each step's figures in DIR/<step hash>.json"
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="compile nothing: print a Markdown table of the experiments' figures kept in --cache DIR",
    )


def main(args: argparse.Namespace) -> int:
    chip = accelerator(args.accelerator)
    ids = experiment_ids() if args.experiments == ["all"] else args.experiments
    if args.table:
        if not args.cache:
            raise UserError("--table prints the figures kept in --cache DIR: give the folder")
        print(table(ids, args.overrides, chip, Path(args.cache)))
        return 0
    problems = []
    for exp_id in ids:
        config = load_config(experiment_path(exp_id), args.overrides)
        mlp_t = path_name(config, "tpu", chip.chips)  # before compiling: a `fused` that cannot be stops here
        figures = cached_or_compiled(config, chip, args.cache, exp_id)
        print(report(exp_id, figures, chip, mlp_t), flush=True)
        if problem := fit_problem(exp_id, config, figures, chip):
            problems.append(problem)
    if problems:
        raise UserError("\n".join(problems))
    return 0


def cached_or_compiled(config: dict, chip: Accelerator, cache: str | None, exp_id: str) -> dict:
    """The figures of `config`'s steps on `chip`: from DIR/<step hash>.json when there, else compiled (and kept)."""
    path = Path(step_figures(cache, config)) if cache else None
    if path is not None and path.exists():
        figures = storage.read_json(str(path), "missing", COMPILE_AGAIN)
        if figures["accelerator"] != chip.name:
            raise UserError(
                f"{path} holds figures for a {figures['accelerator']}: use one folder per accelerator"
            )
        return figures
    print(f"compiling {exp_id} for a {chip.name} (minutes at paper scale)...", file=sys.stderr, flush=True)
    figures = compile_steps(config, chip)
    if path is not None:
        storage.write_text(str(path), json.dumps(figures, indent=1, sort_keys=True) + "\n")
    return figures


def topology_devices(chip: Accelerator) -> list:
    """The JAX devices of `chip`'s topology, for compiling only (libtpu; this machine needs no TPU)."""
    # Before JAX starts: compile-only use must not take libtpu's machine-wide lock or look for TPU chips.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    try:
        import libtpu  # noqa: F401 (only whether it is installed)
    except ImportError:
        raise UserError(
            f"compiling for a TPU needs libtpu: {INSTALL_HINT.replace('JAX', jax.__version__)}"
        ) from None
    from jax.experimental import topologies

    return topologies.get_topology_desc(
        topology_name=chip.topology,
        platform="tpu",
        chip_config_name=chip.chip_config,
        chips_per_host_bounds=chip.chips_per_host_bounds,
        num_slices=1,
    ).devices


def compile_steps(config: dict, chip: Accelerator) -> dict:
    """Compile `config`'s train step (at its full depth) and evaluation step for `chip`'s topology; their figures."""
    steps = lowered_steps(config, chip)
    import jax

    rows_per_chip = config["train"]["global_batch_size"] / steps.devices
    return {
        "accelerator": chip.name,
        "devices": steps.devices,
        "jax": jax.__version__,
        "libtpu": metadata.version("libtpu"),
        "step_config": step_config(config),
        "train": _compiled_figures(
            steps.train, rows_per_chip * steps.train_flops, config["train"]["micro_batches"]
        ),
        "eval": _compiled_figures(steps.evaluation, rows_per_chip * steps.eval_flops, 1),
    }


class LoweredSteps(NamedTuple):
    """`config`'s train and evaluation steps lowered for a topology (compile with `.compile()`)."""

    train: Any
    evaluation: Any
    devices: int
    train_flops: float  # analytic model FLOPs per example (trm/model/flops.py)
    eval_flops: float


def lowered_steps(config: dict, chip: Accelerator) -> LoweredSteps:
    """Lower `config`'s train step (at its full depth) and evaluation step for `chip`'s topology."""
    devices = topology_devices(chip)
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from trm.model.config import ModelConfig
    from trm.model.flops import flops_per_example_step, forward_flops_per_example_step
    from trm.run.distributed import DATA_AXIS, replicated
    from trm.train.evaluator import Evaluator
    from trm.train.step import ModelTemplate, TrainStep, abstract_batch, abstract_state

    if problem := batch_split_problem(config["train"], len(devices)):
        raise UserError(problem)
    mesh = Mesh(np.array(devices), (DATA_AXIS,))
    cfg = ModelConfig.planned(config)
    model = ModelTemplate(cfg, seed=0)
    rows = config["train"]["global_batch_size"]
    state = abstract_state(model, config, rows, mesh)
    batch = abstract_batch(cfg, rows, mesh)
    exploration = jax.ShapeDtypeStruct((), np.float32, sharding=replicated(mesh))
    step = TrainStep(model, config, total_steps=1000, mesh=mesh)  # the length only sets host-side inputs
    train = step.lower(state, batch, exploration, (cfg.H_cycles, cfg.L_cycles))
    weights = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated(mesh)),
        (state.params, state.puzzle_emb, state.buffers),
    )
    evaluation = Evaluator(model, (1,), mesh).lower(weights, batch)
    return LoweredSteps(
        train, evaluation, len(devices), flops_per_example_step(cfg), forward_flops_per_example_step(cfg)
    )


def _compiled_figures(lowered, model_flops: float, micro_batches: int) -> dict:
    """Per-device memory, cost and collectives of a lowered program, compiled; `model_flops`: analytic, per chip.

    XLA's cost analysis counts a loop's body once: with k micro-batches (a scan of k parts) the step's FLOPs
    and bytes are counted k times, which counts the optimizer update, outside the loop, k - 1 times too often
    (0.1% of the step at width 128 with k = 2; less at paper scale).
    """
    start = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    hlo = compiled.as_text()
    return {
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "alias_bytes": memory.alias_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "code_bytes": memory.generated_code_size_in_bytes,
        "flops": micro_batches * float(cost.get("flops", 0.0)),
        "bytes_accessed": micro_batches * float(cost.get("bytes accessed", 0.0)),
        "model_flops": float(model_flops),
        "collectives": {op: len(re.findall(rf"\b{op}(?:-start)?\(", hlo)) for op in COLLECTIVES},
        "compile_seconds": round(seconds, 1),
    }


def total_bytes(step: dict) -> int:
    """Peak HBM per chip: arguments, outputs not written in place of a donated argument, temporaries, code."""
    return (
        step["argument_bytes"]
        + step["output_bytes"]
        - step["alias_bytes"]
        + step["temp_bytes"]
        + step["code_bytes"]
    )


def roofline_seconds(step: dict, chip: Accelerator) -> float:
    """The step's time if it ran at peak FLOP/s or at full HBM bandwidth, whichever bounds it."""
    return max(step["flops"] / chip.peak_flops, step["bytes_accessed"] / chip.hbm_bytes_per_second)


def mfu(step: dict, chip: Accelerator) -> float:
    """Model FLOPs utilisation at the roofline time: an upper bound."""
    return step["model_flops"] / (chip.peak_flops * roofline_seconds(step, chip))


def report(exp_id: str, figures: dict, chip: Accelerator, mlp_t: str | None = None) -> str:
    """The figures of an experiment's steps; `mlp_t`: the train step's MLP-T path (trm/model/mlp_t_path.py)."""
    path = f"; MLP-T: {mlp_t}" if mlp_t else ""
    lines = [
        f"{exp_id} on a {chip.name} ({figures['devices']} chips, {chip.hbm_bytes / GIB:.0f} GiB HBM each{path}):"
    ]
    for name in ("train", "eval"):
        step = figures[name]
        total = total_bytes(step)
        collectives = ", ".join(f"{n} {op}" for op, n in step["collectives"].items() if n) or "none"
        seconds = roofline_seconds(step, chip)
        bound = _bound(step, chip)
        lines += [
            f"  {name} step (compiled in {step['compile_seconds']:.0f} s):",
            f"    HBM per chip   {_gib(step['argument_bytes'])} arguments + {_gib(step['temp_bytes'])} temporary"
            f" + {_gib(total - step['argument_bytes'] - step['temp_bytes'])} new outputs and code"
            f" = {_gib(total)} of {_gib(chip.hbm_bytes)} ({100 * total / chip.hbm_bytes:.0f}%)"
            + ("" if total <= chip.hbm_bytes else "  DOES NOT FIT"),
            f"    per chip       {step['flops'] / 1e12:.2f} TFLOP compiled ({step['model_flops'] / 1e12:.2f} TFLOP"
            f" model), {step['bytes_accessed'] / 1e9:.1f} GB accessed",
            f"    collectives    {collectives}",
            f"    roofline       {seconds * 1e3:.0f} ms per step ({bound}-bound), MFU at most {100 * mfu(step, chip):.0f}%",
        ]
    return "\n".join(lines)


def fit_problem(exp_id: str, config: dict, figures: dict, chip: Accelerator) -> str | None:
    """None when both steps fit a chip's HBM; else what does not fit and which settings to try."""
    train, evaluation = figures["train"], figures["eval"]
    problems = []
    for name, step in (("train", train), ("evaluation", evaluation)):
        if total_bytes(step) > chip.hbm_bytes:
            problems.append(f"{name} step needs {_gib(total_bytes(step))} per chip")
    if not problems:
        return None
    text = (
        f"{exp_id} does not fit a {chip.name} ({_gib(chip.hbm_bytes)} HBM per chip): {'; '.join(problems)}."
    )
    if total_bytes(train) > chip.hbm_bytes:
        text += " " + _train_advice(exp_id, config, train, chip, figures["devices"])
    if total_bytes(evaluation) > chip.hbm_bytes:
        text += (
            " The evaluation runs train.global_batch_size rows at once: a smaller batch or a larger slice."
        )
    return text


def _train_advice(exp_id: str, config: dict, train: dict, chip: Accelerator, devices: int) -> str:
    """The smallest train.micro_batches whose temporaries, scaled down with the rows per part, would fit."""
    fixed = total_bytes(train) - train["temp_bytes"]
    k = config["train"]["micro_batches"]
    for more in (2, 4, 8, 16, 32):
        candidate = {**config["train"], "micro_batches": k * more}
        if batch_split_problem(candidate, devices):
            break
        if fixed + train["temp_bytes"] / more <= chip.hbm_bytes:
            return (
                f"Try train.micro_batches={k * more} (temporaries scale about with the rows per part) or "
                f"train.remat=true, then check: trm compile-check {exp_id} --set train.micro_batches={k * more}"
            )
    return (
        f"Even its arguments ({_gib(fixed)}) leave too little room: try train.remat=true and more "
        f"train.micro_batches, or a larger slice; check with trm compile-check {exp_id} --set ..."
    )


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def table(ids: list[str], overrides: list[str], chip: Accelerator, cache: Path) -> str:
    """A Markdown table, one row per experiment, of the figures kept in `cache` ("not compiled yet" where none are)."""
    rows = [
        "| experiment | step | train HBM/chip | train step (roofline) | MFU at most | eval HBM/chip | eval step "
        "| compile (train + eval) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    first = {}
    for exp_id in ids:
        config = load_config(experiment_path(exp_id), overrides)
        key = step_hash(config)
        shared = first.setdefault(key, exp_id)
        step = key if shared == exp_id else f"= {shared}"
        path = Path(step_figures(cache, config))
        if not path.exists():
            rows.append(f"| {exp_id} | {step} | not compiled yet | | | | | |")
            continue
        figures = storage.read_json(str(path), "missing", COMPILE_AGAIN)
        train, evaluation = figures["train"], figures["eval"]
        fits = "" if total_bytes(train) <= chip.hbm_bytes else " **does not fit**"
        rows.append(
            f"| {exp_id} | {step} | {total_bytes(train) / GIB:.1f} GiB{fits} "
            f"| {1e3 * roofline_seconds(train, chip):.0f} ms ({_bound(train, chip)}) | {100 * mfu(train, chip):.0f}% "
            f"| {total_bytes(evaluation) / GIB:.1f} GiB | {1e3 * roofline_seconds(evaluation, chip):.0f} ms "
            + (
                f"| {train['compile_seconds']:.0f} + {evaluation['compile_seconds']:.0f} s |"
                if shared == exp_id
                else "| |"
            )
        )
    return "\n".join(rows)


def _bound(step: dict, chip: Accelerator) -> str:
    """What bounds the roofline time: the FLOPs at peak or the bytes at full HBM bandwidth."""
    compute = step["flops"] / chip.peak_flops
    return "FLOPs" if compute >= step["bytes_accessed"] / chip.hbm_bytes_per_second else "HBM"

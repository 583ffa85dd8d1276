"""TPU facts, defined once: each supported slice's topology and hosts, and a chip's HBM, peak FLOP/s and bandwidth.

Used by `trm compile-check` (compiling for a slice's topology on this machine) and by the plan's chip-hours
(trm/study/estimate.py). Also the part of a run config a compiled train or evaluation step depends on
(`step_config`): experiments that differ only in learning rate, epochs, seeds or data size share one compile.
No JAX import here: the workflow's dry run reads this module.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from trm.config import hashed_form
from trm.errors import UserError

GIB = 2**30


@dataclass(frozen=True)
class Accelerator:
    """One slice type. A "device" is what JAX sees: a v4 chip in megacore mode (its two TensorCores as one)."""

    name: str  # the Cloud TPU accelerator type, e.g. "v4-64"
    topology: str  # for jax.experimental.topologies.get_topology_desc, e.g. "v4:2x4x4"
    chips: int
    chips_per_host_bounds: tuple[int, int, int]
    chip_config: str  # "megacore": one JAX device per chip
    hbm_bytes: int  # per chip
    peak_flops: float  # per chip, bf16 matmul FLOP/s
    hbm_bytes_per_second: float  # per chip

    @property
    def hosts(self) -> int:
        per_host = (
            self.chips_per_host_bounds[0] * self.chips_per_host_bounds[1] * self.chips_per_host_bounds[2]
        )
        return self.chips // per_host


def _v4(chips: int, topology: str) -> Accelerator:
    # TPU v4: 32 GiB HBM2 per chip at 1.2 TB/s, 275 TFLOP/s bf16; 4 chips (2x2x1) per host.
    return Accelerator(
        f"v4-{2 * chips}", f"v4:{topology}", chips, (2, 2, 1), "megacore", 32 * GIB, 275e12, 1.2e12
    )


# Cloud TPU v4 names count TensorCores (two per chip): a v4-64 is 32 chips.
ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (_v4(4, "2x2x1"), _v4(8, "2x2x2"), _v4(16, "2x2x4"), _v4(32, "2x4x4"), _v4(64, "4x4x4"))
}


def accelerator(name: str) -> Accelerator:
    if name not in ACCELERATORS:
        raise UserError(f"unknown accelerator {name!r}: supported are {', '.join(ACCELERATORS)}")
    return ACCELERATORS[name]


def step_config(config: dict) -> dict:
    """What the compiled train and evaluation steps of a run config depend on: the board (the sequence's length),
    the architecture (but not the exploration probability, an input of the step), the optimizer's kind and EMA,
    the batch and how it is split. Learning rates, schedules, epochs, seeds and data sizes change constants or the
    number of steps, not the program's shapes, memory or FLOPs. Keys added later are left out at their neutral
    values (trm/config/load.py ADDED_KEYS), as in the run's hash."""
    arch = {k: v for k, v in hashed_form(config)["arch"].items() if k != "halt_exploration_prob"}
    optim = {k: config["optim"][k] for k in ("optimizer", "ema")}
    train = {k: config["train"][k] for k in ("global_batch_size", "micro_batches", "remat")}
    return {"data": {"board": config["data"]["board"]}, "arch": arch, "optim": optim, "train": train}


# The source the compiled steps are built from (the model, the ACT step, loss, optimizers, EMA, the train and
# evaluation steps and their sharding), relative to the trm package: a change to it can change the program.
STEP_SOURCES = (
    "model",
    "train/step.py",
    "train/loss.py",
    "train/optim.py",
    "train/ema.py",
    "train/evaluator.py",
    "run/distributed.py",
)
PACKAGE = Path(__file__).resolve().parents[1]


def step_hash(config: dict) -> str:
    """First 12 hex digits of the sha256 of `step_config` and of the step's source code (`STEP_SOURCES`): the
    name of a compile's cached figures, so a code change that can change the program is compiled again."""
    text = json.dumps(step_config(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode() + _installed_step_source_digest()).hexdigest()[:12]


# What to do about a damaged file of figures: compile the step again.
COMPILE_AGAIN = (
    "delete it and compile again (snakemake --cores 1 compile_check, or trm compile-check --cache FOLDER)"
)


def step_figures(folder: str | Path, config: dict) -> str:
    """Where `trm compile-check` keeps the figures of `config`'s steps in `folder`: FOLDER/<step hash>.json (this
    machine's compile cache, the repository's config/compiled/ACCELERATOR). The folder stays as spelled: the
    workflow's compile rules look their outputs up by this text."""
    return os.path.join(folder, f"{step_hash(config)}.json")


@functools.cache
def _installed_step_source_digest() -> bytes:
    return step_source_digest(PACKAGE)


def step_source_digest(package: Path) -> bytes:
    """sha256 of the `STEP_SOURCES` files under `package` (their paths and contents)."""
    digest = hashlib.sha256()
    for name in STEP_SOURCES:
        path = package / name
        for source in sorted(path.glob("*.py")) if path.is_dir() else [path]:
            digest.update(source.relative_to(package).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.digest()

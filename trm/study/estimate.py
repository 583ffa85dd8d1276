"""Planned cost of a run from its own FLOPs and batch: parameters, training and evaluation FLOPs, accelerator-hours.

Training: `steps x global_batch_size x` the FLOPs of one supervision step of one example (forward of all
recursions, backward of the last; trm/model/flops.py). Evaluation: after every `eval_interval` epochs,
`eval_steps` forward supervision steps on each test puzzle (the intermediate ones on `eval_subset` puzzles).
Accelerator-hours = FLOPs / (peak FLOP/s per device x utilization) / 3600; the number of devices changes the
wall time, not the device-hours. Compilation and input pipeline time are not included.

Where `trm compile-check` has compiled a run's steps for the slice (the workflow's `compile_check` target),
`compiled_step_seconds` gives their roofline times instead, and `compiled_run_hours` the run's chip-hours at
those times: a best case, as a roofline is (docs/tpu.md), where the assumed utilization is a guess.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def training_steps(config: dict) -> int:
    """Optimizer steps of a run, as the trainer counts them (whole batches per evaluation interval)."""
    train = config["train"]
    per_interval = (config["data"]["train_puzzles"] * train["eval_interval"]) // train["global_batch_size"]
    return (train["epochs"] // train["eval_interval"]) * per_interval


def model_costs(config: dict) -> dict:
    """Parameter count and per-example FLOPs of one training and one evaluation supervision step."""
    from trm.data.format import sudoku_metadata
    from trm.model.config import ModelConfig  # imports JAX: only when a cost is not cached
    from trm.model.flops import count_params, flops_per_example_step, forward_flops_per_example_step

    model = ModelConfig.from_dict(config["arch"], sudoku_metadata(1))
    return {
        "parameter_count": count_params(model),
        "train_flops_per_example_step": flops_per_example_step(model),
        "eval_flops_per_example_step": forward_flops_per_example_step(model),
    }


def run_flops(config: dict, costs: dict, test_puzzles: int) -> float:
    """Training plus evaluation FLOPs of one run."""
    train = config["train"]
    training = training_steps(config) * train["global_batch_size"] * costs["train_flops_per_example_step"]
    evaluated = evaluated_puzzles(config, test_puzzles)
    return float(training + evaluated * train["eval_steps"] * costs["eval_flops_per_example_step"])


def evaluated_puzzles(config: dict, test_puzzles: int, batch_size: int = 1) -> int:
    """Test puzzles evaluated over a run (intermediate evaluations on the subset, the final one on all), or
    with `batch_size` the batches of that many rows they take (each evaluation's last batch padded)."""
    train = config["train"]
    evaluations = train["epochs"] // train["eval_interval"]
    subset = test_puzzles if train["eval_subset"] is None else min(train["eval_subset"], test_puzzles)
    return (evaluations - 1) * -(-subset // batch_size) + -(-test_puzzles // batch_size)


def accelerator_hours(flops: float, peak_flops: float, utilization: float) -> float:
    """Device-hours to execute `flops` at `utilization` of `peak_flops` per device."""
    return flops / (peak_flops * utilization) / 3600.0


class CostCache:
    """`model_costs` per config hash, kept in a JSON file so that planning needs no JAX import once warm."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.entries: dict[str, dict] = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.changed = False

    def costs(self, config_hash: str, config: dict) -> dict:
        if config_hash not in self.entries:
            self.entries[config_hash] = model_costs(config)
            self.changed = True
        return self.entries[config_hash]

    def save(self) -> None:
        """Write the file if anything was added (atomically: a concurrent reader sees the old or new file)."""
        if not self.changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        with os.fdopen(fd, "w") as stream:
            json.dump(self.entries, stream, indent=1, sort_keys=True)
        os.replace(tmp, self.path)
        self.changed = False


def compiled_step_seconds(config: dict, compile_dir: str | Path) -> dict | None:
    """{"train": s, "eval": s}: roofline seconds of one train step and one evaluation step (a batch of
    global_batch_size rows) from the figures `trm compile-check --cache compile_dir` kept for this config's
    step, or None when it has not been compiled."""
    from trm.launch.accelerators import accelerator, step_hash
    from trm.launch.compile_check import roofline_seconds

    path = Path(compile_dir) / f"{step_hash(config)}.json"
    if not path.exists():
        return None
    figures = json.loads(path.read_text())
    chip = accelerator(figures["accelerator"])
    return {step: roofline_seconds(figures[step], chip) for step in ("train", "eval")}


def compiled_run_hours(config: dict, seconds: dict, devices: int, test_puzzles: int) -> float:
    """Device-hours of a run whose steps take `seconds` (compiled_step_seconds) on each of `devices`."""
    train = config["train"]
    batches = evaluated_puzzles(config, test_puzzles, train["global_batch_size"])
    wall = training_steps(config) * seconds["train"] + batches * train["eval_steps"] * seconds["eval"]
    return wall * devices / 3600.0

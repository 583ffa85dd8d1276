"""Planned cost of a run from its own FLOPs and batch: parameters, training and evaluation FLOPs, accelerator-hours.

Training: `steps x global_batch_size x` the FLOPs of one supervision step of one example (forward of all
recursions, backward of the last; trm/model/flops.py). Evaluation, as the trainer runs it (`evaluation_passes`): at
the end of every `eval_interval` epochs but the last, `eval_steps` forward supervision steps on each of the first
`eval_subset` test puzzles; at the end (trm/train/test_time.py), one pass over the whole test split to the largest
of `eval_steps` and the test-time step counts (the smaller counts are recorded on the way), or, with a test-time
subset, one pass over the whole split to `eval_steps` and one over the subset to the largest count; then, with
test-time trajectories (trm/train/sampled.py), one pass per K over the same rows to the largest count, K rows per
puzzle in batches of about global_batch_size rows. Every row of a batch is computed, so the puzzles are rounded up
to whole batches.
Accelerator-hours = FLOPs / (peak FLOP/s per device x utilization) / 3600, and at least `accelerator.step_floor_s`
per step and device where it is set (a GPU's launch-bound small steps); the number of devices changes the
wall time, not the device-hours. Compilation and input pipeline time are not included.

Where `trm compile-check` has compiled a run's steps for the slice (the workflow's `compile_check` target),
`compiled_step_seconds` gives their roofline times instead, and `compiled_run_hours` the run's chip-hours at
those times: a best case, as a roofline is (docs/tpu.md), where the assumed utilization is a guess.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from trm import storage
from trm.config import evaluation_batch, training_steps
from trm.train.sampling import puzzles_per_batch


def model_costs(config: dict) -> dict:
    """Parameter count and per-example FLOPs of one training and one evaluation supervision step."""
    from trm.model.config import ModelConfig  # imports JAX: only when a cost is not cached
    from trm.model.flops import count_params, flops_per_example_step, forward_flops_per_example_step

    model = ModelConfig.planned(config)
    return {
        "parameter_count": count_params(model),
        "train_flops_per_example_step": flops_per_example_step(model),
        "eval_flops_per_example_step": forward_flops_per_example_step(model),
    }


def training_flops(config: dict, costs: dict) -> float:
    """FLOPs of a run's training steps."""
    return float(
        training_steps(config) * config["train"]["global_batch_size"] * costs["train_flops_per_example_step"]
    )


def _evaluation_batches(
    config: dict,
    test_puzzles: int,
    test_time_steps: Sequence[int],
    devices: int,
    test_time_subset: int | None,
    trajectories: Sequence[int] = (),
) -> dict[str, tuple]:
    """Each of the trainer's evaluations of a run as (evaluations, batches, rows per batch, supervision steps).
    Every row of a batch is computed; fewer puzzles than one batch run in one batch just large enough for them on
    `devices` (trm/train/evaluator.py). "sampled": every K's pass of `trajectories` together (its rows per batch a
    mean over them)."""
    train = config["train"]
    subset = test_puzzles if train["eval_subset"] is None else min(train["eval_subset"], test_puzzles)
    longest = max((train["eval_steps"], *test_time_steps))
    # As the trainer decides (trm/train/test_time.py, curve_rows): a subset smaller than the split, if any curve.
    on_subset = bool(test_time_steps) and test_time_subset is not None and test_time_subset < test_puzzles
    passes = {
        "intermediate": (train["epochs"] // train["eval_interval"] - 1, subset, train["eval_steps"]),
        "final": (1, test_puzzles, train["eval_steps"] if on_subset else longest),
        "test_time": (1, test_time_subset, longest) if on_subset else (0, 0, 0),
    }
    batched = {}
    for name, (count, puzzles, steps) in passes.items():
        rows = evaluation_batch(train["global_batch_size"], puzzles, devices) if puzzles else 0
        batched[name] = (count, math.ceil(puzzles / rows) if rows else 0, rows, steps)
    # The sampled recursion (trm/train/final_evaluation.py): the curve's rows, K rows per puzzle, to the largest count.
    sampled = test_time_subset if on_subset else test_puzzles
    per_batch = [puzzles_per_batch(train["global_batch_size"], k, sampled, devices) for k in trajectories]
    batches = [math.ceil(sampled / p) for p in per_batch]
    rows = sum(b * p * k for b, p, k in zip(batches, per_batch, trajectories, strict=True))
    batched["sampled"] = (1, sum(batches), rows / sum(batches), longest) if trajectories else (0, 0, 0, 0)
    return batched


def evaluation_passes(
    config: dict,
    test_puzzles: int,
    test_time_steps: Sequence[int],
    devices: int = 1,
    test_time_subset: int | None = None,
    trajectories: Sequence[int] = (),
) -> dict[str, tuple]:
    """The trainer's evaluations of a run, each as (evaluations, rows, supervision steps): "intermediate" (on
    `eval_subset` puzzles), "final" (the whole test split), "test_time" (the test-time curve on
    `test_time_subset` puzzles, trm/train/test_time.py: 0 evaluations when the final pass scores the curve, to the
    largest count, on the whole split) and "sampled" (the curve's rows again, K rows per puzzle for each K of
    `trajectories`; 0 evaluations without). Rows are whole batches (`_evaluation_batches`)."""
    passes = _evaluation_batches(
        config, test_puzzles, test_time_steps, devices, test_time_subset, trajectories
    )
    return {
        name: (count, round(batches * rows), steps) for name, (count, batches, rows, steps) in passes.items()
    }


def evaluation_batch_steps(
    config: dict,
    test_puzzles: int,
    test_time_steps: Sequence[int],
    devices: int = 1,
    test_time_subset: int | None = None,
    trajectories: Sequence[int] = (),
) -> int:
    """Supervision steps of whole evaluation batches over a run's evaluations: what a per-step floor prices."""
    passes = _evaluation_batches(
        config, test_puzzles, test_time_steps, devices, test_time_subset, trajectories
    ).values()
    return sum(count * batches * steps for count, batches, _, steps in passes)


def describe_evaluation(passes: dict[str, tuple], test_time_steps: Sequence[int]) -> str:
    """`evaluation_passes` in words, for the plan's per-job estimate."""
    count, rows, steps = passes["intermediate"]
    _, final_rows, final_steps = passes["final"]
    text = f"{count} x {rows} rows x {steps} steps during training, {final_rows} rows x {final_steps} steps at the end"
    counts = ",".join(map(str, test_time_steps))
    curves, curve_rows, curve_steps = passes["test_time"]
    if not curves:
        text = f"{text} (every test_time_steps count {counts} in one pass)"
    else:
        text = (
            f"{text}, then {curve_rows} rows x {curve_steps} steps on the test-time subset (counts {counts})"
        )
    sampled, sampled_rows, sampled_steps = passes.get("sampled", (0, 0, 0))
    return (
        f"{text}, then {sampled_rows} rows x {sampled_steps} steps sampling trajectories" if sampled else text
    )


def evaluation_flops(
    config: dict,
    costs: dict,
    test_puzzles: int,
    test_time_steps: Sequence[int],
    devices: int = 1,
    test_time_subset: int | None = None,
    trajectories: Sequence[int] = (),
) -> float:
    """FLOPs of a run's evaluations (`evaluation_passes`): forward supervision steps of every row evaluated."""
    passes = evaluation_passes(config, test_puzzles, test_time_steps, devices, test_time_subset, trajectories)
    passes = passes.values()
    return float(
        sum(count * rows * steps for count, rows, steps in passes) * costs["eval_flops_per_example_step"]
    )


def accelerator_hours(
    flops: float, peak_flops: float, utilization: float, steps: int = 0, step_floor_s: float | None = None
) -> float:
    """Device-hours to execute `flops` at `utilization` of `peak_flops` per device; with `step_floor_s`, at least
    that many seconds for each of `steps` device-steps (a step's count x its devices: small shapes are bound by
    dispatch, not FLOPs)."""
    seconds = flops / (peak_flops * utilization)
    if step_floor_s:
        seconds = max(seconds, steps * step_floor_s)
    return seconds / 3600.0


class CostCache:
    """`model_costs` per config hash, kept in a JSON file so that planning needs no JAX import once warm."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            try:
                self.entries = storage.read_json(str(self.path), "missing", "computing the costs again")
            except storage.DamagedFile as err:  # a cache: what it held is computed again, and rewritten
                print(err, file=sys.stderr)
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
        storage.write_text(str(self.path), json.dumps(self.entries, indent=1, sort_keys=True))
        self.changed = False


def compiled_step_seconds(config: dict, compile_dir: str | Path) -> dict | None:
    """{"train": s, "eval": s}: roofline seconds of one train step and one evaluation step (a batch of
    global_batch_size rows) from the figures `trm compile-check --cache compile_dir` kept for this config's
    step, or None when it has not been compiled."""
    from trm.launch.accelerators import COMPILE_AGAIN, accelerator, step_figures
    from trm.launch.compile_check import roofline_seconds

    path = Path(step_figures(compile_dir, config))
    if not path.exists():
        return None
    figures = storage.read_json(str(path), "missing", COMPILE_AGAIN)
    chip = accelerator(figures["accelerator"])
    return {step: roofline_seconds(figures[step], chip) for step in ("train", "eval")}


def compiled_run_hours(
    config: dict,
    seconds: dict,
    devices: int,
    test_puzzles: int,
    test_time_steps: Sequence[int],
    test_time_subset: int | None = None,
    trajectories: Sequence[int] = (),
) -> dict[str, float]:
    """Device-hours of a run's training and of its evaluations (`evaluation_passes`) when its steps take `seconds`
    (compiled_step_seconds: the eval step for a batch of global_batch_size rows) on each of `devices`; a batch
    smaller than that counts as its fraction of the compiled one."""
    batch = config["train"]["global_batch_size"]
    passes = evaluation_passes(config, test_puzzles, test_time_steps, devices, test_time_subset, trajectories)
    passes = passes.values()
    evaluation = sum(count * rows / batch * steps for count, rows, steps in passes) * seconds["eval"]
    training = training_steps(config) * seconds["train"]
    return {"training": training * devices / 3600.0, "evaluation": evaluation * devices / 3600.0}

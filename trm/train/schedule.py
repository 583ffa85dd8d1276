"""Schedules of a training run: learning rate, recursion-depth curriculum (contrib01) and
halting-exploration anneal (contrib02).

Step convention: `step` is the 1-based index of the optimizer update being made, so the first update uses
step 1 (the original increments its counter before use, giving lr = base/warmup on the first update).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax.numpy as jnp

from trm.errors import UserError


def lr_at(step: int, base_lr: float, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Learning rate for the update numbered `step` (1 = first), in float64 on the host as the original computes
    it (a Python float); the train step takes it, rounded to float32, as an input.

    Linear warm-up base*step/warmup while step < warmup, then a cosine from base down to base*min_ratio at
    total_steps (min_ratio 1.0 = constant). Progress is clipped to [0, 1]: the original never runs an update
    past total_steps, and when total_steps <= warmup there is no decay span, so the rate stays at base
    for step == warmup and at base*min_ratio afterwards. warmup_steps = 0 means no warm-up.
    """
    if step < warmup_steps:
        return base_lr * float(step) / float(max(1, warmup_steps))
    progress = min(max(float(step - warmup_steps) / float(max(1, total_steps - warmup_steps)), 0.0), 1.0)
    return base_lr * (min_ratio + max(0.0, (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))))


def make_lr_schedule(
    base_lr: float, warmup_steps: int, total_steps: int, min_ratio: float
) -> Callable[[int], float]:
    """`lr_at` with its constants bound: a function step (1-based) -> learning rate."""
    if warmup_steps < 0 or total_steps < 0:
        raise UserError(f"lr schedule: warm-up ({warmup_steps}) and total steps ({total_steps}) must be >= 0")
    return lambda step: lr_at(step, base_lr, warmup_steps, total_steps, min_ratio)


def cycles_at(epoch: float, config: dict) -> tuple[int, int]:
    """(H_cycles, L_cycles) to train with at `epoch` (fractional epochs allowed), contrib01.

    With `schedules.curriculum.enabled`, each of H and L follows the floor of a linear ramp from
    (start_H_cycles, start_L_cycles) at epoch 0 to the architecture's (H_cycles, L_cycles) at
    `schedules.curriculum.epochs`, and stays there afterwards: integer valued, monotone, exactly the
    architecture's values from the end of the ramp on. Disabled, it always returns the architecture's values.

    Evaluated on the host once per step: the value picks a compiled train step (the recursion depth is static).
    A ramp takes at most (H_cycles - start_H) + (L_cycles - start_L) + 1 distinct values (5 for the study's
    (1, 2) -> (3, 6), where H and L step together at mid-ramp), so only a handful of compilations occur.
    """
    arch, curriculum = config["arch"], config["schedules"]["curriculum"]
    final_h, final_l = int(arch["H_cycles"]), int(arch["L_cycles"])
    if not curriculum["enabled"]:
        return final_h, final_l
    start_h, start_l = int(curriculum["start_H_cycles"]), int(curriculum["start_L_cycles"])
    for field, start, final in (("start_H_cycles", start_h, final_h), ("start_L_cycles", start_l, final_l)):
        if not 1 <= start <= final:
            raise UserError(
                f"schedules.curriculum.{field} = {start}: must be between 1 and the architecture's value {final}"
            )
    ramp_epochs = float(curriculum["epochs"])
    if ramp_epochs < 0:
        raise UserError(f"schedules.curriculum.epochs = {curriculum['epochs']}: must be >= 0")
    fraction = 1.0 if ramp_epochs == 0 else min(max(float(epoch), 0.0) / ramp_epochs, 1.0)
    return (
        start_h + math.floor((final_h - start_h) * fraction),
        start_l + math.floor((final_l - start_l) * fraction),
    )


def halt_exploration_at(step, total_steps: int, config: dict) -> jnp.ndarray:
    """Probability of random halting exploration after `step` optimizer steps (0 = start), contrib02.

    With `schedules.halt_exploration.enabled`, a linear anneal from `start` at step 0 to `end` at total_steps
    (held at `end` afterwards); otherwise the constant `arch.halt_exploration_prob`. Returns a float32 scalar
    and accepts a traced step: pass the result into the compiled step as an array argument, so changing it
    never recompiles.
    """
    anneal = config["schedules"]["halt_exploration"]
    if not anneal["enabled"]:
        return jnp.asarray(config["arch"]["halt_exploration_prob"], jnp.float32)
    fraction = jnp.clip(jnp.asarray(step, jnp.float32) / max(float(total_steps), 1.0), 0.0, 1.0)
    return jnp.asarray(anneal["start"] + (anneal["end"] - anneal["start"]) * fraction, jnp.float32)

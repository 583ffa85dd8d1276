"""Cross-field rules the schema cannot express, each stated once; messages name the keys and where they were set.

`batch_split_problem` is also the rule of a job's devices: the trainer applies it to its mesh, and the study's dry
run to the devices its launch settings give each job, without importing JAX. `evaluation_batch` is the evaluator's
batch, which the dry run's estimate counts the same way.
"""

from __future__ import annotations

from typing import Any

from trm.config.schema import text


def config_value(config: dict, dotted: str) -> Any:
    """The value of a dotted key, e.g. config_value(config, "arch.hidden_size"): the one lookup of a dotted key in
    run configs and workflow settings (KeyError or TypeError where a part is missing)."""
    for key in dotted.split("."):
        config = config[key]
    return config


def set_config_value(config: dict, dotted: str, value: Any) -> None:
    """Set the existing dotted key of `config` in place."""
    *path, leaf = dotted.split(".")
    section = config_value(config, ".".join(path)) if path else config
    section[leaf] = value


def steps_per_interval(puzzles: int, eval_interval: int, batch: int) -> int:
    """Optimizer steps of one evaluation interval: the whole batches of `eval_interval` epochs over `puzzles`
    training puzzles (an epoch draws one augmentation of each puzzle)."""
    return (puzzles * eval_interval) // batch


def training_steps(config: dict, puzzles: int | None = None) -> int:
    """Optimizer steps of a run, the one count the trainer, the plan and the costs use: whole evaluation intervals.
    `puzzles`: the train split's puzzle count (default data.train_puzzles, which a run's dataset must match)."""
    train = config["train"]
    puzzles = config["data"]["train_puzzles"] if puzzles is None else puzzles
    per_interval = steps_per_interval(puzzles, train["eval_interval"], train["global_batch_size"])
    return (train["epochs"] // train["eval_interval"]) * per_interval


def batch_split_problem(train: dict, devices: int) -> str | None:
    """Why `devices` cannot train the config's batch, or None when they can: every device must get the same whole
    number of rows of every micro-batch."""
    batch, parts = train["global_batch_size"], train["micro_batches"]
    if batch % (parts * devices) == 0:
        return None
    return (
        f"train.global_batch_size={batch} must be divisible by train.micro_batches ({parts}) x the number of "
        f"devices ({devices}) = {parts * devices}"
    )


def eval_batch_size(train: dict, devices: int) -> int:
    """Rows per evaluation batch of a run's `train` section on `devices`: train.eval_batch_size (null: the
    training batch), rounded up so that every device gets the same number of rows."""
    rows = train.get("eval_batch_size") or train["global_batch_size"]
    return -(-rows // devices) * devices


def evaluation_batch(batch_size: int, puzzles: int, devices: int) -> int:
    """Rows per evaluation batch: `batch_size`, but fewer puzzles than one batch run in one batch just large enough
    for them on `devices` (their count rounded up to a multiple of the devices): padding rows cost as much as real
    ones."""
    return min(batch_size, -(-puzzles // devices) * devices)


def impossible_values(config: dict, origin: dict[str, str], base: str | None = None) -> list[str]:
    """Cross-field checks the schema cannot express; each message names the keys and where they were set.

    `base` is the source name of the base layer when the config was merged from layers (None for a resolved
    config): a key inherited from it may belong to a setting a later layer changed.
    """

    def ref(key: str) -> str:
        return f"{key} = {text(config_value(config, key))} (from {origin.get(key, '?')})"

    def value(key: str) -> Any:
        return config_value(config, key)

    errors = []
    if value("arch.hidden_size") % value("arch.num_heads"):
        errors.append(f"{ref('arch.hidden_size')} must be divisible by {ref('arch.num_heads')}")
    elif not value("arch.mlp_t") and value("arch.pos_encodings") == "rope":
        if (value("arch.hidden_size") // value("arch.num_heads")) % 2:
            errors.append(
                f"rotary encoding needs an even head_dim: {ref('arch.hidden_size')} / {ref('arch.num_heads')} is odd"
            )
    # The base's `none` goes with its MLP-T recipe: a later layer that turns MLP-T off must say which encoding
    # its attention uses (without positions, attention cannot tell the cells apart).
    if (
        base is not None
        and not value("arch.mlp_t")
        and value("arch.pos_encodings") == "none"
        and origin.get("arch.mlp_t") != base
        and origin.get("arch.pos_encodings") == base
    ):
        errors.append(
            f"{ref('arch.mlp_t')} selects attention, but {ref('arch.pos_encodings')} belongs to the base's MLP-T "
            "recipe: set arch.pos_encodings beside arch.mlp_t (rope, as the original's attention TRM; none or "
            "learned only on purpose)"
        )
    emb_ndim = value("arch.puzzle_emb_ndim") or value("arch.hidden_size")
    # puzzle_emb_len 0 means just enough positions, which always fits.
    if 0 < value("arch.puzzle_emb_len") * value("arch.hidden_size") < emb_ndim:
        errors.append(
            f"the puzzle embedding ({ref('arch.puzzle_emb_ndim')}) must fit in "
            f"{ref('arch.puzzle_emb_len')} positions of {ref('arch.hidden_size')}"
        )
    if batch_split_problem(config["train"], devices=1):
        errors.append(f"{ref('train.global_batch_size')} must be divisible by {ref('train.micro_batches')}")
    if value("train.epochs") % value("train.eval_interval"):
        errors.append(f"{ref('train.eval_interval')} must divide {ref('train.epochs')}")
    if value("schedules.curriculum.enabled"):
        for short in ("H_cycles", "L_cycles"):
            if value(f"schedules.curriculum.start_{short}") > value(f"arch.{short}"):
                errors.append(
                    f"{ref(f'schedules.curriculum.start_{short}')} must be <= {ref(f'arch.{short}')}"
                )
        if value("schedules.curriculum.epochs") > value("train.epochs"):
            errors.append(f"{ref('schedules.curriculum.epochs')} must be <= {ref('train.epochs')}")
    return errors

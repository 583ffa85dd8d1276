"""Print the parameter count and FLOPs of a model configuration (analytic; builds no model).

The `arch:` section of the run config (--config over config/base.yaml, then --set overrides such as
`--set arch.hidden_size=256`) defines the model. Dataset sizes default to Sudoku-Extreme's (vocab 11,
81 cells, 1 puzzle identifier). FLOPs follow trm/model/flops.py: a training step is the forward of all
recursions plus the backward of the last one; an evaluation step is forward only.
"""

from __future__ import annotations

import argparse

from trm.config import add_config_arguments, resolve_config_arguments
from trm.data.format import sudoku_metadata
from trm.errors import number
from trm.model.config import DATASET_FIELDS, ModelConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, required=False)
    sudoku = sudoku_metadata(1)
    for field in DATASET_FIELDS:
        parser.add_argument(
            f"--{field.replace('_', '-')}", type=number(int, minimum=1), default=sudoku[field]
        )
    parser.add_argument(
        "--eval-steps",
        type=number(int, minimum=1),
        default=None,
        help="supervision steps at evaluation (default: config train.eval_steps)",
    )


def main(args: argparse.Namespace) -> int:
    from trm.model.flops import count_params, flops_per_example_step, forward_flops_per_example_step

    config = resolve_config_arguments(args)
    cfg = ModelConfig.from_dict(config["arch"], {field: getattr(args, field) for field in DATASET_FIELDS})
    eval_steps = config["train"]["eval_steps"] if args.eval_steps is None else args.eval_steps
    train_flops = flops_per_example_step(cfg)
    eval_flops = forward_flops_per_example_step(cfg)
    mixer = "MLP-T" if cfg.mlp_t else f"attention ({cfg.num_heads} heads, {cfg.pos_encodings} positions)"
    rows = [
        (
            "model",
            f"TRM {mixer}, hidden {cfg.hidden_size}, {cfg.L_layers} layers, T={cfg.H_cycles}, n={cfg.L_cycles}",
        ),
        (
            "sequence",
            f"{cfg.total_len} = {cfg.prefix_len} prefix + {cfg.seq_len} cells, vocab {cfg.vocab_size}",
        ),
        ("parameters", f"{count_params(cfg):,}"),
        ("puzzle embedding (not counted)", f"{cfg.num_puzzle_identifiers * cfg.puzzle_emb_dim:,}"),
        ("train FLOPs / example / step", f"{train_flops:.4g} (forward + backward)"),
        ("eval FLOPs / example / step", f"{eval_flops:.4g} (forward)"),
        (f"eval FLOPs / puzzle ({eval_steps} steps)", f"{eval_flops * eval_steps:.4g}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0

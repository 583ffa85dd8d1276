"""Print the parameter count and FLOPs of a model configuration (analytic; builds no model).

The `arch:` section of --config (merged over config/base.yaml) and --set overrides such as
`--set arch.hidden_size=256` define the model. Dataset sizes default to Sudoku-Extreme (vocab 11,
81 cells, 1 puzzle identifier). FLOPs follow spec trm.md §13: a training step is the forward of all
recursions plus the backward of the last one; an evaluation step is forward only.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from trm.errors import UserError
from trm.model.config import ModelConfig
from trm.model.flops import count_params, flops_per_example_step, forward_flops_per_example_step

BASE_CONFIG = Path(__file__).resolve().parents[2] / "config" / "base.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, help="YAML with an arch: section (default: config/base.yaml only)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="arch.KEY=VALUE", help="override (repeatable)"
    )
    parser.add_argument("--vocab-size", type=int, default=11)
    parser.add_argument("--seq-len", type=int, default=81)
    parser.add_argument("--num-puzzle-identifiers", type=int, default=1)
    parser.add_argument(
        "--eval-steps",
        type=int,
        default=None,
        help="supervision steps at evaluation (default: config train.eval_steps)",
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: config file not found") from None
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML: {err}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict) or not isinstance(doc.get("arch", {}), dict):
        raise UserError(f"{path}: expected a mapping with an optional arch: mapping")
    return doc


def _parse_value(text: str) -> Any:
    """YAML scalar, but 1e-5 is a number (PyYAML's YAML 1.1 reads it as a string)."""
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def resolve_config(args: argparse.Namespace) -> tuple[ModelConfig, int]:
    """ModelConfig and evaluation step count from base.yaml <- --config <- --set."""
    base = _read_yaml(BASE_CONFIG)
    arch, train = dict(base.get("arch", {})), dict(base.get("train", {}))
    if args.config is not None:
        doc = _read_yaml(args.config)
        arch.update(doc.get("arch") or {})
        train.update(doc.get("train") or {})
    for item in args.set:
        key, sep, text = item.partition("=")
        section, _, field = key.partition(".")
        if not sep or section not in ("arch", "train") or not field:
            raise UserError(f"--set {item!r}: expected arch.KEY=VALUE or train.KEY=VALUE")
        {"arch": arch, "train": train}[section][field] = _parse_value(text)
    dataset = {
        "vocab_size": args.vocab_size,
        "seq_len": args.seq_len,
        "num_puzzle_identifiers": args.num_puzzle_identifiers,
    }
    eval_steps = (
        args.eval_steps
        if args.eval_steps is not None
        else train.get("eval_steps", arch.get("halt_max_steps", 16))
    )
    return ModelConfig.from_dict(arch, dataset), int(eval_steps)


def main(args: argparse.Namespace) -> int:
    cfg, eval_steps = resolve_config(args)
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

"""A tiny model on easy puzzles, for the tests that train: its settings and the data it learns from.

Plain helpers; tests/conftest.py builds the shared fixtures from them (`easy_puzzles`, `easy_dataset`,
`easy_data`, `trained`) once per session.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trm.cli import main as trm
from trm.config import BASE_CONFIG, load_config
from trm.data.board import SUDOKU, Board

# Overrides of config/base.yaml: a model that trains in seconds on 2 CPU cores, on the data of conftest's
# `easy_dataset` (48 train puzzles with 4 augmentations each), which its data settings describe.
TINY = {
    "data.train_puzzles": 48,
    "data.num_aug": 4,
    "arch.hidden_size": 32,
    "arch.num_heads": 2,
    "arch.L_layers": 1,
    "arch.H_cycles": 2,
    "arch.L_cycles": 2,
    "arch.forward_dtype": "float32",
    "train.global_batch_size": 8,
    "train.eval_subset": 8,
    "optim.lr_warmup_steps": 5,
}
# The shared trained run (conftest `trained`): 48 train groups x 4 epochs / 8 = 24 steps, one evaluation at the
# end after 2 supervision steps, one checkpoint.
TRAINED = {
    **TINY,
    "train.epochs": 4,
    "train.eval_interval": 4,
    "train.eval_steps": 2,
    "train.checkpoint_every_steps": 1000,
    "optim.lr": 1e-3,
}


def set_flags(values: dict) -> list[str]:
    """`values` as the `--set=KEY=VALUE` flags of `trm train` and `trm launch`."""
    return [f"--set={k}={v}" for k, v in values.items()]


def tiny_config(extra: dict | None = None) -> dict:
    """The resolved config of config/base.yaml with TINY and then `extra` applied."""
    return load_config(BASE_CONFIG, [f"{k}={v}" for k, v in {**TINY, **(extra or {})}.items()], base=None)


def easy_csv(path: Path, puzzles: int, blanks: int, seed: int, board: Board = SUDOKU) -> None:
    """Puzzles made from one valid grid of `board` with a few blanks: learnable by a tiny model in seconds."""
    rng = np.random.default_rng(seed)
    n, r, c = board.n, board.box_rows, board.box_cols
    # Each row shifts the one above by c, and by one more at each band: every row, column and r x c box is 1..n.
    solution = [(c * (row % r) + row // r + col) % n + 1 for row in range(n) for col in range(n)]
    answer = "".join(map(str, solution))
    lines = ["source,question,answer,rating"]
    for _ in range(puzzles):
        question = list(answer)
        for cell in rng.choice(board.cells, size=blanks, replace=False):
            question[cell] = "."
        lines.append(f"easy,{''.join(question)},{answer},0")
    path.write_text("\n".join(lines) + "\n")


def build_dataset(source: Path, out: Path, num_aug: int, board: Board | None = None) -> Path:
    """`trm build-dataset` of the puzzles in `source` into `out` (seed 3; --board when given); returns `out`."""
    args = ["build-dataset", "--source", str(source), "--num-aug", str(num_aug), "--seed", "3"]
    args += [] if board is None else ["--board", board.name]
    assert trm([*args, "--output-dir", str(out)]) == 0
    return out


def stage(built: Path, url: str) -> str:
    """`trm stage` of the dataset `built` to `url`; returns `url`."""
    assert trm(["stage", str(built), url]) == 0
    return url

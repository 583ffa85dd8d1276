"""The model's configuration: the `arch:` section of a study config plus the dataset-derived sizes."""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from trm.data.sudoku import NUM_CELLS
from trm.errors import UserError, number

DTYPES = ("float32", "bfloat16", "float16")  # forward_dtype names, each a jax.numpy dtype
DATASET_FIELDS = ("vocab_size", "seq_len", "num_puzzle_identifiers")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of one TRM: the `arch:` section of a resolved config (validated by trm/config, which also
    holds every default in config/base.yaml) plus the sizes a dataset fixes.

    `puzzle_emb_ndim=None` means hidden_size; `puzzle_emb_len=0` means ceil(puzzle_emb_ndim / hidden_size),
    as in the original. vocab_size, seq_len and num_puzzle_identifiers come from the dataset's metadata.
    """

    vocab_size: int
    seq_len: int
    num_puzzle_identifiers: int
    hidden_size: int
    num_heads: int
    expansion: float
    swiglu_multiple: int
    L_layers: int
    H_cycles: int
    L_cycles: int
    pos_encodings: str
    mlp_t: bool
    puzzle_emb_ndim: int | None
    puzzle_emb_len: int
    halt_max_steps: int
    halt_exploration_prob: float
    no_ACT_continue: bool
    rms_norm_eps: float
    rope_theta: float
    forward_dtype: str
    loss: str
    mlp_t_kernel: str  # auto | fused | plain (trm/model/mlp_t_path.py)

    @classmethod
    def from_dict(cls, arch: dict[str, Any], dataset_meta: dict[str, Any]) -> ModelConfig:
        """Build from a resolved config's `arch:` mapping and a dataset.json-like mapping (extra keys ignored)."""
        missing = [k for k in DATASET_FIELDS if k not in dataset_meta]
        if missing:
            raise UserError(f"dataset metadata lacks {', '.join(missing)}")
        return cls(**{k: dataset_meta[k] for k in DATASET_FIELDS}, **arch)

    @classmethod
    def planned(cls, config: dict[str, Any]) -> ModelConfig:
        """The model a resolved run config trains, sized for one puzzle identifier on its `data.board`: what
        planning needs (parameters, FLOPs, a compile), before any dataset exists."""
        from trm.data.board import parse_board
        from trm.data.format import sudoku_metadata

        board = parse_board(config["data"]["board"], "data.board")
        return cls.from_dict(config["arch"], sudoku_metadata(1, board))

    @property
    def dtype(self) -> Any:
        """The activation (forward) dtype, a jax.numpy dtype (imported here: reading a config needs no JAX)."""
        import jax.numpy as jnp

        return getattr(jnp, self.forward_dtype)

    @property
    def puzzle_emb_dim(self) -> int:
        """Width of one row of the puzzle-embedding table."""
        return self.hidden_size if self.puzzle_emb_ndim is None else self.puzzle_emb_ndim

    @property
    def prefix_len(self) -> int:
        """Number of prefix positions in front of the cells (16 for TRM)."""
        return self.puzzle_emb_len or math.ceil(self.puzzle_emb_dim / self.hidden_size)

    @property
    def total_len(self) -> int:
        """Sequence length inside the model: prefix + cells (97 for Sudoku)."""
        return self.prefix_len + self.seq_len

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


# The original PyTorch TRM's file conventions that import/export commands need before any JAX import
# (trm/model/torch_io.py does the conversion): the key prefix its trainer writes with torch.compile on (its
# default, and what its loader expects), and the puzzle length.
DEFAULT_EXPORT_PREFIX = "_orig_mod.model."


def add_seq_len_argument(parser: argparse.ArgumentParser, when: str) -> None:
    """`--seq-len`: the puzzle length of the data, Sudoku's by default, needed `when`."""
    parser.add_argument(
        "--seq-len",
        type=number(int, minimum=1),
        default=NUM_CELLS,
        help=f"puzzle length, {when} (default %(default)s, Sudoku)",
    )


def swiglu_width(width: int, expansion: float, multiple: int) -> int:
    """Inner width of a SwiGLU: round(expansion * width * 2/3) rounded up to a multiple of `multiple` (the
    original's 256: arch.swiglu_multiple). Here, not beside the layer, so that sizes and FLOP counts
    (trm/model/flops.py, the workflow's estimates) need no JAX."""
    inner = round(expansion * width * 2 / 3)
    return -(-inner // multiple) * multiple

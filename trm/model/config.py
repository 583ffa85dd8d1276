"""The model's configuration: the `arch:` section of a study config plus the dataset-derived sizes."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from trm.errors import UserError

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
POS_ENCODINGS = ("none", "rope", "learned")
LOSSES = ("stablemax", "softmax")
DATASET_FIELDS = ("vocab_size", "seq_len", "num_puzzle_identifiers")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of one TRM (field names and defaults as in config/base.yaml `arch:`).

    `puzzle_emb_ndim=None` means hidden_size; `puzzle_emb_len=0` means ceil(puzzle_emb_ndim / hidden_size),
    as in the original. vocab_size, seq_len and num_puzzle_identifiers come from the dataset's metadata.
    """

    vocab_size: int
    seq_len: int
    num_puzzle_identifiers: int
    hidden_size: int = 512
    num_heads: int = 8
    expansion: float = 4
    L_layers: int = 2
    H_cycles: int = 3
    L_cycles: int = 6
    pos_encodings: str = "none"
    mlp_t: bool = True
    puzzle_emb_ndim: int | None = None
    puzzle_emb_len: int = 16
    halt_max_steps: int = 16
    halt_exploration_prob: float = 0.1
    no_ACT_continue: bool = True
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    forward_dtype: str = "bfloat16"
    loss: str = "stablemax"

    def __post_init__(self) -> None:
        def fail(field: str, why: str) -> None:
            raise UserError(f"arch.{field} = {getattr(self, field)!r}: {why}")

        def is_int(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def is_number(value: Any) -> bool:
            return isinstance(value, int | float) and not isinstance(value, bool)

        positive_ints = DATASET_FIELDS + (
            "hidden_size",
            "num_heads",
            "L_layers",
            "H_cycles",
            "L_cycles",
            "halt_max_steps",
        )
        for field in positive_ints:
            if not is_int(getattr(self, field)) or getattr(self, field) < 1:
                fail(field, "must be a positive integer")
        for field in ("expansion", "halt_exploration_prob", "rms_norm_eps", "rope_theta"):
            if not is_number(getattr(self, field)):
                fail(field, "must be a number")
        if not isinstance(self.mlp_t, bool):
            fail("mlp_t", "must be true or false")
        if not self.mlp_t and self.hidden_size % self.num_heads:
            fail("hidden_size", f"must be divisible by num_heads = {self.num_heads}")
        if not self.mlp_t and self.pos_encodings == "rope" and (self.hidden_size // self.num_heads) % 2:
            fail("num_heads", "RoPE needs an even head dimension (hidden_size / num_heads)")
        if self.expansion <= 0:
            fail("expansion", "must be a positive number")
        if self.pos_encodings not in POS_ENCODINGS:
            fail("pos_encodings", f"must be one of {', '.join(POS_ENCODINGS)}")
        if self.forward_dtype not in DTYPES:
            fail("forward_dtype", f"must be one of {', '.join(DTYPES)}")
        if self.loss not in LOSSES:
            fail("loss", f"must be one of {', '.join(LOSSES)}")
        if self.puzzle_emb_ndim is not None and (
            not is_int(self.puzzle_emb_ndim) or self.puzzle_emb_ndim < 1
        ):
            fail("puzzle_emb_ndim", "must be a positive integer or null (= hidden_size)")
        if not is_int(self.puzzle_emb_len) or self.puzzle_emb_len < 0:
            fail("puzzle_emb_len", "must be a non-negative integer (0 = ceil(puzzle_emb_ndim / hidden_size))")
        if self.puzzle_emb_dim > self.prefix_len * self.hidden_size:
            fail(
                "puzzle_emb_ndim",
                f"must fit in puzzle_emb_len * hidden_size = {self.prefix_len * self.hidden_size}",
            )
        if not 0.0 <= self.halt_exploration_prob <= 1.0:
            fail("halt_exploration_prob", "must be in [0, 1]")
        if self.no_ACT_continue is not True:
            # The original's Q-continue branch crashes (spec trm.md §6); we do not reproduce it.
            fail("no_ACT_continue", "only true is supported (the original's Q-continue branch is broken)")
        if not self.rms_norm_eps > 0:
            fail("rms_norm_eps", "must be positive")
        if not self.rope_theta > 0:
            fail("rope_theta", "must be positive")

    @classmethod
    def from_dict(cls, arch: dict[str, Any], dataset_meta: dict[str, Any]) -> ModelConfig:
        """Build from a config's `arch:` mapping and a dataset.json-like mapping (extra keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(arch) - names - set(DATASET_FIELDS))
        if unknown:
            raise UserError(f"arch: unknown field(s) {', '.join(unknown)}")
        missing = [k for k in DATASET_FIELDS if k not in dataset_meta]
        if missing:
            raise UserError(f"dataset metadata lacks {', '.join(missing)}")
        return cls(**{k: dataset_meta[k] for k in DATASET_FIELDS}, **arch)

    @property
    def dtype(self) -> jnp.dtype:
        """The activation (forward) dtype."""
        return DTYPES[self.forward_dtype]

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

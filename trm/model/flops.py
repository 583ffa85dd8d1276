"""Analytic parameter count and FLOPs of a TRM configuration.

FLOP conventions (§13): a [m, k] x [k, n] matmul costs 2mkn; elementwise work (norms, activations, RoPE,
softmax, residuals) and embedding lookups are ignored; backward costs twice the forward of the
differentiated part. The lm_head is counted on all S positions as in the spec (ours runs on the cells only).
"""

from __future__ import annotations

from trm.model.config import ModelConfig, swiglu_width


def count_params(cfg: ModelConfig) -> int:
    """Trained parameters (what the original logs as num_params): no puzzle embedding, no H/L init."""
    width, length = cfg.hidden_size, cfg.total_len
    if cfg.mlp_t:
        inner = swiglu_width(length, cfg.expansion, cfg.swiglu_multiple)
        mixer = length * 2 * inner + inner * length
    else:
        mixer = width * 3 * width + width * width
    inner = swiglu_width(width, cfg.expansion, cfg.swiglu_multiple)
    block = mixer + width * 2 * inner + inner * width
    heads = cfg.vocab_size * width + width * cfg.vocab_size + (width * 2 + 2)  # embed, lm_head, q_head
    pos = length * width if cfg.pos_encodings == "learned" else 0
    return cfg.L_layers * block + heads + pos


def net_flops(cfg: ModelConfig) -> int:
    """Forward FLOPs of one call of the net (all L_layers blocks) on one sequence."""
    width, length = cfg.hidden_size, cfg.total_len
    if cfg.mlp_t:
        inner = swiglu_width(length, cfg.expansion, cfg.swiglu_multiple)
        mixer = width * (2 * length * 2 * inner + 2 * inner * length)
    else:
        projections = length * (2 * width * 3 * width + 2 * width * width)
        mixer = projections + 2 * (2 * length * length * width)  # QK^T and AV
    inner = swiglu_width(width, cfg.expansion, cfg.swiglu_multiple)
    channel = length * (2 * width * 2 * inner + 2 * inner * width)
    return cfg.L_layers * (mixer + channel)


def head_flops(cfg: ModelConfig) -> int:
    """Forward FLOPs of the lm_head (all positions) and q_head for one sequence."""
    return 2 * cfg.hidden_size * cfg.vocab_size * cfg.total_len + 2 * cfg.hidden_size * 2


def forward_flops_per_example_step(
    cfg: ModelConfig, H_cycles: int | None = None, L_cycles: int | None = None
) -> int:
    """Forward-only FLOPs of one supervision step for one example (an evaluation step)."""
    H_cycles = cfg.H_cycles if H_cycles is None else H_cycles
    L_cycles = cfg.L_cycles if L_cycles is None else L_cycles
    return H_cycles * (L_cycles + 1) * net_flops(cfg) + head_flops(cfg)


def flops_per_example_step(cfg: ModelConfig, H_cycles: int | None = None, L_cycles: int | None = None) -> int:
    """Training FLOPs of one supervision step for one example: forward of all recursions plus backward
    (2x forward) of the last recursion and the heads. 42.7 GFLOP for the Sudoku MLP-T baseline."""
    L_cycles = cfg.L_cycles if L_cycles is None else L_cycles
    backward = 2 * ((L_cycles + 1) * net_flops(cfg) + head_flops(cfg))
    return forward_flops_per_example_step(cfg, H_cycles, L_cycles) + backward


def mlp_t_recompute_flops_per_example_step(cfg: ModelConfig, L_cycles: int | None = None) -> int:
    """FLOPs a TPU train step runs beyond flops_per_example_step for one example, not model FLOPs: the fused
    MLP-T kernel's backward (trm/model/mlp_t_kernel.py) recomputes gate|up in each differentiated MLP-T call
    (L_cycles + 1 net calls of L_layers blocks) instead of saving it. 1.42 GFLOP for the Sudoku baseline."""
    if not cfg.mlp_t:
        return 0
    L_cycles = cfg.L_cycles if L_cycles is None else L_cycles
    inner = swiglu_width(cfg.total_len, cfg.expansion, cfg.swiglu_multiple)
    return (L_cycles + 1) * cfg.L_layers * cfg.hidden_size * 2 * cfg.total_len * 2 * inner

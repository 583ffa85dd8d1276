"""The Tiny Recursive Model: input embedding, the shared net, the T x (n + 1) recursion and the two heads.

State is split three ways (see `split_state`):
- `nnx.Param`: everything trained by the main optimizer and tracked by the EMA (these are the counted
  parameters);
- `PuzzleEmbedding`: the [num_puzzle_identifiers, puzzle_emb_ndim] table, trained by its own sign-SGD,
  excluded from Adam and the EMA;
- `Buffer`: H_init and L_init, frozen start states, saved but never trained. They are stored as float32, so
  that an imported start state keeps its values; freshly drawn ones are rounded to bfloat16 (see TRM).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from trm.model.config import ModelConfig
from trm.model.layers import Block, Linear, rope_tables, trunc_normal


class PuzzleEmbedding(nnx.Variable):
    """The puzzle-embedding table (zero init): its own sign-SGD optimizer, no Adam, no EMA."""


class Buffer(nnx.Variable):
    """Frozen state saved with the model but never trained (H_init, L_init)."""


class TRM(nnx.Module):
    """TRM inner model (one supervision step of recursion); the ACT loop lives in trm.model.act."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        width = cfg.hidden_size
        self.embed_tokens = nnx.Param(
            trunc_normal(rngs.params(), (cfg.vocab_size, width), 1 / math.sqrt(width))
        )
        self.puzzle_emb = PuzzleEmbedding(
            jnp.zeros((cfg.num_puzzle_identifiers, cfg.puzzle_emb_dim), jnp.float32)
        )
        if cfg.pos_encodings == "learned":
            self.embed_pos = nnx.Param(
                trunc_normal(rngs.params(), (cfg.total_len, width), 1 / math.sqrt(width))
            )
        self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.L_layers)])
        self.lm_head = Linear(width, cfg.vocab_size, rngs=rngs)
        # Both Q logits (halt, continue) start at -5: halting is rare until the head learns.
        self.q_head = Linear(width, 2, rngs=rngs, bias=True)
        self.q_head.weight[...] = jnp.zeros_like(self.q_head.weight[...])
        self.q_head.bias[...] = jnp.full((2,), -5.0, jnp.float32)
        # Rounded to bfloat16 as the original stores them at its default forward dtype, so a float32 run
        # starts from the same vectors as a bfloat16 one; held in float32 for imported float32 values.
        self.H_init = Buffer(_bfloat16_values(trunc_normal(rngs.params(), (width,), 1.0)))
        self.L_init = Buffer(_bfloat16_values(trunc_normal(rngs.params(), (width,), 1.0)))

    def input_embeddings(self, inputs: jax.Array, puzzle_identifiers: jax.Array) -> jax.Array:
        """[B, seq_len] tokens and [B] puzzle ids -> x [B, prefix + seq_len, D] in the forward dtype.

        The looked-up puzzle vector is right-padded with zeros to prefix_len * D, so only the first prefix
        position carries it (for ndim = D); the other prefix positions are zero-input register tokens.
        """
        cfg, dtype = self.cfg, self.cfg.dtype
        # Gather (and broadcast) the float32 tables, then cast: the backward pass then sums each table row's
        # gradients over the batch and sequence in float32, as PyTorch's embedding backward does. Casting the
        # table first would scatter-add them in the forward dtype (in bfloat16 a sum stops growing at 256
        # equal terms). The forward values are the same either way.
        tokens = self.embed_tokens[...][inputs].astype(dtype)
        puzzle = self.puzzle_emb[...][puzzle_identifiers].astype(dtype)
        puzzle = jnp.pad(puzzle, ((0, 0), (0, cfg.prefix_len * cfg.hidden_size - cfg.puzzle_emb_dim)))
        x = jnp.concatenate([puzzle.reshape(-1, cfg.prefix_len, cfg.hidden_size), tokens], axis=1)
        if cfg.pos_encodings == "learned":
            positions = jnp.broadcast_to(self.embed_pos[...], x.shape).astype(dtype)
            x = 0.707106781 * (x + positions)  # keeps the variance of the sum
        return x * math.sqrt(cfg.hidden_size)

    def net(self, h: jax.Array, injection: jax.Array) -> jax.Array:
        """The single shared network: the L_layers blocks applied to (h + injection), all [S, B, D]."""
        cfg = self.cfg
        rope = (
            rope_tables(cfg.total_len, cfg.head_dim, cfg.rope_theta) if cfg.pos_encodings == "rope" else None
        )
        h = h + injection
        for layer in self.layers:
            h = layer(h, rope, seq_major=True)
        return h

    def recursion(
        self, z_H: jax.Array, z_L: jax.Array, x: jax.Array, L_cycles: int, remat: bool = False
    ) -> tuple[jax.Array, jax.Array]:
        """One recursion on [B, S, D] latents: z_L <- net(z_L, z_H + x) L_cycles times, then z_H <- net(z_H, z_L).

        The net runs sequence-major; between consecutive recursions XLA cancels the transposes back and forth.
        remat: keep only each net call's inputs for the backward pass and recompute the rest (one more
        forward of the recursion, activation memory of one net call instead of L_cycles + 1).
        """
        net = nnx.remat(TRM.net) if remat else TRM.net
        z_H, z_L, x = (a.swapaxes(0, 1) for a in (z_H, z_L, x))
        for _ in range(L_cycles):
            z_L = net(self, z_L, z_H + x)
        z_H = net(self, z_H, z_L)
        return z_H.swapaxes(0, 1), z_L.swapaxes(0, 1)

    def __call__(
        self,
        z_H: jax.Array,
        z_L: jax.Array,
        inputs: jax.Array,
        puzzle_identifiers: jax.Array,
        *,
        H_cycles: int | None = None,
        L_cycles: int | None = None,
        remat: bool = False,
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """One supervision step from the carried latents.

        Runs H_cycles - 1 recursions without gradient and one with it. H_cycles/L_cycles (static ints,
        default from the config) let a curriculum change the depth; each distinct value compiles once.
        Returns (z_H, z_L, logits [B, seq_len, vocab] in the forward dtype, q_logits [B, 2] float32 with
        column 0 = halt, 1 = continue). The returned latents are not detached; the ACT step detaches them.
        remat (static) rematerialises the net calls of the differentiated recursion (train.remat).
        """
        H_cycles = self.cfg.H_cycles if H_cycles is None else H_cycles
        L_cycles = self.cfg.L_cycles if L_cycles is None else L_cycles
        x = self.input_embeddings(inputs, puzzle_identifiers)
        for _ in range(H_cycles - 1):
            z_H, z_L = self.recursion(z_H, z_L, x, L_cycles)
        z_H, z_L = jax.lax.stop_gradient((z_H, z_L))
        z_H, z_L = self.recursion(z_H, z_L, x, L_cycles, remat=remat)
        logits = self.lm_head(z_H[:, self.cfg.prefix_len :])
        # Q head in float32 (the original computes it in the forward dtype and upcasts).
        q_logits = self.q_head(z_H[:, 0].astype(jnp.float32))
        return z_H, z_L, logits, q_logits


def _bfloat16_values(x: jax.Array) -> jax.Array:
    return x.astype(jnp.bfloat16).astype(jnp.float32)


def split_state(model: TRM) -> tuple[nnx.GraphDef, nnx.State, nnx.State, nnx.State]:
    """model -> (graphdef, params, puzzle_emb, buffers); rebuild with nnx.merge(graphdef, params, puzzle_emb, buffers)."""
    return nnx.split(model, nnx.Param, PuzzleEmbedding, Buffer)


def num_params(model: TRM) -> int:
    """Number of trained parameters (nnx.Param leaves): the puzzle embedding and H/L init are not counted."""
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))

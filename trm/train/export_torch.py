"""Export the model of a run dir as a state_dict the original PyTorch TRM code loads.

    trm export-torch --checkpoint RUN_DIR --out model.pt

Writes the latest checkpoint's model (EMA weights when the run kept an EMA, as the original saves) with the
original's key names and layouts (trm/model/torch_io.py): Linear weights [out, in], H_init/L_init in the run's
forward dtype (as the original holds them; bfloat16 in its recipes), puzzle_emb.weights float32. Keys get
--prefix, by default `_orig_mod.model.`, which is what the original trainer writes and its `load_checkpoint`
reads with torch.compile on (use `model.` with DISABLE_COMPILE).
Needs PyTorch (pip install 'trm-study[torch]').
"""

from __future__ import annotations

import argparse
import sys

from trm.model.config import DEFAULT_EXPORT_PREFIX, add_seq_len_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="run dir (local path, file:// or gs://)")
    parser.add_argument("--out", required=True, help="file to write (local path)")
    parser.add_argument(
        "--prefix",
        default=DEFAULT_EXPORT_PREFIX,
        choices=(DEFAULT_EXPORT_PREFIX, "model.", ""),
        help="key prefix (default %(default)s)",
    )
    add_seq_len_argument(parser, "needed only when the architecture does not fix it (attention)")


def main(args: argparse.Namespace) -> int:
    # JAX, Flax and the model are imported here, so that `trm export-torch --help` stays fast.
    from trm.model.torch_io import params_to_state_dict, write_torch_file
    from trm.train.weights import load_weights

    weights = load_weights(args.checkpoint, seq_len=args.seq_len)
    state_dict = params_to_state_dict(
        weights.params,
        weights.puzzle_emb,
        weights.buffers,
        forward_dtype=weights.model_cfg.dtype,
        prefix=args.prefix,
    )
    write_torch_file(state_dict, args.out)
    print(
        f"exported step {weights.step} ({weights.source} weights) of {args.checkpoint} to {args.out}",
        file=sys.stderr,
    )
    return 0

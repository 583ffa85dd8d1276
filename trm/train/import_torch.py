"""Import a checkpoint of the original PyTorch TRM as a run dir that `trm evaluate` and `trm train` accept.

    trm import-torch step_65100 --config config/experiments/exp01a.yaml --out runs/imported

CHECKPOINT is a torch.save'd state_dict of the original trainer (keys may carry the `_orig_mod.` and
`model.` prefixes; layout in trm/model/torch_io.py). --config gives the architecture (and the training
settings for fine-tuning): an experiment YAML over config/base.yaml, or a resolved config.json, plus --set
overrides. Every key and shape is checked against that architecture; the command refuses, naming the key,
a missing, unexpected or wrongly shaped tensor. vocab_size and num_puzzle_identifiers are read off the file;
seq_len comes from --seq-len (default 81, a 9x9 Sudoku; 36 for 6x6, 16 for 4x4).

The output run dir holds config.json, provenance.json (source file, its sha256) and a step-0 checkpoint of
a fresh training state carrying the imported weights (also as the EMA). Evaluate it with
`trm evaluate --checkpoint OUT ...`; fine-tune it with `trm train --config OUT/config.json --data ... --run-dir OUT`,
which resumes from that checkpoint. Needs PyTorch (pip install 'trm-study[torch]').
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trm.config import add_config_arguments, resolve_config_arguments
from trm.data.format import sha256_file
from trm.model.config import ModelConfig, add_seq_len_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="the original trainer's state_dict file (torch.save)")
    add_config_arguments(parser)
    parser.add_argument("--out", required=True, help="run dir to create (local path, file:// or gs://)")
    add_seq_len_argument(parser, "of the data the model will read")


def main(args: argparse.Namespace) -> int:
    # JAX, Flax and the model are imported here, so that `trm import-torch --help` stays fast.
    from trm.model.torch_io import read_torch_file, state_dict_to_params, strip_prefixes
    from trm.train.weights import write_run_dir

    config = resolve_config_arguments(args)
    state_dict = read_torch_file(args.checkpoint)
    tensors = strip_prefixes(state_dict)

    def rows(key: str) -> int:
        # A missing key is reported by the full check below; 1 keeps the config constructible until then.
        return int(tensors[key].shape[0]) if key in tensors and tensors[key].ndim == 2 else 1

    sizes = {
        "vocab_size": rows("inner.embed_tokens.embedding_weight"),
        "seq_len": args.seq_len,
        "num_puzzle_identifiers": rows("inner.puzzle_emb.weights"),
    }
    model_cfg = ModelConfig.from_dict(config["arch"], sizes)
    params, puzzle_emb, buffers = state_dict_to_params(state_dict, model_cfg, source=args.checkpoint)
    provenance = {
        "source": str(Path(args.checkpoint).resolve()),
        "sha256": sha256_file(Path(args.checkpoint)),
        "format": "PyTorch state_dict of the original TRM",
        **sizes,
    }
    write_run_dir(args.out, config, model_cfg, params, puzzle_emb, buffers, provenance)
    print(f"imported {args.checkpoint} into {args.out}", file=sys.stderr)
    return 0

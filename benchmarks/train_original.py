"""Train the ORIGINAL PyTorch TRM with its own training loop on a dataset in its layout (side-by-side runs).

Calls the original's `pretrain.launch` (from the checkout given by --original-repo; never committed) with the
config its README's Sudoku-Extreme MLP-T command composes (benchmarks/original_trm.py `sudoku_config`: batch
768, lr 1e-4 with 2,000 warm-up steps, weight decay 1.0, EMA 0.999, torch.compile on) and this run's --epochs
and --eval-interval, so it trains epochs x groups / batch steps and evaluates the EMA weights on the whole
test split after every interval, exactly as the original does. Its wandb logging (train metrics every step,
evaluations) goes to --log as JSON lines, each with the wall seconds since the start. Our builder's datasets
(`trm build-dataset`) are in the original's layout, so both sides read the same files.

    python benchmarks/train_original.py --original-repo PATH --data DATASET_DIR --log original.jsonl
        [--batch 768] [--epochs 1152] [--eval-interval 384]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from original_trm import OPTIMIZER, import_original, sudoku_config


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--original-repo", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="dataset folder (train/, test/)")
    parser.add_argument("--log", type=Path, required=True, help="JSON-lines file for the logged metrics")
    parser.add_argument("--batch", type=int, default=768)
    parser.add_argument("--epochs", type=int, default=1152)
    parser.add_argument("--eval-interval", type=int, default=384)
    args = parser.parse_args()
    if args.epochs % args.eval_interval:
        parser.error("--epochs must be a multiple of --eval-interval (the original asserts it)")
    if not (args.data / "train" / "dataset.json").is_file():
        raise SystemExit(f"--data {args.data}: no train/dataset.json (build one with trm build-dataset)")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("train_original.py: no CUDA device; the original's training loop runs on CUDA only")
    args.log.unlink(missing_ok=True)
    pretrain = import_original(args.original_repo, args.log)
    print(f"optimizer: {OPTIMIZER['name']}", flush=True)
    with tempfile.TemporaryDirectory() as checkpoints:
        config = sudoku_config(
            args.original_repo, args.batch, str(args.data), args.epochs, args.eval_interval, checkpoints
        )
        pretrain.launch(config)


if __name__ == "__main__":
    main()

"""Evaluate a checkpoint at several test-time step counts in one pass (test-time scaling).

    trm evaluate --checkpoint RUN_DIR --data DATA [--steps 16,32,64,128] [--subset N] [--out FILE.json]
                 [--trajectories K,... [--noise SIGMA] [--sample-seed S]]

--checkpoint: a run dir of `trm train` or `trm import-torch`. The model of its latest checkpoint is used:
  the EMA weights when the run kept an EMA (the output says which: "weights": "ema" or "params").
--data: a staged dataset URL (gs://, file://) or a dataset folder built by `trm build-dataset` (both are
  copied into --cache-dir and checked against their MANIFEST.json; a folder without one is read as it is),
  --split test or train; or a Sudoku-Extreme style CSV (.csv or .csv.gz, columns question,answer; any board, of
  its first question's size).
--batch-size: puzzles per batch over all devices; by default the run's train.eval_batch_size (or, where that is
  null, its train.global_batch_size), the batch its trainer evaluated with, so that the figures at
  train.eval_steps reproduce the trainer's final evaluation bit for bit (on the same devices).

The evaluation is the trainer's own (trm/train/evaluator.py says what each figure means), over every local
device. --trajectories: also the sampled recursion (trm/train/sampled.py) at the same counts and puzzles: K trajectories
  per puzzle for each K, noise sd --noise (default 0.3) added to z_L before every supervision step, drawn from
  --sample-seed (default 0); the JSON's "sampled" and FILE-sampled.csv, one row per K and count.
Output: a JSON summary (--out FILE.json, or stdout) and a CSV with one row per step count beside it
(FILE.csv). The workflow does not run this command: each training job ends by evaluating its run at the
test-time step counts on its own hosts (`trm train --test-time-steps`, the run dir's test_time.json, the same
JSON with the rows of each count added: the whole split, or the test-time subset of trm/train/test_time.py); this
one evaluates any checkpoint by hand, in one process.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

import numpy as np

from trm import storage
from trm.config import eval_batch_size
from trm.data.format import SplitData, load_split, sudoku_metadata
from trm.data.manifest import MANIFEST_NAME
from trm.data.sudoku import read_csv
from trm.data.verify import DATASET_CACHE, fetch_dataset
from trm.errors import UserError, number
from trm.run.timing import Timings
from trm.train.records import parse_steps, results_csv
from trm.train.sampling import DEFAULT_SEED, DEFAULT_SIGMA

if TYPE_CHECKING:  # JAX and the model are imported by main, so `trm evaluate --help` stays fast
    from trm.train.weights import RunWeights

DEFAULT_STEPS = "16,32,64,128"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="run dir (local path, file:// or gs://)")
    parser.add_argument("--data", required=True, help="staged dataset URL, built dataset folder, or CSV")
    parser.add_argument(
        "--split", default="test", choices=("test", "train"), help="dataset split (default test)"
    )
    parser.add_argument(
        "--steps",
        default=DEFAULT_STEPS,
        help="comma-separated supervision step counts to report (default %(default)s)",
    )
    parser.add_argument(
        "--subset", type=number(int, minimum=1), default=None, help="evaluate only the first N puzzles"
    )
    parser.add_argument(
        "--batch-size",
        type=number(int, minimum=1),
        default=None,
        help=(
            "puzzles per batch over all devices (default: the run's train.eval_batch_size, else its "
            "global_batch_size)"
        ),
    )
    parser.add_argument(
        "--out", default=None, help="JSON output file (CSV beside it); default: JSON to stdout"
    )
    parser.add_argument(
        "--trajectories",
        default="",
        metavar="K,...",
        help="also sample K noisy trajectories per puzzle, for each K (default: none)",
    )
    parser.add_argument(
        "--noise",
        type=number(float, minimum=0),
        default=DEFAULT_SIGMA,
        metavar="SIGMA",
        help="sd of the noise added to z_L before each supervision step of a trajectory (default %(default)s)",
    )
    parser.add_argument(
        "--sample-seed",
        type=number(int, minimum=0),
        default=DEFAULT_SEED,
        help="seed of the trajectories' noise (default %(default)s)",
    )
    parser.add_argument(
        "--cache-dir", default=DATASET_CACHE, help="local cache for staged datasets (default %(default)s)"
    )


def load_eval_split(data: str, split: str, cache_dir: str) -> SplitData:
    """The puzzles to evaluate: a Sudoku CSV, a staged dataset (fetched to the cache) or a built dataset folder."""
    if data.endswith((".csv", ".csv.gz")):
        puzzles = read_csv(storage.filesystem(data)[1])
        count = len(puzzles)
        # The dataset format's tokens: 0 = padding, 1 = blank, 2..n+1 = digits 1..n (of the CSV's board).
        return SplitData(
            inputs=puzzles.questions + 1,
            labels=puzzles.answers + 1,
            puzzle_identifiers=np.zeros(count, np.int32),
            puzzle_indices=np.arange(count + 1, dtype=np.int32),
            group_indices=np.arange(count + 1, dtype=np.int32),
            metadata=sudoku_metadata(count, puzzles.board),
        )
    if not storage.exists(data):
        raise UserError(f"{data}: no such dataset")
    if storage.exists(storage.join(data, MANIFEST_NAME)):
        return load_split(fetch_dataset(data, cache_dir), split)
    return load_split(storage.filesystem(data)[1], split)


def check_compatible(weights: RunWeights, metadata: dict, data: str) -> None:
    """UserError when the data's vocabulary, length or puzzle ids differ from the checkpoint's model."""
    for field in ("vocab_size", "seq_len", "num_puzzle_identifiers"):
        if metadata[field] != getattr(weights.model_cfg, field):
            raise UserError(
                f"{data}: {field} = {metadata[field]}, but the checkpoint's model has "
                f"{field} = {getattr(weights.model_cfg, field)}"
            )


def main(args: argparse.Namespace) -> int:
    timings = Timings()  # first: the time before it is the process's start and imports
    with timings.phase("setup"):
        import jax

        from trm.train.evaluator import Evaluator, evaluate
        from trm.train.step import ModelTemplate
        from trm.train.weights import load_weights

    counts = parse_steps(args.steps)
    trajectories = parse_steps(args.trajectories, "--trajectories") if args.trajectories else ()
    with timings.phase("data"):
        split = load_eval_split(args.data, args.split, args.cache_dir)
    with timings.phase("checkpoint"):
        weights = load_weights(args.checkpoint, seq_len=split.metadata["seq_len"])
    check_compatible(weights, split.metadata, args.data)
    print(
        f"evaluating {args.checkpoint} (step {weights.step}, {weights.source} weights) on "
        f"{jax.local_device_count()} device(s)",
        file=sys.stderr,
    )
    evaluator = Evaluator(ModelTemplate(weights.model_cfg, seed=0), counts)
    devices = evaluator.mesh.size
    train = weights.config["train"]
    batch_size = eval_batch_size(
        {**train, "eval_batch_size": args.batch_size or train.get("eval_batch_size")}, devices
    )
    with timings.phase("evaluate"):
        on_device = evaluator.put_weights(weights.params, weights.puzzle_emb, weights.buffers)
        results = evaluate(evaluator, on_device, split, batch_size, args.subset, progress=True)
        sampled = _sampled(evaluator, on_device, split, batch_size, args, trajectories)
    summary = {
        "checkpoint": args.checkpoint,
        "checkpoint_step": weights.step,
        "weights": weights.source,
        "data": args.data,
        "split": "csv" if args.data.endswith((".csv", ".csv.gz")) else args.split,
        "subset": args.subset,
        "devices": devices,
        "batch_size": batch_size,
        "results": results,
        **({"sampled": sampled} if sampled else {}),
    }
    text = json.dumps(summary, indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    csv_url = args.out.removesuffix(".json") + ".csv"
    try:
        storage.write_text(csv_url, results_csv(results))
        if sampled:
            storage.write_text(args.out.removesuffix(".json") + "-sampled.csv", results_csv(sampled))
        storage.write_text(args.out, text)  # last: its presence means both files are complete
    except UserError:
        sys.stdout.write(text)  # the evaluation is not lost: its JSON goes to stdout, the error to stderr
        raise
    print(f"wrote {args.out} and {csv_url}", file=sys.stderr)
    print(json.dumps({"timings": timings.record()}), file=sys.stderr)
    return 0


def _sampled(evaluator, weights: tuple, split: SplitData, batch_size: int, args, trajectories) -> list[dict]:
    """The sampled recursion's records, K by K ([] without --trajectories)."""
    from trm.train.sampled import SampledEvaluator, describe, evaluate_sampled

    if not trajectories:
        return []
    base = SampledEvaluator(evaluator, trajectories[0], args.noise, args.sample_seed)
    records = []
    for k in trajectories:
        sampled = base.with_trajectories(k)  # one compiled program for every K
        describe(sampled, len(split.inputs) if args.subset is None else min(args.subset, len(split.inputs)))
        records += evaluate_sampled(sampled, weights, split, batch_size, args.subset)
    return records

"""Write a pool of generated Sudoku puzzles as train.csv and test.csv: the offline source of smoke datasets.

    trm smoke-pool --train 100 --test 32 --output-dir results/smoke/pool

The generator makes about 20 puzzles per second, so the smoke study generates one pool and builds each of its
datasets from it with `trm build-dataset --source DIR --subsample-size N`: subsamples are prefixes of one seeded
permutation, so the smaller datasets are nested in the larger ones, as in the paper-scale study.
"""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path

import numpy as np

from trm import storage
from trm.data.generate import generate_puzzles
from trm.data.sudoku import Puzzles
from trm.errors import number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train", type=number(int, minimum=1), required=True, help="puzzles in train.csv")
    parser.add_argument(
        "--test", type=number(int, minimum=1), required=True, help="further, distinct puzzles in test.csv"
    )
    parser.add_argument("--seed", type=number(int, minimum=0), default=0, help="generator seed (default: 0)")
    parser.add_argument(
        "--blanks",
        type=number(int, minimum=1, maximum=64),
        default=None,
        help="blank cells per puzzle, 1-64 (no puzzle with a unique solution has more): the difficulty (default: minimal puzzles, about 55-64 blanks)",
    )
    parser.add_argument("--output-dir", required=True, help="folder to write train.csv and test.csv into")


def write_csv(path: Path, puzzles: Puzzles) -> None:
    """Write puzzles in the Sudoku-Extreme CSV layout (source,question,answer,rating), atomically."""
    stream = io.StringIO(newline="")
    writer = csv.writer(stream)
    writer.writerow(["source", "question", "answer", "rating"])
    for question, answer, rating in zip(puzzles.questions, puzzles.answers, puzzles.ratings, strict=True):
        writer.writerow(
            [
                "generated",
                "".join("." if c == 0 else str(c) for c in question),
                "".join(map(str, answer)),
                int(rating),
            ]
        )
    storage.write_text(str(path), stream.getvalue())


def main(args: argparse.Namespace) -> int:
    puzzles = generate_puzzles(args.train + args.test, args.seed, args.blanks)
    output = Path(args.output_dir)  # made by the first write, whose refusal names it (storage.local_writer)
    write_csv(output / "train.csv", puzzles.take(np.arange(args.train)))
    write_csv(output / "test.csv", puzzles.take(np.arange(args.train, len(puzzles))))
    difficulty = "minimal puzzles" if args.blanks is None else f"{args.blanks} blanks each"
    print(f"wrote {output}: {args.train} train and {args.test} test puzzles, {difficulty} (seed {args.seed})")
    return 0

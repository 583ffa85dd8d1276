"""Write a pool of generated Sudoku puzzles as train.csv and test.csv: the offline source of smoke datasets.

    trm smoke-pool --train 100 --test 32 --output-dir results/smoke/pool [--board 6x6] [--blanks 30]

Puzzles of --board (4x4, 6x6, 8x8 or 9x9, default 9x9): minimal ones, or with exactly --blanks blank cells each.
The generator makes about 15 minimal 9x9 puzzles per CPU-second (200 6x6 ones, 1,000 4x4 ones), so the smoke
study generates one pool and builds each of its datasets from it with `trm build-dataset --source DIR
--subsample-size N`: subsamples are prefixes of one seeded permutation, so the smaller datasets are nested in the
larger ones, as in the paper-scale study.

An existing train.csv or test.csv in --output-dir is replaced only when it is a pool this command wrote (every
row's source is "generated"); any other file there is refused, and nothing is written.
"""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path

import numpy as np

from trm import storage
from trm.data.board import SUDOKU, parse_board
from trm.data.generate import check_blanks, generate_puzzles
from trm.data.sudoku import Puzzles
from trm.errors import UserError, number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train", type=number(int, minimum=1), required=True, help="puzzles in train.csv")
    parser.add_argument(
        "--test", type=number(int, minimum=1), required=True, help="further, distinct puzzles in test.csv"
    )
    parser.add_argument("--seed", type=number(int, minimum=0), default=0, help="generator seed (default: 0)")
    parser.add_argument(
        "--board", default=SUDOKU.name, help="NxN: 4x4, 6x6, 8x8 or 9x9 (default: %(default)s)"
    )
    parser.add_argument(
        "--blanks",
        type=number(int, minimum=1),
        default=None,
        help="blank cells per puzzle, the difficulty: at most 64 on 9x9, 50 on 8x8, 28 on 6x6, 12 on 4x4 "
        "(default: minimal puzzles, about 55-59 blanks on 9x9, 26 on 6x6, 12 on 4x4)",
    )
    parser.add_argument("--output-dir", required=True, help="folder to write train.csv and test.csv into")


POOL_SOURCE = (
    "generated"  # the source column of every pool row: how an earlier pool is told from a user's file
)


def _check_replaceable(path: Path) -> None:
    """Refuse to replace `path` unless it is a pool file this command wrote: a CSV whose every row's source is
    POOL_SOURCE (read up to the first row that is not, so a large file of someone else's is refused at once)."""
    if not path.exists() and not path.is_symlink():
        return
    refuse = (
        f"{path} exists and is not a pool trm smoke-pool wrote: choose another --output-dir, or move it away"
    )
    if path.is_symlink() or not path.is_file():
        raise UserError(refuse)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = csv.DictReader(f)
            ours = rows.fieldnames is not None and all(row.get("source") == POOL_SOURCE for row in rows)
    except (OSError, UnicodeDecodeError, csv.Error):
        ours = False
    if not ours:
        raise UserError(refuse)


def write_csv(path: Path, puzzles: Puzzles) -> None:
    """Write puzzles in the Sudoku-Extreme CSV layout (source,question,answer,rating), atomically."""
    stream = io.StringIO(newline="")
    writer = csv.writer(stream)
    writer.writerow(["source", "question", "answer", "rating"])
    for question, answer, rating in zip(puzzles.questions, puzzles.answers, puzzles.ratings, strict=True):
        writer.writerow(
            [
                POOL_SOURCE,
                "".join("." if c == 0 else str(c) for c in question),
                "".join(map(str, answer)),
                int(rating),
            ]
        )
    storage.write_text(str(path), stream.getvalue())


def main(args: argparse.Namespace) -> int:
    board = parse_board(args.board)
    check_blanks(args.blanks, board)  # the board's maximum (its minimum, 1, is the option's)
    output = Path(args.output_dir)  # made by the first write, whose refusal names it (storage.local_writer)
    for name in ("train.csv", "test.csv"):
        _check_replaceable(output / name)
    puzzles = generate_puzzles(args.train + args.test, args.seed, args.blanks, board)
    write_csv(output / "train.csv", puzzles.take(np.arange(args.train)))
    write_csv(output / "test.csv", puzzles.take(np.arange(args.train, len(puzzles))))
    difficulty = "minimal puzzles" if args.blanks is None else f"{args.blanks} blanks each"
    print(
        f"wrote {output}: {args.train} train and {args.test} test puzzles of a {board}, {difficulty} "
        f"(seed {args.seed})"
    )
    return 0

"""Print a dataset's board, its splits (examples, puzzles, groups; shape and dtype of every array) and its
provenance, and check every file against the build record (MANIFEST.json, written by `trm build-dataset`).

Exit code 1 if a file differs from the record: altered, resized, missing or not listed (each is named;
`trm stage` refuses such a folder); 2 if a file the reader needs is missing or malformed. Datasets without a
record (the original builder's, an older trm's, hand-made ones) are reported as such.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trm.data import format as fmt
from trm.data.board import Board
from trm.data.manifest import MANIFEST_NAME, read_build_record, scan_local
from trm.errors import UserError

_PROVENANCE = (
    "builder",
    "source",
    "test_source",
    "seed",
    "subsample_size",
    "test_subsample_size",
    "num_aug",
    "min_difficulty",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset_dir", help="dataset folder (holding train/ and test/)")


def _board(metadata: dict) -> str:
    """The board a dataset's seq_len says (trm/data/board.py), with its vocabulary, in words."""
    seq_len, vocab = metadata["seq_len"], metadata["vocab_size"]
    try:
        board = Board.from_cells(seq_len)
    except UserError:
        return f"none (seq_len {seq_len} is no Sudoku board's; vocab {vocab})"
    note = "" if vocab == board.vocab_size else f", expected {board.vocab_size} for this board"
    return f"{board.name}, {board.box} boxes (seq_len {seq_len}, vocab {vocab}{note})"


def main(args: argparse.Namespace) -> int:
    dataset_dir = Path(args.dataset_dir)
    if not dataset_dir.is_dir():
        raise UserError(f"{dataset_dir}: no such dataset folder")
    metadata = fmt.read_metadata(dataset_dir, "train")
    print(f"board: {_board(metadata)}")
    for split in fmt.SPLITS:
        data = fmt.load_split(dataset_dir, split)
        print(
            f"{split}: {len(data.inputs)} examples, {len(data.puzzle_identifiers)} puzzles, "
            f"{len(data.group_indices) - 1} groups"
        )
        for name in fmt.ARRAY_NAMES:
            array = getattr(data, name)
            print(f"  {name:<20} shape {list(array.shape)!s:<14} dtype {array.dtype}")
    provenance = ", ".join(f"{key}={metadata[key]}" for key in _PROVENANCE if key in metadata)
    print(f"provenance: {provenance or 'none recorded (original builder?)'}")

    record = read_build_record(dataset_dir)
    if record is None:
        print(f"build record: none (no {MANIFEST_NAME}: an older trm, the original builder or hand-made)")
        return 0
    problems = record.differences(scan_local(dataset_dir))
    if problems:
        print(f"build record {record.hash[:16]}: MISMATCH, the files changed after the build:")
        for problem in problems:
            print(f"  {problem}")
        print("rebuild with trm build-dataset")
        return 1
    print(
        f"build record {record.hash[:16]}: matches ({len(record.entries)} files, {record.total_bytes:,} bytes)"
    )
    return 0

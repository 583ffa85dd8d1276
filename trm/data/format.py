"""The on-disk dataset format: writer and reader.

A dataset folder holds `identifiers.json` (`["<blank>"]`) and one folder per split (`train`, `test`), each with

    all__inputs.npy              [E, n*n] token ids: 1 = blank, 2..n+1 = digits 1..n (0 is padding)
    all__labels.npy              [E, n*n] token ids 2..n+1
    all__puzzle_identifiers.npy  [P] int32, all 0 for Sudoku
    all__puzzle_indices.npy      [P + 1] int32 example offsets of each puzzle (one example per puzzle)
    all__group_indices.npy       [G + 1] int32 puzzle offsets of each group (a puzzle and its augmentations)
    dataset.json                 metadata: the original's fields plus provenance

where each example is a board of n x n cells (trm/data/board.py; 9x9 for Sudoku-Extreme). dataset.json's seq_len
(n * n) fixes the board and its vocab_size is n + 2, so the format records nothing more for it.

This builder stores tokens as uint8; the original stored the train split as int64. The reader accepts both,
and datasets without the provenance fields.

A dataset built by `trm build-dataset` also holds MANIFEST.json, the build record: the size, md5 and crc32c
of every other file (see trm/data/manifest.py). The reader does not need it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trm import storage
from trm.data.board import SUDOKU, Board
from trm.errors import UserError

SPLITS = ("train", "test")
ARRAY_NAMES = ("inputs", "labels", "puzzle_identifiers", "puzzle_indices", "group_indices")
SET_NAME = "all"
IDENTIFIERS = ["<blank>"]

# Fields every dataset.json has, the original's included, and their types.
REQUIRED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "pad_id": int,
    "ignore_label_id": (int, type(None)),
    "blank_identifier_id": int,
    "vocab_size": int,
    "seq_len": int,
    "num_puzzle_identifiers": int,
    "total_groups": int,
    "mean_puzzle_examples": (int, float),
    "total_puzzles": int,
    "sets": list,
}


@dataclass
class SplitData:
    """One split of a dataset. inputs and labels may be memory-mapped; the index arrays are in memory."""

    inputs: np.ndarray  # [examples, seq_len], uint8 (or int64 from the original builder)
    labels: np.ndarray  # [examples, seq_len]
    puzzle_identifiers: np.ndarray  # [puzzles] int32
    puzzle_indices: np.ndarray  # [puzzles + 1] int32
    group_indices: np.ndarray  # [groups + 1] int32
    metadata: dict


def array_path(dataset_dir: str | Path, split: str, name: str) -> Path:
    return Path(dataset_dir) / split / f"{SET_NAME}__{name}.npy"


def sudoku_metadata(num_groups: int, board: Board = SUDOKU) -> dict:
    """The original builder's dataset.json fields for a Sudoku split of `board` with `num_groups` groups."""
    return {
        "pad_id": 0,
        "ignore_label_id": 0,
        "blank_identifier_id": 0,
        "vocab_size": board.vocab_size,
        "seq_len": board.cells,
        "num_puzzle_identifiers": 1,
        "total_groups": num_groups,
        "mean_puzzle_examples": 1.0,
        # As in the original: the number of groups, not of puzzles.
        "total_puzzles": num_groups,
        "sets": [SET_NAME],
    }


def write_split_arrays(
    dataset_dir: str | Path, split: str, inputs: np.ndarray, labels: np.ndarray, group_size: int
) -> None:
    """Write one split's arrays: one example per puzzle, puzzles grouped in runs of `group_size`."""
    num_examples = len(inputs)
    if num_examples % group_size:
        raise ValueError(f"{num_examples} examples do not split into groups of {group_size}")
    (Path(dataset_dir) / split).mkdir(parents=True, exist_ok=True)
    arrays = {
        "inputs": inputs,
        "labels": labels,
        "puzzle_identifiers": np.zeros(num_examples, dtype=np.int32),
        "puzzle_indices": np.arange(num_examples + 1, dtype=np.int32),
        "group_indices": np.arange(0, num_examples + 1, group_size, dtype=np.int32),
    }
    for name, array in arrays.items():
        np.save(array_path(dataset_dir, split, name), array, allow_pickle=False)


def write_json(path: str | Path, value: object) -> None:
    """Deterministic JSON (sorted keys, no timestamps), so equal inputs give byte-identical files."""
    Path(path).write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def read_metadata(dataset_dir: str | Path, split: str) -> dict:
    """The split's dataset.json, checked for the original's fields. Raises UserError naming the file."""
    path = Path(dataset_dir) / split / "dataset.json"
    if not path.is_file():
        raise UserError(f"{path}: missing dataset file")
    metadata = storage.read_json(
        str(path), "missing dataset file", "build the dataset again (trm build-dataset)"
    )
    if not isinstance(metadata, dict):
        raise UserError(f"{path}: expected a JSON object, found {type(metadata).__name__}")
    for field, kind in REQUIRED_FIELDS.items():
        if field not in metadata:
            raise UserError(f"{path}: missing field {field!r}")
        if not isinstance(metadata[field], kind) or isinstance(metadata[field], bool):
            raise UserError(f"{path}: field {field!r} has the wrong type ({metadata[field]!r})")
    if SET_NAME not in metadata["sets"]:
        raise UserError(f"{path}: field 'sets' is {metadata['sets']!r}; only set {SET_NAME!r} is supported")
    return metadata


def _load_array(path: Path, mmap: bool) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"{path}: missing dataset file")
    rebuild = "rebuild the dataset with `trm build-dataset`"
    with open(path, "rb") as stream:
        if stream.read(6) != b"\x93NUMPY":  # np.load would try to unpickle it
            raise UserError(f"{path}: not a NumPy .npy file (no .npy header); {rebuild}")
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        if "object" in str(err) or "pickle" in str(err):
            raise UserError(f"{path}: holds Python objects, not integer tokens; {rebuild}") from None
        raise UserError(f"{path}: not a readable .npy array ({err}); {rebuild}") from None
    if not np.issubdtype(array.dtype, np.integer):
        raise UserError(f"{path}: expected an integer array, found dtype {array.dtype}")
    return array


def load_split(dataset_dir: str | Path, split: str, mmap: bool = True) -> SplitData:
    """Load one split ('train' or 'test'); inputs and labels are memory-mapped unless mmap=False.

    Accepts uint8 or the original's int64 token arrays. Raises UserError naming the file on a missing file,
    malformed metadata or arrays whose shapes disagree.
    """
    metadata = read_metadata(dataset_dir, split)
    arrays = {
        name: _load_array(array_path(dataset_dir, split, name), mmap=mmap and name in ("inputs", "labels"))
        for name in ARRAY_NAMES
    }
    data = SplitData(metadata=metadata, **arrays)

    def check(ok: bool, name: str, problem: str) -> None:
        if not ok:
            raise UserError(f"{array_path(dataset_dir, split, name)}: {problem}")

    seq_len = metadata["seq_len"]
    check(
        data.inputs.ndim == 2 and data.inputs.shape[1] == seq_len,
        "inputs",
        f"shape {data.inputs.shape}, expected [examples, {seq_len}] (seq_len)",
    )
    check(
        data.labels.shape == data.inputs.shape,
        "labels",
        f"shape {data.labels.shape} differs from inputs {data.inputs.shape}",
    )
    num_puzzles = len(data.puzzle_identifiers)
    check(
        data.puzzle_indices.shape == (num_puzzles + 1,)
        and data.puzzle_indices[0] == 0
        and data.puzzle_indices[-1] == len(data.inputs),
        "puzzle_indices",
        f"expected {num_puzzles + 1} offsets from 0 to {len(data.inputs)} (examples)",
    )
    check(
        len(data.group_indices) == metadata["total_groups"] + 1
        and data.group_indices[0] == 0
        and data.group_indices[-1] == num_puzzles,
        "group_indices",
        f"expected {metadata['total_groups'] + 1} offsets (total_groups + 1) from 0 to {num_puzzles} (puzzles)",
    )
    return data


def check_data_settings(settings: dict, train: SplitData, dataset: str) -> None:
    """A run's data settings (its config's `data`: board, train_puzzles, num_aug) describe the train split of the
    dataset it trains on, so that its config says what it trained: UserError naming the setting and the dataset if
    not."""
    board = Board.from_cells(train.metadata["seq_len"])
    if settings["board"] != board.name:
        raise UserError(
            f"data.board is {settings['board']}, but the dataset at {dataset} holds {board.name} puzzles (seq_len "
            f"{train.metadata['seq_len']} of its train/dataset.json): set data.board={board.name}, or train on a "
            f"dataset built with --board {settings['board']}"
        )
    puzzles = train.metadata["total_groups"]  # groups: each a base puzzle and its augmentations
    sizes = np.unique(np.diff(train.group_indices))
    if settings["train_puzzles"] != puzzles:
        raise UserError(
            f"data.train_puzzles is {settings['train_puzzles']}, but the dataset at {dataset} holds {puzzles} "
            f"training puzzles (total_groups of its train/dataset.json): set data.train_puzzles={puzzles}, or "
            f"train on a dataset built with --subsample-size {settings['train_puzzles']}"
        )
    if len(sizes) > 1 or (len(sizes) == 1 and sizes[0] != settings["num_aug"] + 1):
        held = f"{sizes[0] - 1}" if len(sizes) == 1 else f"{sizes.min() - 1} to {sizes.max() - 1}"
        set_it = f"set data.num_aug={held}, or " if len(sizes) == 1 else ""
        raise UserError(
            f"data.num_aug is {settings['num_aug']}, but the dataset at {dataset} holds {held} augmentations per "
            f"training puzzle (train/{SET_NAME}__group_indices.npy): {set_it}train on a dataset built with "
            f"--num-aug {settings['num_aug']}"
        )


def check_same_format(train_meta: dict, test_meta: dict) -> None:
    """The train and test splits of one dataset agree on the vocabulary, sequence and puzzle ids."""
    for key in ("vocab_size", "seq_len", "num_puzzle_identifiers", "pad_id", "ignore_label_id"):
        if train_meta.get(key) != test_meta.get(key):
            raise UserError(
                f"dataset splits disagree on {key}: train {train_meta.get(key)} vs test {test_meta.get(key)}"
            )

"""Build a Sudoku dataset (Sudoku-Extreme by default): train and test .npy files in the original TRM layout.

Steps: read and validate the puzzles of --source; keep those with rating >= --min-difficulty (both
splits); subsample the train split (--subsample-size) and the test split (--test-subsample-size);
expand every train puzzle into a group of itself plus --num-aug random symmetries (digit relabelling,
transpose on square boxes, band/row and stack/column shuffles); write tokens (1 = blank, 2..n+1 = digits) as
uint8.

Boards (--board NxN: 4x4, 6x6, 8x8 or 9x9; trm/data/board.py): a CSV's puzzles are of the board whose cell count
is its first question's length (16, 36, 64 or 81), or of --board when given, and every row must match it;
generate:N makes puzzles of --board (default 9x9). The dataset's seq_len (n * n) and vocab_size (n + 2) say its
board, so dataset.json has no field for it, and a 9x9 build is the same as before other boards existed.

Sources (--source):
  FILE.csv[.gz]    a CSV with columns source,question,answer,rating. Split by the seed into test (20%,
                   at least 1 puzzle) and train (the rest), unless --test-source gives the test split.
  DIR              a folder holding train.csv and test.csv (or .csv.gz).
  hf:OWNER/REPO    train.csv and test.csv downloaded from the Hugging Face hub (needs network; cached in
                   $TRM_CACHE_DIR, default ~/.cache/trm). Default: hf:sapientinc/sudoku-extreme.
  generate:N       offline: N generated minimal puzzles with unique solutions as the train split and
                   max(1, N // 4) further, distinct ones as the test split; rating = solver backtracks.

Randomness comes only from --seed: the same inputs and seed give byte-identical files. Subsamples are
prefixes of one seeded permutation, and the augmentations of the k-th kept puzzle depend only on (seed,
k), so a build with --subsample-size 100 is exactly the first 100 groups of the same build with 1000.

Each puzzle (its question) appears once in the dataset, in one split: a build whose kept puzzles repeat within
a split or appear in both splits is refused, naming the source and the first repeated puzzle (Sudoku-Extreme's
own files hold none: its puzzles are deduplicated, and its train and test puzzles are not even equivalent).

The dataset is written to a temporary folder beside --output-dir and renamed into place at the end: on
any error nothing is left behind. An existing --output-dir is replaced (--force) only when it is a dataset
`trm build-dataset` made, as it made it: its MANIFEST.json lists every file in it. Anything else (a plain file,
a folder of the user's, a dataset holding added files) is refused, and nothing is touched.

dataset.json holds the original's fields plus provenance (builder, source, test_source, seed, subsample_size,
test_subsample_size, num_aug, min_difficulty; the same in both splits). MANIFEST.json, the build record, lists every file the build wrote with its size, md5 and
crc32c: `trm dataset-info` checks the folder against it, and `trm stage` stages only files that match it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import tempfile
from pathlib import Path

import numpy as np

from trm import storage
from trm.data import format as fmt
from trm.data import sources
from trm.data.augment import augment
from trm.data.board import Board, parse_board
from trm.data.manifest import MANIFEST_NAME, Manifest, read_build_record, unrecorded_paths, write_build_record
from trm.data.sudoku import MISSING_RATING, Puzzles
from trm.errors import UserError, number

_TRAIN_SUBSAMPLE_STREAM = 0x7A1
_TEST_SUBSAMPLE_STREAM = 0x7E5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        default="hf:sapientinc/sudoku-extreme",
        help="FILE, DIR, hf:OWNER/REPO or generate:N (see above)",
    )
    parser.add_argument("--test-source", default=None, help="a CSV file to use, whole, as the test split")
    parser.add_argument(
        "--board",
        default=None,
        help="NxN: 4x4, 6x6, 8x8 or 9x9 (default: a CSV's first puzzle's size; 9x9 for generate:N)",
    )
    parser.add_argument(
        "--output-dir",
        default="data/sudoku-extreme-full",
        help="dataset folder to create (default: %(default)s)",
    )
    parser.add_argument(
        "--subsample-size",
        type=number(int, minimum=1),
        default=None,
        help="train puzzles to keep (default: all)",
    )
    parser.add_argument(
        "--test-subsample-size",
        type=number(int, minimum=1),
        default=None,
        help="test puzzles to keep (default: all)",
    )
    parser.add_argument(
        "--num-aug",
        type=number(int, minimum=0),
        default=0,
        help="augmentations per train puzzle (default: 0)",
    )
    parser.add_argument(
        "--min-difficulty",
        type=number(int, minimum=0),
        default=None,
        help="keep puzzles with rating >= this (both splits)",
    )
    parser.add_argument(
        "--seed", type=number(int, minimum=0), default=0, help="seed of all random choices (default: 0)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace --output-dir if it is a dataset trm build-dataset made (nothing else is replaced)",
    )


def _filter_difficulty(puzzles: Puzzles, min_difficulty: int, split: str) -> Puzzles:
    unrated = int((puzzles.ratings == MISSING_RATING).sum())
    if unrated:
        raise UserError(
            f"--min-difficulty {min_difficulty}: {unrated} puzzles of the {split} split have no rating"
        )
    kept = puzzles.take(np.flatnonzero(puzzles.ratings >= min_difficulty))
    if len(kept) == 0:
        raise UserError(f"--min-difficulty {min_difficulty}: no puzzle of the {split} split is that hard")
    return kept


def subsample(puzzles: Puzzles, size: int | None, seed: int, stream: int, split: str) -> Puzzles:
    """The first `size` puzzles of a seeded permutation (all, in file order, if size is None)."""
    if size is None:
        return puzzles
    if size > len(puzzles):
        raise UserError(f"subsample size {size} exceeds the {len(puzzles)} puzzles of the {split} split")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, stream])))
    return puzzles.take(rng.permutation(len(puzzles))[:size])


def _check_args(args: argparse.Namespace) -> None:
    output = Path(args.output_dir)
    if output.exists() or output.is_symlink():
        if not args.force:
            raise UserError(
                f"--output-dir {output} already exists; pass --force to replace it if it is a dataset "
                "trm build-dataset made (nothing else is replaced)"
            )
        _check_replaceable(output)


def _check_replaceable(output: Path) -> None:
    """Refuse to replace `output` unless it is a dataset folder this builder made: its build record lists every
    file in it (Snakemake's timestamp aside)."""
    refuse = (
        "--force replaces only a dataset trm build-dataset made; choose another --output-dir, or move it away"
    )
    if output.is_symlink() or not output.is_dir():
        raise UserError(f"--output-dir {output} is {'a link' if output.is_symlink() else 'a file'}: {refuse}")
    try:
        record = read_build_record(output)
    except UserError as err:
        raise UserError(f"--output-dir {output}: {err}; {refuse}") from None
    if record is None:
        raise UserError(f"--output-dir {output} holds no {MANIFEST_NAME}: {refuse}")
    foreign = unrecorded_paths(output, record)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UserError(f"--output-dir {output} holds {shown}, not in its {MANIFEST_NAME}: {refuse}")


def _refuse_repeats(train: Puzzles, test: Puzzles, args: argparse.Namespace) -> None:
    """Each puzzle once, in one split: UserError naming the source and the first repeated question."""
    train_keys, test_keys = _question_keys(train), _question_keys(test)
    checks = (
        ("repeated within the train split", train, _repeated(train_keys)),
        ("repeated within the test split", test, _repeated(test_keys)),
        ("in both splits", test, np.flatnonzero(np.isin(test_keys, train_keys))),
    )
    found = [(what, puzzles, index) for what, puzzles, index in checks if len(index)]
    if not found:
        return
    where = f"--source {args.source}" + (f" --test-source {args.test_source}" if args.test_source else "")
    _, puzzles, index = found[0]
    first = "".join("." if c == 0 else str(c) for c in puzzles.questions[index[0]])
    raise UserError(
        f"{where}: puzzles repeat in the dataset: {', '.join(f'{len(i)} {what}' for what, _, i in found)} "
        f"(the first: {first}); a dataset holds each puzzle once, in one split: remove the repeated rows"
    )


def _question_keys(puzzles: Puzzles) -> np.ndarray:
    """One comparable, sortable value per puzzle: its question's cells as raw bytes."""
    questions = np.ascontiguousarray(puzzles.questions)
    return questions.view(np.dtype((np.void, questions.shape[1] * questions.itemsize))).ravel()


def _repeated(keys: np.ndarray) -> np.ndarray:
    """Indices of the keys equal to an earlier one."""
    _, first = np.unique(keys, return_index=True)
    repeated = np.ones(len(keys), dtype=bool)
    repeated[first] = False
    return np.flatnonzero(repeated)


def _write(
    tmp: Path, splits: dict[str, tuple[np.ndarray, np.ndarray, int]], board: Board, provenance: dict
) -> Manifest:
    for split, (inputs, labels, group_size) in splits.items():
        fmt.write_split_arrays(tmp, split, inputs, labels, group_size)
        metadata = fmt.sudoku_metadata(len(inputs) // group_size, board) | provenance
        fmt.write_json(tmp / split / "dataset.json", metadata)
    fmt.write_json(tmp / "identifiers.json", fmt.IDENTIFIERS)
    return write_build_record(tmp)  # last: it covers every file above


def _replace_dir(tmp: Path, output: Path) -> None:
    """Move the finished dataset into place, replacing an existing output (one this builder made, checked again
    now) only once the new one is complete."""
    if output.exists() or output.is_symlink():
        _check_replaceable(output)
        old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
        output.rename(old / output.name)
        tmp.rename(output)
        shutil.rmtree(old)
    else:
        tmp.rename(output)


def main(args: argparse.Namespace) -> int:
    _check_args(args)
    board = None if args.board is None else parse_board(args.board)
    train, test = sources.resolve(args.source, args.seed, args.test_source, board)
    if args.min_difficulty is not None:
        train = _filter_difficulty(train, args.min_difficulty, "train")
        test = _filter_difficulty(test, args.min_difficulty, "test")
    train = subsample(train, args.subsample_size, args.seed, _TRAIN_SUBSAMPLE_STREAM, "train")
    test = subsample(test, args.test_subsample_size, args.seed, _TEST_SUBSAMPLE_STREAM, "test")
    _refuse_repeats(train, test, args)

    train_inputs, train_labels = augment(train.questions, train.answers, args.num_aug, args.seed)
    # Tokens: +1 so that 0 is padding (inputs 1 = blank, 2..n+1 = digits; labels 2..n+1).
    for grids in (train_inputs, train_labels):
        np.add(grids, 1, out=grids)
    splits = {
        "train": (train_inputs, train_labels, 1 + args.num_aug),
        "test": (test.questions + np.uint8(1), test.answers + np.uint8(1), 1),
    }
    provenance = {
        "builder": f"trm {importlib.metadata.version('trm-study')}",
        "source": sources.describe(args.source),
        "test_source": None if args.test_source is None else sources.describe(args.test_source),
        "seed": args.seed,
        "subsample_size": args.subsample_size,
        "test_subsample_size": args.test_subsample_size,
        "num_aug": args.num_aug,
        "min_difficulty": args.min_difficulty,
    }

    output = Path(args.output_dir)
    with storage.write_errors(str(output)):  # a read-only or full disk: one line, not a traceback
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        with storage.write_errors(str(output)):
            tmp.chmod(0o755)  # mkdtemp makes it private; the dataset is an ordinary folder
            record = _write(tmp, splits, train.board, provenance)
            _replace_dir(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(
        f"wrote {output}: {train.board}, train {len(train_inputs)} examples ({len(train)} puzzles x "
        f"{1 + args.num_aug}), test {len(test)} examples; manifest {record.hash[:16]} ({len(record.entries)} files)"
    )
    return 0

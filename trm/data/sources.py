"""Resolve the builder's --source into train and test puzzles.

  FILE.csv[.gz]    one CSV: split by the seed into test (20%, at least 1 puzzle) and train (the rest),
                   each in file order; with --test-source the whole file is train.
  DIR              a folder holding train.csv and test.csv (or .csv.gz).
  hf:OWNER/REPO    train.csv and test.csv of a Hugging Face dataset repo, downloaded over HTTPS once into
                   the cache folder ($TRM_CACHE_DIR, default ~/.cache/trm) and read from there afterwards.
  generate:N       N generated puzzles for train and max(1, N // 4) further, distinct ones for test.

--test-source FILE replaces the test split of any source with the whole of FILE.

The board (trm/data/board.py): the one given (--board), whose size every row of every file must have; otherwise a
file's first puzzle's (16, 36, 64 or 81 cells), and then both splits must share it. generate:N makes puzzles of the
given board, by default 9x9.
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from trm import storage
from trm.data.board import SUDOKU, Board
from trm.data.generate import generate_puzzles
from trm.data.sudoku import Puzzles, read_csv
from trm.errors import UserError

HF_URL = "https://huggingface.co/datasets/{repo}/resolve/main/{name}"
DOWNLOAD_TIMEOUT_S = 10.0
TEST_FRACTION = 0.2
_SPLIT_STREAM = 0x5B1


def cache_dir() -> Path:
    return Path(os.environ.get("TRM_CACHE_DIR", Path.home() / ".cache" / "trm"))


def describe(source: str) -> str:
    """The source as recorded in dataset.json: the file or folder name for local paths (machine-independent)."""
    if source.startswith(("hf:", "generate:")):
        return source
    return Path(source).name


def _split_file(puzzles: Puzzles, seed: int) -> tuple[Puzzles, Puzzles]:
    if len(puzzles) < 2:
        raise UserError(
            f"a single source file needs at least 2 puzzles to split into train and test, found {len(puzzles)}"
        )
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, _SPLIT_STREAM])))
    order = rng.permutation(len(puzzles))
    num_test = max(1, int(len(puzzles) * TEST_FRACTION))
    return puzzles.take(np.sort(order[num_test:])), puzzles.take(np.sort(order[:num_test]))


def _find_csv(folder: Path, stem: str) -> Path:
    for name in (f"{stem}.csv", f"{stem}.csv.gz"):
        if (folder / name).is_file():
            return folder / name
    raise UserError(f"{folder}: no {stem}.csv or {stem}.csv.gz in this folder")


def download(url: str, target: Path, timeout: float = DOWNLOAD_TIMEOUT_S) -> None:
    """Download `url` to `target` through a temporary file, so an interrupted download leaves nothing behind."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, storage.local_writer(target) as sink:
            shutil.copyfileobj(response, sink, length=1 << 20)
    except (urllib.error.URLError, OSError) as err:  # the download's; a failed write is already a UserError
        reason = getattr(err, "reason", err)
        raise UserError(
            f"cannot download {url}: {reason} (is the network available?). Without network access, "
            f"download train.csv and test.csv by hand and pass their folder as --source"
        ) from None


def _hf_files(repo: str, timeout: float) -> tuple[Path, Path]:
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts):
        raise UserError(f"--source hf:{repo}: expected hf:OWNER/REPO, e.g. hf:sapientinc/sudoku-extreme")
    folder = cache_dir() / "hf" / parts[0] / parts[1]
    files = []
    for name in ("train.csv", "test.csv"):
        if not (folder / name).is_file():
            download(HF_URL.format(repo=repo, name=name), folder / name, timeout)
        files.append(folder / name)
    return files[0], files[1]


def _generate(spec: str, seed: int, board: Board) -> tuple[Puzzles, Puzzles]:
    try:
        count = int(spec)
    except ValueError:
        count = 0
    if count < 1:
        raise UserError(f"--source generate:{spec}: expected generate:N with N a positive integer")
    puzzles = generate_puzzles(count + max(1, count // 4), seed, board=board)
    return puzzles.take(np.arange(count)), puzzles.take(np.arange(count, len(puzzles)))


def resolve(
    source: str,
    seed: int,
    test_source: str | None = None,
    board: Board | None = None,
    timeout: float = DOWNLOAD_TIMEOUT_S,
) -> tuple[Puzzles, Puzzles]:
    """(train, test) puzzles of `board` (None: the files' own) for a --source string (see the module docstring).
    Raises UserError on bad input."""
    test_file: str | Path | None = test_source
    if source.startswith("generate:"):
        train, test = _generate(source.removeprefix("generate:"), seed, board or SUDOKU)
    else:
        if source.startswith("hf:"):
            train_file, split_file = _hf_files(source.removeprefix("hf:"), timeout)
        elif Path(source).is_dir():
            train_file = _find_csv(Path(source), "train")
            split_file = _find_csv(Path(source), "test") if test_source is None else None
        elif Path(source).is_file():
            train_file, split_file = Path(source), None
        else:
            raise UserError(f"--source {source}: no such file or folder (or use hf:OWNER/REPO or generate:N)")
        train = read_csv(train_file, board)
        if test_file is None and split_file is None:
            train, test = _split_file(train, seed)
        test_file = test_file or split_file
    if test_file is not None:
        test = read_csv(test_file, board)
        if test.board != train.board:
            raise UserError(
                f"{test_file}: puzzles of a {test.board.name} board, but the train split's ({source}) are "
                f"{train.board.name}; the splits must share a board"
            )
    return train, test

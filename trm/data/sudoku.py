"""Sudoku puzzles as arrays: read and validate Sudoku-Extreme style CSV files, check grids.

A grid of an n x n board (trm/data/board.py: 4x4, 6x6, 8x8 or 9x9) is n * n uint8 cells in row-major order:
0 = blank, 1..n = digits. A CSV file has a header naming the columns `source,question,answer,rating` (any order;
`source` and `rating` may be absent), then one puzzle per line: `question` is n * n characters of `.` or `1`-`n`,
`answer` is n * n digits `1`-`n`, `rating` is a non-negative integer difficulty (may be blank). The board is the
one the caller declares, or else the one whose cell count is the first question's length (16, 36, 64 or 81); every
row must match it. Every problem is reported as a UserError naming the file and the 1-based line number, counting
the header as line 1.
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from trm.data.board import SUDOKU, Board
from trm.errors import UserError

MISSING_RATING = -1
# The paper's 9x9 board's cells: the default puzzle length of the model commands' --seq-len (trm/model/config.py,
# kept byte-for-byte, since trm/model/ is part of the compiled steps' hash: trm/launch/accelerators.py).
NUM_CELLS = SUDOKU.cells

_INVALID = 255


def _lut(board: Board, blank: bool) -> np.ndarray:
    """Byte value -> cell value (or _INVALID): '1'..'n' the digits, and '.' a blank when `blank`."""
    lut = np.full(256, _INVALID, dtype=np.uint8)
    if blank:
        lut[ord(".")] = 0
    lut[ord("1") : ord("1") + board.n] = np.arange(1, board.n + 1)
    return lut


_CHUNK_ROWS = 65536  # rows parsed per batch: bounds the memory held in Python strings


@dataclass
class Puzzles:
    """A set of puzzles of one board: questions [N, cells] (0 = blank), answers [N, cells] (1..n), ratings [N]
    (-1 = none)."""

    questions: np.ndarray
    answers: np.ndarray
    ratings: np.ndarray

    def __len__(self) -> int:
        return len(self.questions)

    @property
    def board(self) -> Board:
        return Board.from_cells(self.questions.shape[1])

    def take(self, index: np.ndarray) -> Puzzles:
        """The puzzles at `index`, in that order."""
        return Puzzles(self.questions[index], self.answers[index], self.ratings[index])

    @staticmethod
    def concatenate(parts: list[Puzzles]) -> Puzzles:
        cells = parts[0].questions.shape[1]
        return Puzzles(
            np.concatenate([p.questions for p in parts]).reshape(-1, cells),
            np.concatenate([p.answers for p in parts]).reshape(-1, cells),
            np.concatenate([p.ratings for p in parts]),
        )


def valid_solutions(grids: np.ndarray) -> np.ndarray:
    """For grids [N, cells] of digits, a bool [N]: every row, column and box holds 1..n exactly once."""
    board = Board.from_cells(grids.shape[-1])
    g = grids.reshape(-1, board.n, board.n)
    bits = np.left_shift(np.uint16(1), g.astype(np.uint16))
    # n cells whose bits OR to all n digits must hold n distinct digits.
    ok = np.ones(len(g), dtype=bool)
    for units in (bits, bits.transpose(0, 2, 1), board.boxes(bits)):
        ok &= (np.bitwise_or.reduce(units, axis=2) == board.all_digits).all(axis=1)
    return ok


def _first_repeat(grid: np.ndarray) -> str:
    """Where a solution grid [cells] repeats a digit, in words: the first row, column or box that does."""
    board = Board.from_cells(len(grid))
    g = grid.reshape(board.n, board.n)
    units = [(f"row {r + 1}", g[r, :]) for r in range(board.n)]
    units += [(f"column {c + 1}", g[:, c]) for c in range(board.n)]
    units += [(f"box {b + 1}", cells) for b, cells in enumerate(board.boxes(g))]
    for name, cells in units:
        digits, counts = np.unique(cells, return_counts=True)
        if (counts > 1).any():
            return f"digit {int(digits[counts > 1][0])} appears {int(counts[counts > 1][0])} times in {name}"
    return "some row, column or box repeats a digit"


def consistent(questions: np.ndarray, answers: np.ndarray) -> np.ndarray:
    """A bool [N]: every given (non-zero) cell of the question equals the answer's cell."""
    return ((questions == 0) | (questions == answers)).all(axis=1)


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="")


def _decode(
    path: Path, texts: list[str], lines: np.ndarray, board: Board, blank: bool, what: str, why: str
) -> np.ndarray:
    """Turn strings of one character per cell into an [N, cells] uint8 array, reporting the first bad line."""
    cells = board.cells
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    bad = np.flatnonzero(lengths != cells)
    if bad.size:
        i = bad[0]
        raise UserError(
            f"{path}, line {lines[i]}: {what} has {lengths[i]} characters, expected {cells} "
            f"(a {board.name} board, {why})"
        )
    # 'replace' turns each non-ASCII character into one '?', so every string keeps one byte per cell.
    raw = np.frombuffer("".join(texts).encode("ascii", "replace"), dtype=np.uint8).reshape(-1, cells)
    grid = _lut(board, blank)[raw]
    bad_rows = np.flatnonzero((grid == _INVALID).any(axis=1))
    if bad_rows.size:
        i = bad_rows[0]
        col = int(np.flatnonzero(grid[i] == _INVALID)[0])
        allowed = ("'.' or " if blank else "") + f"1-{board.n}"
        raise UserError(
            f"{path}, line {lines[i]}: {what} has {texts[i][col]!r} at position {col + 1}; "
            f"allowed: {allowed} (a {board.name} board, {why})"
        )
    return grid


def _parse_ratings(path: Path, texts: list[str], lines: np.ndarray) -> np.ndarray:
    ratings = np.full(len(texts), MISSING_RATING, dtype=np.int64)
    for i, text in enumerate(texts):
        text = text.strip()
        if not text:
            continue
        try:
            ratings[i] = int(text)
        except ValueError:
            raise UserError(f"{path}, line {lines[i]}: rating {text!r} is not an integer") from None
        if ratings[i] < 0:
            raise UserError(f"{path}, line {lines[i]}: rating {text!r} is negative")
    return ratings


def _convert_chunk(
    path: Path, rows: tuple[list[str], list[str], list[str]], lines: list[int], board: Board, why: str
) -> Puzzles:
    line_numbers = np.asarray(lines)
    questions = _decode(path, rows[0], line_numbers, board, True, "question", why)
    answers = _decode(path, rows[1], line_numbers, board, False, "answer", why)
    bad = np.flatnonzero(~consistent(questions, answers))
    if bad.size:
        i = bad[0]
        cell = int(np.flatnonzero((questions[i] != 0) & (questions[i] != answers[i]))[0])
        raise UserError(
            f"{path}, line {line_numbers[i]}: answer does not match the question's given digit at "
            f"position {cell + 1} (row {cell // board.n + 1}, column {cell % board.n + 1})"
        )
    bad = np.flatnonzero(~valid_solutions(answers))
    if bad.size:
        raise UserError(
            f"{path}, line {line_numbers[bad[0]]}: answer is not a valid Sudoku solution: "
            f"{_first_repeat(answers[bad[0]])}"
        )
    return Puzzles(questions, answers, _parse_ratings(path, rows[2], line_numbers))


def _printable(text: str, limit: int = 80) -> str:
    """`text` safe to show on a terminal: control and binary characters escaped, long text cut."""
    shown = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _board_of(path: Path, line: int, question: str) -> Board:
    """The board whose cell count is the length of `question`, the file's first."""
    try:
        return Board.from_cells(len(question))
    except UserError as err:
        raise UserError(f"{path}, line {line}: question has {len(question)} characters; {err}") from None


def read_csv(path: str | Path, board: Board | None = None) -> Puzzles:
    """Read and validate a Sudoku-Extreme style CSV file (plain or .gz) of puzzles of `board`, by default the board
    of the first question's length. Raises UserError on bad input, a row of another board's size included."""
    path = Path(path)
    why = "as declared" if board is not None else "the first puzzle's size"
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    parts: list[Puzzles] = []
    with _open_text(path) as f, tqdm(desc=f"reading {path.name}", unit=" rows", mininterval=1.0) as bar:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header is None:
                raise UserError(
                    f"{path}, line 1: file is empty; expected the header source,question,answer,rating"
                )
            header = [name.strip() for name in header]
            missing = [name for name in ("question", "answer") if name not in header]
            if missing:
                raise UserError(
                    f"{path}, line 1: missing column(s) {', '.join(missing)}; "
                    f"expected the header source,question,answer,rating, found {_printable(','.join(header))}"
                )
            q_col, a_col = header.index("question"), header.index("answer")
            r_col = header.index("rating") if "rating" in header else None
            rows: tuple[list[str], list[str], list[str]] = ([], [], [])
            lines: list[int] = []
            for row in reader:
                if not row:
                    continue  # blank line
                if len(row) != len(header):
                    raise UserError(
                        f"{path}, line {reader.line_num}: expected {len(header)} fields "
                        f"({','.join(header)}), found {len(row)}"
                    )
                if board is None:
                    board = _board_of(path, reader.line_num, row[q_col])
                rows[0].append(row[q_col])
                rows[1].append(row[a_col])
                rows[2].append(row[r_col] if r_col is not None else "")
                lines.append(reader.line_num)
                if len(lines) == _CHUNK_ROWS:
                    parts.append(_convert_chunk(path, rows, lines, board, why))
                    bar.update(len(lines))
                    rows, lines = ([], [], []), []
        except csv.Error as err:
            raise UserError(f"{path}, line {reader.line_num}: malformed CSV: {err}") from None
        except (OSError, EOFError) as err:  # e.g. a truncated or corrupt .gz file
            raise UserError(f"{path}: cannot read: {err}") from None
        if lines:
            parts.append(_convert_chunk(path, rows, lines, board, why))
            bar.update(len(lines))
    if not parts:
        raise UserError(f"{path}, line 2: no puzzles after the header")
    return Puzzles.concatenate(parts)

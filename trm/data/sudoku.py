"""Sudoku puzzles as arrays: read and validate Sudoku-Extreme style CSV files, check grids.

A grid is 81 uint8 cells in row-major order: 0 = blank, 1..9 = digits. A CSV file has a header naming
the columns `source,question,answer,rating` (any order; `source` and `rating` may be absent), then one
puzzle per line: `question` is 81 characters of `.` or `1`-`9`, `answer` is 81 digits `1`-`9`, `rating`
is a non-negative integer difficulty (may be blank). Every problem is reported as a UserError naming
the file and the 1-based line number, counting the header as line 1.
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from trm.errors import UserError

NUM_CELLS = 81
MISSING_RATING = -1
ALL_DIGITS_MASK = 0b1111111110  # bits 1..9 set: a row, column or box holding every digit once

_INVALID = 255
# Byte value -> cell value (or _INVALID) for questions ('.' blank, '1'-'9') and answers ('1'-'9').
_QUESTION_LUT = np.full(256, _INVALID, dtype=np.uint8)
_QUESTION_LUT[ord(".")] = 0
_QUESTION_LUT[ord("1") : ord("9") + 1] = np.arange(1, 10)
_ANSWER_LUT = np.full(256, _INVALID, dtype=np.uint8)
_ANSWER_LUT[ord("1") : ord("9") + 1] = np.arange(1, 10)

_CHUNK_ROWS = 65536  # rows parsed per batch: bounds the memory held in Python strings


@dataclass
class Puzzles:
    """A set of puzzles: questions [N, 81] (0 = blank), answers [N, 81] (1..9), ratings [N] (-1 = none)."""

    questions: np.ndarray
    answers: np.ndarray
    ratings: np.ndarray

    def __len__(self) -> int:
        return len(self.questions)

    def take(self, index: np.ndarray) -> Puzzles:
        """The puzzles at `index`, in that order."""
        return Puzzles(self.questions[index], self.answers[index], self.ratings[index])

    @staticmethod
    def concatenate(parts: list[Puzzles]) -> Puzzles:
        return Puzzles(
            np.concatenate([p.questions for p in parts]).reshape(-1, NUM_CELLS),
            np.concatenate([p.answers for p in parts]).reshape(-1, NUM_CELLS),
            np.concatenate([p.ratings for p in parts]),
        )


def valid_solutions(grids: np.ndarray) -> np.ndarray:
    """For grids [N, 81] of digits, a bool [N]: every row, column and 3x3 box holds 1..9 exactly once."""
    g = grids.reshape(-1, 9, 9)
    bits = np.left_shift(np.uint16(1), g.astype(np.uint16))
    boxes = bits.reshape(-1, 3, 3, 3, 3).transpose(0, 1, 3, 2, 4).reshape(-1, 9, 9)
    # 9 cells whose bits OR to all nine digits must hold nine distinct digits.
    ok = np.ones(len(g), dtype=bool)
    for units in (bits, bits.transpose(0, 2, 1), boxes):
        ok &= (np.bitwise_or.reduce(units, axis=2) == ALL_DIGITS_MASK).all(axis=1)
    return ok


def _first_repeat(grid: np.ndarray) -> str:
    """Where a solution grid [81] repeats a digit, in words: the first row, column or box that does."""
    g = grid.reshape(9, 9)
    units = [(f"row {r + 1}", g[r, :]) for r in range(9)] + [(f"column {c + 1}", g[:, c]) for c in range(9)]
    units += [
        (f"box {b + 1}", g[b // 3 * 3 : b // 3 * 3 + 3, b % 3 * 3 : b % 3 * 3 + 3].ravel()) for b in range(9)
    ]
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
    path: Path, texts: list[str], lines: np.ndarray, lut: np.ndarray, what: str, allowed: str
) -> np.ndarray:
    """Turn 81-character strings into an [N, 81] uint8 array via `lut`, reporting the first bad line."""
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    bad = np.flatnonzero(lengths != NUM_CELLS)
    if bad.size:
        i = bad[0]
        raise UserError(f"{path}, line {lines[i]}: {what} has {lengths[i]} characters, expected {NUM_CELLS}")
    # 'replace' turns each non-ASCII character into one '?', so every string stays 81 bytes long.
    raw = np.frombuffer("".join(texts).encode("ascii", "replace"), dtype=np.uint8).reshape(-1, NUM_CELLS)
    cells = lut[raw]
    bad_rows = np.flatnonzero((cells == _INVALID).any(axis=1))
    if bad_rows.size:
        i = bad_rows[0]
        col = int(np.flatnonzero(cells[i] == _INVALID)[0])
        raise UserError(
            f"{path}, line {lines[i]}: {what} has {texts[i][col]!r} at position {col + 1}; allowed: {allowed}"
        )
    return cells


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


def _convert_chunk(path: Path, rows: tuple[list[str], list[str], list[str]], lines: list[int]) -> Puzzles:
    line_numbers = np.asarray(lines)
    questions = _decode(path, rows[0], line_numbers, _QUESTION_LUT, "question", "'.' or 1-9")
    answers = _decode(path, rows[1], line_numbers, _ANSWER_LUT, "answer", "1-9")
    bad = np.flatnonzero(~consistent(questions, answers))
    if bad.size:
        i = bad[0]
        cell = int(np.flatnonzero((questions[i] != 0) & (questions[i] != answers[i]))[0])
        raise UserError(
            f"{path}, line {line_numbers[i]}: answer does not match the question's given digit at "
            f"position {cell + 1} (row {cell // 9 + 1}, column {cell % 9 + 1})"
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


def read_csv(path: str | Path) -> Puzzles:
    """Read and validate a Sudoku-Extreme style CSV file (plain or .gz). Raises UserError on bad input."""
    path = Path(path)
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
                rows[0].append(row[q_col])
                rows[1].append(row[a_col])
                rows[2].append(row[r_col] if r_col is not None else "")
                lines.append(reader.line_num)
                if len(lines) == _CHUNK_ROWS:
                    parts.append(_convert_chunk(path, rows, lines))
                    bar.update(len(lines))
                    rows, lines = ([], [], []), []
        except csv.Error as err:
            raise UserError(f"{path}, line {reader.line_num}: malformed CSV: {err}") from None
        except (OSError, EOFError) as err:  # e.g. a truncated or corrupt .gz file
            raise UserError(f"{path}: cannot read: {err}") from None
        if lines:
            parts.append(_convert_chunk(path, rows, lines))
            bar.update(len(lines))
    if not parts:
        raise UserError(f"{path}, line 2: no puzzles after the header")
    return Puzzles.concatenate(parts)

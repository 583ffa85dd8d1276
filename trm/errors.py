"""Errors that reach the user as one clear line and exit code 2, not a traceback: bad input (`UserError`, and the
command-line numbers that `number` refuses) and the system's refusals that the user can fix (a full disk, a
read-only folder: `system_refusal`, which trm/cli.py applies to any OSError a command meets)."""

from __future__ import annotations

import argparse
import errno
import math
import operator
from collections.abc import Callable

# The system's refusals that the user can fix, and how: a full disk, a place they may not write, a wrong path.
_FULL = "free some space (or choose another place) and run the command again"
_READ_ONLY = "choose a writable place or make its folder writable"
_FIXES = {
    **dict.fromkeys((errno.ENOSPC, errno.EDQUOT, errno.EFBIG), _FULL),
    **dict.fromkeys((errno.EACCES, errno.EPERM, errno.EROFS), _READ_ONLY),
    errno.ENOENT: "check the path",
    errno.EISDIR: "give the path of a file in it",
    errno.ENOTDIR: "a folder on the way is a file: choose another path",
    errno.EEXIST: "choose another path",
}


class UserError(Exception):
    """Bad input from the user: a file, field or value that cannot be used.

    The message must name the offending file, field or line. The CLI prints it and exits with code 2.
    """

    exit_code = 2


def fix_for(err: OSError) -> str | None:
    """What the user can do about the system's refusal `err` (a full disk, a read-only folder...); None when it is
    none of those."""
    return _FIXES.get(err.errno)


def system_refusal(err: OSError) -> str | None:
    """One line for an OSError that names a path the user can fix (`fix_for`): the path, the system's reason and
    what to do. None for any other (a network error, a bug): their traceback is worth reading."""
    fix = fix_for(err)
    if fix is None or not err.filename:
        return None
    return f"{err.filename}: {err.strerror or err}; {fix}"


def number(
    kind: type[int] | type[float] = int,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
) -> Callable[[str], float]:
    """An argparse `type` for a command-line number: a finite int or float within the bounds given (`minimum` and
    `maximum` inclusive, `above` exclusive), else argparse's refusal (one line: trm/cli.py) naming the option, the
    bounds and the value given, such as a count of -5, a nan or an inf."""
    checks = [(">=", minimum, operator.ge), (">", above, operator.gt), ("<=", maximum, operator.le)]
    checks = [(word, bound, holds) for word, bound, holds in checks if bound is not None]
    expected = ("an integer " if kind is int else "a number ") + " and ".join(
        f"{w} {b:g}" for w, b, _ in checks
    )

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not all(holds(value, bound) for _, bound, holds in checks):
            raise argparse.ArgumentTypeError(f"expected {expected.strip()}, got {text!r}")
        return value

    return parse

"""Which checkout's repository files (config/, docs/) the commands read.

The checkout holding the current directory (a folder with a Snakefile and config/base.yaml), so that two checkouts
sharing one environment each read their own files; else the folder this package is installed from (a checkout for
an editable install; site-packages for a wheel, where commands read resolved configs, not config/).
"""

from __future__ import annotations

from pathlib import Path

INSTALLED_FROM = Path(__file__).resolve().parents[1]


def _working_checkout() -> Path:
    try:
        here = Path.cwd().resolve()
    except OSError:  # the current directory was deleted
        return INSTALLED_FROM
    for folder in (here, *here.parents):
        if (folder / "Snakefile").is_file() and (folder / "config" / "base.yaml").is_file():
            return folder
    return INSTALLED_FROM


CHECKOUT = _working_checkout()


def checkout_path(relative: str) -> str:
    """The one way to find a file of the checkout (config/, docs/, profiles/), e.g. 'config/groups.yaml': in
    CHECKOUT, spelled as given when the current directory is CHECKOUT's root (the workflow's case: messages then
    name short paths), else in full."""
    try:
        here = Path.cwd().resolve()
    except OSError:
        here = None
    return relative if here == CHECKOUT else str(CHECKOUT / relative)


def foreign_checkout_note() -> str | None:
    """One line when the files come from another checkout than the code (an environment shared by checkouts)."""
    if CHECKOUT == INSTALLED_FROM or not (INSTALLED_FROM / "Snakefile").is_file():
        return None
    return (
        f"note: reading config/ and docs/ of {CHECKOUT} (the current directory's checkout); the trm code runs "
        f"from {INSTALLED_FROM} (installed in this environment)"
    )

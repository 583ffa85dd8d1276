"""Proof that the test suite leaves the machine's own files alone: `snapshot FILE` before the suite, `compare
FILE` after it (make test runs both around pytest).

What it watches: every file in /usr/bin and /usr/local/bin, resolved through its links (so a test that wrote
*through* /usr/bin/gcloud into the Cloud SDK shows up), by size and SHA-256; and the user-level folders a test
could reach through HOME: ~/.cache/trm and ~/.config/snakemake, by the names, sizes and mtimes of their files.
A difference is printed with the path and fails with exit 1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from trm.data.format import sha256_file

SYSTEM_FOLDERS = (Path("/usr/bin"), Path("/usr/local/bin"))
USER_FOLDERS = (Path.home() / ".cache" / "trm", Path.home() / ".config" / "snakemake")


def snapshot() -> dict[str, str]:
    """Path -> a fingerprint of what it resolves to (target, size, SHA-256) or of the user file."""
    seen: dict[str, str] = {}
    for folder in SYSTEM_FOLDERS:
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            try:
                target = entry.resolve()
                if target.is_file():
                    seen[str(entry)] = f"{target} {target.stat().st_size} {sha256_file(target)}"
                else:
                    seen[str(entry)] = f"{target} (not a file)"
            except OSError as error:  # a dangling link, an unreadable file: record that, it must not change
                seen[str(entry)] = f"unreadable: {error.strerror}"
    for folder in USER_FOLDERS:
        for root, _, names in os.walk(folder):
            for name in names:
                path = Path(root) / name
                try:
                    info = path.lstat()
                    seen[str(path)] = f"{info.st_size} {info.st_mtime_ns}"
                except OSError:
                    continue
    return seen


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("snapshot", "compare"):
        print("usage: python tests/system_guard.py snapshot|compare FILE", file=sys.stderr)
        return 2
    verb, file = argv
    now = snapshot()
    if verb == "snapshot":
        Path(file).write_text(json.dumps(now))
        print(f"system guard: {len(now)} system and user files recorded in {file}")
        return 0
    before = json.loads(Path(file).read_text())
    changed = sorted(path for path in before.keys() | now.keys() if before.get(path) != now.get(path))
    for path in changed:
        print(f"system guard: CHANGED {path}: {before.get(path, 'absent')} -> {now.get(path, 'absent')}")
    if changed:
        print(f"system guard: the test suite changed {len(changed)} files outside its temporary folders")
        return 1
    print(f"system guard: {len(now)} system and user files unchanged by the test suite")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

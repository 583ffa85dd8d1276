"""The pool of slices on the controller: a lock file per slice, so two training jobs never share one."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def acquire_slice(
    slices: tuple[str, ...], zone: str, lock_dir: Path, poll_seconds: float, log: Callable[[str], None]
) -> Iterator[str]:
    """Lock a free slice of the pool for this job (waiting while all are taken); yields its name.

    The lock is an flock on LOCK_DIR/ZONE-NAME.lock, released when the job's process ends, however it ends.
    """
    lock_dir.mkdir(parents=True, exist_ok=True)
    waiting = False
    while True:
        for name in slices:
            handle = open(lock_dir / f"{zone}-{name}.lock", "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                handle.seek(0)
                handle.truncate()
                handle.write(f"{os.getpid()}\n")
                handle.flush()
                yield name
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        if not waiting:
            waiting = True
            log(f"every slice of the pool {list(slices)} is in use by another job; waiting")
        time.sleep(poll_seconds)

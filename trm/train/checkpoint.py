"""Checkpoints of the whole training state with orbax, in the run dir (local path, file:// or gs://).

A checkpoint holds everything a resumed run needs to continue bit-for-bit: parameters, EMA, optimizer states, the
ACT carry, the step and the RNG key, plus a small JSON record (config hash, epoch, wall time). Data order is a
pure function of the step (see trm/train/batches.py), so the step is the data position.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jax
import orbax.checkpoint as ocp

from trm import storage
from trm.errors import UserError, fix_for


def orbax_path(url: str) -> Any:
    """Orbax takes local paths as plain strings and GCS as gs:// URLs (through etils.epath)."""
    fs, path = storage.filesystem(url)
    return url if url.startswith("gs://") else path


def read_checkpoint(where: str, read: Any) -> Any:
    """`read()`, with orbax's and tensorstore's errors on a damaged checkpoint (a missing item, a truncated or
    garbled file) turned into one line naming the checkpoint."""
    try:
        return read()
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - orbax raises KeyError, ValueError, OSError, tensorstore errors...
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise UserError(
            f"{where}: the checkpoint cannot be read ({type(err).__name__}: {reason}); it is damaged or "
            "incomplete: delete this step's folder to use the previous checkpoint, or retrain"
        ) from None


def _system_refusal(err: BaseException) -> OSError | None:
    """The system's refusal (a full disk, a read-only folder: errors.fix_for) behind an orbax error: an OSError in
    its chain, or the errno that tensorstore writes into its message (`[os_error_code='28']`)."""
    while err is not None:
        if isinstance(err, OSError) and fix_for(err):
            return err
        found = re.search(r"os_error_code='?(\d+)", str(err))
        if found:
            code = int(found[1])
            refusal = OSError(code, os.strerror(code))
            return refusal if fix_for(refusal) else None
        err = err.__cause__ or err.__context__
    return None


def _without_orbax_traceback(record: logging.LogRecord) -> bool:
    """A logging filter: orbax's report of a failed thread, without the thread's traceback."""
    if "orbax" in record.pathname:
        record.exc_info, record.exc_text = None, None
    return True


def _quiet_failed_saves() -> None:
    """Keep a failed asynchronous save to one line of ours: orbax logs each failing thread's traceback, and
    tensorstore's callbacks, still arriving after orbax closed their event loop, print "Event loop is closed"
    dozens of times (then the abandoned writes, at exit). The messages stay, the tracebacks go."""
    logging.getLogger("absl").addFilter(_without_orbax_traceback)  # once: a filter is added once
    previous = sys.unraisablehook
    if getattr(previous, "quiets_orbax", False):
        return

    def hook(unraisable: Any) -> None:
        closed_loop = isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(
            unraisable.exc_value
        )
        code = getattr(unraisable.object, "cr_code", None)  # a coroutine orbax left behind
        if not (closed_loop or (code is not None and "orbax" in code.co_filename)):
            previous(unraisable)

    hook.quiets_orbax = True
    sys.unraisablehook = hook


class Checkpointer:
    """Keeps the last `keep` checkpoints of a run; saves every `every_steps` steps or when forced. A save that the
    storage refuses (full, read-only) is a UserError naming the checkpoint and what to do, raised by the next
    `save` or `wait` (saves are asynchronous); the run resumes from its last complete checkpoint."""

    def __init__(self, directory_url: str, keep: int, every_steps: int) -> None:
        _quiet_failed_saves()
        self.every_steps = every_steps
        self.directory_url = directory_url
        self._pending: int | None = None  # the step of the save that may still be running
        self._manager = ocp.CheckpointManager(
            orbax_path(directory_url),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, create=True, enable_async_checkpointing=True
            ),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def due(self, step: int) -> bool:
        return step % self.every_steps == 0

    def save(self, step: int, state: Any, record: dict[str, Any]) -> None:
        """Start an asynchronous save of `state` (a pytree of arrays) and `record` (JSON) at `step`."""
        if step in self._manager.all_steps():
            return
        with self._refusals(step):
            self._manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), record=ocp.args.JsonSave(record)),
                force=True,
            )
        self._pending = step

    def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """Restore the state at `step` with the structure, shapes, dtypes and shardings of `like`."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract), record=ocp.args.JsonRestore())
        restored = read_checkpoint(
            f"{self.directory_url}/{step}", lambda: self._manager.restore(step, args=args)
        )
        return restored.state, dict(restored.record)

    def wait(self) -> None:
        """Block until pending saves are committed (call before exit and before writing a 'done' marker)."""
        with self._refusals(None):
            self._manager.wait_until_finished()
        self._pending = None

    @contextmanager
    def _refusals(self, step: int | None) -> Iterator[None]:
        """Turn the storage's refusal of a save (of the pending step, whose failure orbax raises at the next call,
        else of `step`) into one line naming it and what to do; any other error passes as it is."""
        try:
            yield
        except Exception as err:
            refusal = _system_refusal(err)
            if refusal is None:
                raise
            failed = self._pending if self._pending is not None else step
            raise UserError(
                f"{self.directory_url}/{failed}: cannot save the checkpoint: {refusal.strerror}; "
                f"{fix_for(refusal)}: the run resumes from its last complete checkpoint"
            ) from None

    def close(self) -> None:
        self._manager.close()

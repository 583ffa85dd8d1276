"""Checkpoints of the whole training state with orbax, in the run dir (local path, file:// or gs://).

A checkpoint holds everything a resumed run needs to continue bit-for-bit: parameters, EMA, optimizer states, the
ACT carry, the step and the RNG key, plus a small JSON record (config hash, epoch, wall time). Data order is a
pure function of the step (see trm/train/batches.py), so the step is the data position.
"""

from __future__ import annotations

from typing import Any

import jax
import orbax.checkpoint as ocp

from trm import storage
from trm.errors import UserError


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


class Checkpointer:
    """Keeps the last `keep` checkpoints of a run; saves every `every_steps` steps or when forced."""

    def __init__(self, directory_url: str, keep: int, every_steps: int) -> None:
        self.every_steps = every_steps
        self.directory_url = directory_url
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
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), record=ocp.args.JsonSave(record)),
            force=True,
        )

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
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

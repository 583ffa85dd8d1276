"""A checkpoint the storage refuses (a full disk, a file-size quota): one line naming it and what to do instead of
hundreds of lines of orbax's and tensorstore's tracebacks, and the run resumes from its last complete checkpoint.

The refusal is real, not a mock: the saving process's file-size limit (RLIMIT_FSIZE, which any user may lower)
makes the kernel refuse tensorstore's write with EFBIG, as a full disk refuses it with ENOSPC (measured by hand
on a 1 MiB tmpfs, which needs privileges CI may not have: the same one line, with "No space left on device").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def state(step: int) -> dict[str, np.ndarray]:
    """3 MiB of random numbers (compression cannot make them small), a function of the step."""
    rng = np.random.default_rng(step)
    return {f"w{i}": rng.standard_normal((160, 160), np.float32) for i in range(30)}


# Saves step 1, then, with files limited to 64 KiB, step 2: its refusal reaches `wait`.
SAVE = """
import resource, signal, sys
from trm.platform import choose_platform
choose_platform()  # as `trm` does first: no libtpu probing on a machine without a TPU
from test_full_disk import state
from trm.errors import UserError
from trm.train.checkpoint import Checkpointer

checkpoints = Checkpointer(sys.argv[1], keep=3, every_steps=1)
checkpoints.save(1, state(1), {"step": 1})
checkpoints.wait()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
try:
    checkpoints.save(2, state(2), {"step": 2})
    checkpoints.wait()
except UserError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.slow  # a process of its own, importing JAX and orbax
def test_a_refused_checkpoint_is_one_line_and_the_run_resumes_from_the_last_complete_one(tmp_path):
    import jax

    from trm.train.checkpoint import Checkpointer

    folder = str(tmp_path / "ckpt")
    refused = subprocess.run(
        [sys.executable, "-c", SAVE, folder],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = refused.stderr.splitlines()
    assert lines[-1] == (
        f"error: {folder}/2: cannot save the checkpoint: File too large; free some space (or choose another "
        "place) and run the command again: the run resumes from its last complete checkpoint"
    )
    # Orbax's one-line reports of its failed threads stay; their tracebacks and tensorstore's late callbacks go.
    assert len(lines) <= 6 and all(line.startswith("ERROR:absl:") for line in lines[:-1]), lines
    assert "Traceback" not in refused.stderr and "Event loop is closed" not in refused.stderr
    # Space freed, the run resumes: from step 1, and step 2 is saved again.
    checkpoints = Checkpointer(folder, keep=3, every_steps=1)
    assert checkpoints.latest_step() == 1
    restored, record = checkpoints.restore(1, jax.tree.map(np.zeros_like, state(0)))
    assert record == {"step": 1} and all(np.array_equal(restored[k], v) for k, v in state(1).items())
    checkpoints.save(2, state(2), {"step": 2})
    checkpoints.wait()
    assert checkpoints.latest_step() == 2


def test_tensorstores_report_of_a_full_disk_is_recognised():
    from trm.train.checkpoint import _system_refusal

    # As tensorstore reported a checkpoint that filled a 1 MiB tmpfs (the run dir of `trm train`).
    error = ValueError(
        'RESOURCE_EXHAUSTED: Error writing "opt_state.mu.layers.0.mlp_t.gate_up_proj.weight/0.0" in OCDBT database '
        'at local file "/tmp/full/run/ckpt/8.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/": '
        'Failed writing: "/tmp/full/run/ckpt/8.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/d/'
        'd0b84e1ef05bd887c5e6472e95d79d81": Failed to write 29322 bytes to file 4: No space left on device '
        "[os_error_code='28']"
    )
    assert _system_refusal(error).strerror == "No space left on device"
    assert _system_refusal(ValueError("INVALID_ARGUMENT: a shape")) is None  # anything else passes as it is

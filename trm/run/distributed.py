"""Multi-host setup: `jax.distributed` initialisation, the data-parallel mesh and checks across hosts.

A TPU v4-64 is 8 processes (one per host) x 4 devices. Every process runs the same program; parameters are
replicated over a one-axis mesh "data" of all devices, batches are split over it, and each process builds
only its own rows of a global batch. On a TPU VM `jax.distributed.initialize()` detects the slice by itself
(`--distributed-auto` or TRM_DISTRIBUTED=auto); on CPU (tests, the local launcher) the coordinator address,
process count and process id come from flags or TRM_COORDINATOR, TRM_NUM_PROCESSES, TRM_PROCESS_ID.

Timeouts are short on purpose: a dead host must bring the others down within about a heartbeat timeout
instead of leaving them blocked in a collective.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from trm.checkout import INSTALLED_FROM
from trm.errors import UserError, number

DATA_AXIS = "data"
ENV_DISTRIBUTED = "TRM_DISTRIBUTED"
ENV_COORDINATOR = "TRM_COORDINATOR"
ENV_NUM_PROCESSES = "TRM_NUM_PROCESSES"
ENV_PROCESS_ID = "TRM_PROCESS_ID"
ENV_HEARTBEAT_TIMEOUT = "TRM_HEARTBEAT_TIMEOUT"
ENV_INIT_TIMEOUT = "TRM_INIT_TIMEOUT"
ENV_SHUTDOWN_TIMEOUT = "TRM_SHUTDOWN_TIMEOUT"
# XLA's CPU client sizes its thread pool by this variable (default: the schedulable cores).
ENV_XLA_CPU_THREADS = "NPROC"
# Seconds, when neither a flag nor its variable sets them.
DEFAULT_TIMEOUTS = {"heartbeat_timeout": 60, "init_timeout": 300, "shutdown_timeout": 60}


@dataclass(frozen=True)
class DistributedOptions:
    """How this process joins the job. mode: "off" (one process), "auto" (TPU VM) or "explicit"."""

    mode: str
    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    heartbeat_timeout: int
    init_timeout: int
    shutdown_timeout: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("multi-host (default: one process; flags override TRM_* variables)")
    group.add_argument(
        "--distributed-auto",
        action="store_true",
        help=f"join a TPU slice, detected automatically (or {ENV_DISTRIBUTED}=auto)",
    )
    group.add_argument("--coordinator", help=f"HOST:PORT of process 0 (or {ENV_COORDINATOR})")
    group.add_argument(
        "--num-processes", type=number(int, minimum=1), help=f"number of processes (or {ENV_NUM_PROCESSES})"
    )
    group.add_argument(
        "--process-id", type=number(int, minimum=0), help=f"this process, 0..N-1 (or {ENV_PROCESS_ID})"
    )
    group.add_argument(
        "--heartbeat-timeout",
        type=number(int, minimum=1),
        help=f"seconds before a silent host is declared dead ({ENV_HEARTBEAT_TIMEOUT})",
    )
    group.add_argument(
        "--init-timeout",
        type=number(int, minimum=1),
        help=f"seconds to wait for all hosts to join ({ENV_INIT_TIMEOUT})",
    )
    group.add_argument(
        "--shutdown-timeout",
        type=number(int, minimum=1),
        help=f"seconds to wait for all hosts at exit ({ENV_SHUTDOWN_TIMEOUT})",
    )


def _int_setting(flag_value: int | None, env: str, flag: str, default: int | None) -> int | None:
    if flag_value is not None:
        return flag_value
    text = os.environ.get(env, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{env}={text!r}: expected an integer (or pass {flag})") from None


def options_from_args(args: argparse.Namespace) -> DistributedOptions:
    """The distributed settings of `args` (see `add_arguments`), completed from the environment."""
    coordinator = args.coordinator or os.environ.get(ENV_COORDINATOR) or None
    auto = args.distributed_auto or os.environ.get(ENV_DISTRIBUTED, "").strip().lower() == "auto"
    variables = {
        "heartbeat_timeout": ENV_HEARTBEAT_TIMEOUT,
        "init_timeout": ENV_INIT_TIMEOUT,
        "shutdown_timeout": ENV_SHUTDOWN_TIMEOUT,
    }
    timeouts = {
        name: _int_setting(getattr(args, name), env, f"--{name.replace('_', '-')}", DEFAULT_TIMEOUTS[name])
        for name, env in variables.items()
    }
    for name, value in timeouts.items():
        if value < 1:
            raise UserError(f"--{name.replace('_', '-')} {value}: must be >= 1 second")
    if auto:
        return DistributedOptions("auto", None, None, None, **timeouts)
    num_processes = _int_setting(args.num_processes, ENV_NUM_PROCESSES, "--num-processes", None)
    process_id = _int_setting(args.process_id, ENV_PROCESS_ID, "--process-id", None)
    if coordinator is None:
        if num_processes not in (None, 1) or process_id not in (None, 0):
            raise UserError(
                f"--num-processes/--process-id need --coordinator HOST:PORT (or {ENV_COORDINATOR})"
            )
        return DistributedOptions("off", None, None, None, **timeouts)
    if num_processes is None or process_id is None:
        raise UserError(
            f"--coordinator {coordinator} needs --num-processes and --process-id "
            f"(or {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID})"
        )
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise UserError(f"--process-id {process_id} must lie in 0..{num_processes - 1} (--num-processes)")
    return DistributedOptions("explicit", coordinator, num_processes, process_id, **timeouts)


def initialize(options: DistributedOptions) -> None:
    """Join the job. Call before anything touches a device; does nothing for mode "off"."""
    if options.mode == "off":
        return
    if options.mode == "explicit":
        size_cpu_thread_pool(options.num_processes)
    import jax

    timeouts = {
        "initialization_timeout": options.init_timeout,
        "heartbeat_timeout_seconds": options.heartbeat_timeout,
        "shutdown_timeout_seconds": options.shutdown_timeout,
    }
    if options.mode == "auto":
        jax.distributed.initialize(**timeouts)
    else:
        jax.distributed.initialize(
            coordinator_address=options.coordinator,
            num_processes=options.num_processes,
            process_id=options.process_id,
            **timeouts,
        )
        if jax.default_backend() == "cpu":
            cache_from_every_process()


def cache_from_every_process() -> None:
    """Let every process of this job write the persistent compilation cache, not only process 0.

    JAX writes the cache from process 0 alone (so that hosts do not contend for a shared bucket) and keys a CPU
    program by the devices of the process that compiles it, so no other process ever finds its own programs there:
    CPU processes as hosts (the local launcher, the tests' fake TPU slices) compiled every program again at every
    start. A tiny 2-host run started a second time: host 0 read its programs in 1.5 s, host 1 compiled for 6.4 s.
    Such processes share one machine and its local cache folder, so each writes its own entries. JAX has no setting
    for this: it wraps JAX's private cache writer, which jax's pin (pyproject.toml) keeps where it is, and
    tests/test_multihost.py checks that a second start reads every program on every host."""
    from jax._src import compiler
    from jax._src import distributed as jax_distributed

    write = compiler._cache_write
    if getattr(write, "from_every_process", False):
        return

    def write_as_process_0(*args, **kwargs):
        state = jax_distributed.global_state
        process_id, state.process_id = state.process_id, 0  # the writer's only use of it: "process 0 writes"
        try:
            return write(*args, **kwargs)
        finally:
            state.process_id = process_id

    write_as_process_0.from_every_process = True
    compiler._cache_write = write_as_process_0


def size_cpu_thread_pool(num_processes: int, environ=os.environ) -> None:
    """On CPU, give this process the XLA thread pool that one process holding all the job's devices would have.

    XLA's CPU client makes its thread pool max(NPROC or the schedulable cores, the process's devices) threads
    wide and compiles for that width, and the width changes float results in the last bit. Measured here
    (2 cores): a 2-process x 2-device evaluation of a checkpoint differed from a 1-process x 4-device one in
    one cell of 1,296 after one supervision step; with the same width on both it was bit-identical. So every
    process of a CPU job sets NPROC = max(NPROC or the cores, the job's devices), and its figures do not depend
    on how the devices are split over processes. On a TPU (JAX_PLATFORMS not "cpu") nothing changes. Call
    before JAX creates its CPU client."""
    if environ.get("JAX_PLATFORMS", "").strip().lower() != "cpu":
        return
    try:
        local_devices = int(environ.get("JAX_NUM_CPU_DEVICES", "1"))
        budget = int(environ.get(ENV_XLA_CPU_THREADS) or _schedulable_cores())
    except ValueError:
        return  # JAX and XLA report their own bad values
    environ[ENV_XLA_CPU_THREADS] = str(max(budget, local_devices * num_processes))


def _schedulable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def data_mesh():
    """A one-axis mesh over every device of the job, each process's devices contiguous and in process order.

    Contiguity makes process i's rows of a global batch the contiguous block i (see trm/train/batches.py).
    """
    import jax
    from jax.sharding import Mesh

    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices), (DATA_AXIS,))


def replicated(mesh):
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec())


def batch_sharded(mesh):
    """Rows (axis 0) split over the "data" axis; every other axis whole."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def put_global(value: Any, sharding) -> Any:
    """A global array from `value`, which every process holds whole and identical (e.g. initial parameters)."""
    import jax

    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def put_host_rows(rows: dict[str, np.ndarray], mesh) -> dict[str, Any]:
    """Global batch arrays from this process's contiguous block of rows (the other processes hold the rest)."""
    import jax

    sharding = batch_sharded(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in rows.items()}


def local_copy(array: Any) -> np.ndarray:
    """This process's own copy of a replicated array (for digests and logs; never crosses hosts)."""
    shards = getattr(array, "addressable_shards", None)
    return np.asarray(shards[0].data if shards else array)


def gather_strings(value: str) -> list[str]:
    """`value` of every process, in process order (a collective: every process must call it)."""
    import jax

    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils

    data = value.encode()
    if len(data) > 256:
        data = hashlib.sha256(data).hexdigest().encode()
    padded = np.frombuffer(data.ljust(256, b"\0"), np.uint8)
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [bytes(row).rstrip(b"\0").decode() for row in gathered.reshape(-1, 256)]


def check_hosts_agree(what: str, value: str) -> None:
    """Raise UserError on every process, naming the hosts whose `value` differs from host 0's."""
    values = gather_strings(value)
    differ = [i for i, v in enumerate(values) if v != values[0]]
    if differ:
        detail = "; ".join(f"host {i} has {values[i]}" for i in differ)
        raise UserError(f"hosts disagree on {what}: host 0 has {values[0]}; {detail}")


def git_sha(repo: Path) -> str | None:
    """The commit checked out in `repo` (12 hex digits); None outside a git checkout or without git."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.cache
def code_version() -> str:
    """Package version plus, in a git checkout, the commit and a digest of uncommitted changes to trm/."""
    try:
        version = metadata.version("trm-study")
    except metadata.PackageNotFoundError:
        version = "unknown"
    repo = INSTALLED_FROM
    sha = git_sha(repo)
    if sha is None:
        return version
    try:
        diff = subprocess.run(
            ["git", "-C", str(repo), "diff", "HEAD", "--", "trm"],
            capture_output=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return version
    # Uncommitted changes to the package are part of the version: hosts with different edits must not agree.
    changes = f".dirty.{hashlib.sha256(diff).hexdigest()[:8]}" if diff else ""
    return f"{version}+git.{sha}{changes}"


def params_digest(tree: Any) -> str:
    """sha256 over the bytes of every leaf in a fixed order: equal digests mean bit-identical parameters.

    Hashes this process's own copy of replicated arrays, so hosts can compare their copies.
    """
    import jax

    digest = hashlib.sha256()
    for path, leaf in sorted(
        jax.tree_util.tree_leaves_with_path(tree), key=lambda kv: jax.tree_util.keystr(kv[0])
    ):
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.ascontiguousarray(local_copy(leaf)).tobytes())
    return digest.hexdigest()

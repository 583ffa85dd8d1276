"""The run lease (trm/run/lease.py) on a local folder and on the GCS emulator: create, renew, lose, release, takeover.

Holders are real Lease objects, in this process or in child processes (a holder killed with SIGKILL, one stopped
with SIGSTOP), on real storage: a file:// folder and fake-gcs-server through google-cloud-storage.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trm import storage
from trm.errors import UserError
from trm.run.lease import Lease, LeaseHeld

REPO = Path(__file__).resolve().parents[1]


def _lease(run_dir: str, messages: list[str], stale_after_s: float = 600.0) -> Lease:
    return Lease(run_dir, stale_after_s, messages.append)


def _record(run_dir: str) -> dict | None:
    url = storage.join(run_dir, "lease.json")
    return json.loads(storage.read_text(url)) if storage.exists(url) else None


def test_create_renew_refuse_lose_and_release(storage_root):
    run_dir = storage.join(storage_root, "run")
    messages: list[str] = []
    first = _lease(run_dir, messages)
    first.acquire()
    record = _record(run_dir)
    assert (record["host"], record["pid"], record["job"]) == (
        socket.gethostname(),
        os.getpid(),
        first.holder.job,
    )
    assert record["since"] == record["renewed_at"] and record["renewals"] == 0

    second = _lease(run_dir, messages)
    with pytest.raises(LeaseHeld) as held:
        second.acquire()
    message = str(held.value)
    assert "\n" not in message and f"host {socket.gethostname()}, process {os.getpid()}" in message
    assert f"job {first.holder.job}" in message and "since " in message

    time.sleep(0.01)
    assert first.renew()
    renewed = _record(run_dir)
    assert renewed["renewals"] == 1 and renewed["renewed_at"] > record["renewed_at"]
    assert renewed["since"] == record["since"]

    # A launcher with a short staleness limit takes the lease over once it is older than that, and says so.
    time.sleep(0.6)
    taker = _lease(run_dir, messages, stale_after_s=0.5)
    taker.acquire()
    assert _record(run_dir)["job"] == taker.holder.job
    assert any(m.startswith("took over the lease") and f"job {first.holder.job}" in m for m in messages)

    # The first holder finds out at its next renewal, and its release leaves the new holder's lease alone.
    assert not first.renew() and first.lost.is_set()
    assert f"held by host {socket.gethostname()}, process {os.getpid()} (job {taker.holder.job}" in (
        first.lost_reason
    )
    first.release()
    assert _record(run_dir)["job"] == taker.holder.job
    taker.release()
    assert _record(run_dir) is None
    _lease(run_dir, messages).acquire()  # free again


def test_exactly_one_of_many_simultaneous_creators_wins(storage_root):
    run_dir = storage.join(storage_root, "run")
    leases = [_lease(run_dir, []) for _ in range(6)]
    start = threading.Barrier(len(leases))
    outcomes: dict[int, str] = {}

    def take(index: int) -> None:
        start.wait()
        try:
            leases[index].acquire()
            outcomes[index] = "held"
        except LeaseHeld:
            outcomes[index] = "refused"

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(leases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [i for i, outcome in outcomes.items() if outcome == "held"]
    assert len(winners) == 1 and len(outcomes) == len(leases)
    assert _record(run_dir)["job"] == leases[winners[0]].holder.job


def _holder_process(run_dir: str, stale_after_s: float) -> subprocess.Popen:
    """A child process holding the run's lease (renewing it) until killed; returns once it holds it."""
    code = (
        "import sys, time\n"
        "from trm.run.lease import Lease\n"
        f"with Lease({run_dir!r}, {stale_after_s}, lambda m: print(m, flush=True)).held() as lease:\n"
        "    print('holding', flush=True)\n"
        "    lease.lost.wait(120)\n"
        "print('lost' if lease.lost.is_set() else 'timeout', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_a_dead_holder_on_this_machine_is_taken_over_at_once(storage_root):
    run_dir = storage.join(storage_root, "run")
    holder = _holder_process(run_dir, stale_after_s=600)
    try:
        refused = _lease(run_dir, [])
        with pytest.raises(LeaseHeld, match=f"process {holder.pid} "):
            refused.acquire()  # alive: not taken
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        holder.kill()
        holder.wait()
    messages: list[str] = []
    started = time.monotonic()
    _lease(run_dir, messages).acquire()  # staleness limit 600 s: no waiting for it
    assert time.monotonic() - started < 30
    assert any(f"process {holder.pid} " in m and "no longer exists on this machine" in m for m in messages)


def test_a_stale_holder_is_taken_over_and_stops_when_it_wakes(storage_root):
    """A holder that stops renewing (a hung launcher: SIGSTOP) loses its lease after the staleness limit; when it
    runs again, its next renewal finds the new holder and reports the lease lost."""
    run_dir = storage.join(storage_root, "run")
    holder = _holder_process(run_dir, stale_after_s=2)
    try:
        holder.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        messages: list[str] = []
        taker = _lease(run_dir, messages, stale_after_s=2)
        with pytest.raises(LeaseHeld):
            taker.acquire()  # a stopped process is not a dead one: the lease is younger than the limit
        time.sleep(max(0.0, stopped_at + 3 - time.time()))
        taker.acquire()
        assert any(m.startswith("took over") and "not renewed for" in m for m in messages), messages
        holder.send_signal(signal.SIGCONT)
        out, _ = holder.communicate(timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert "lost the lease" in out and f"job {taker.holder.job}" in out and out.strip().endswith("lost")
    assert _record(run_dir)["job"] == taker.holder.job  # the loser released nothing of the new holder's


def test_a_lease_that_is_not_a_record_is_named(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "lease.json").write_text("garbage")
    with pytest.raises(UserError, match="lease.json is not a lease record; delete it"):
        _lease(str(tmp_path / "run"), []).acquire()

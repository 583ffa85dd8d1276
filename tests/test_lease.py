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
from tiny_run import TINY, set_flags

from trm import gcs, storage
from trm.config import BASE_CONFIG, config_hash, load_config
from trm.errors import UserError
from trm.gcs import StorageUnavailable
from trm.launch import tpu_options
from trm.launch.job import Job
from trm.run.lease import Lease, LeaseHeld
from trm.run.spec import Run
from trm.run.state import read_run

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


@pytest.mark.slow
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


def test_unusable_storage_is_one_line_naming_the_lease(tmp_path, monkeypatch, closed_gcs_endpoint):
    (tmp_path / "file").write_text("")
    with pytest.raises(
        UserError, match=r"file/run/lease.json: cannot take the run's lease: Not a directory$"
    ):
        _lease(str(tmp_path / "file" / "run"), []).acquire()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", closed_gcs_endpoint)
    # The lease retries a refused connection until its budget for transient failures runs out (15 s): 1 s here.
    monkeypatch.setattr(gcs, "TRANSIENT_DELAYS_S", (1.0,))
    with pytest.raises(
        StorageUnavailable, match=r"^write gs://bucket/run/lease.json: Google Cloud Storage failed"
    ):
        _lease("gs://bucket/run", []).acquire()


def test_a_lease_that_is_not_a_record_is_named(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "lease.json").write_text("garbage")
    with pytest.raises(UserError, match="lease.json is not a lease record; delete it"):
        _lease(str(tmp_path / "run"), []).acquire()


# ----------------------------------------------------------------------------------------------- trm launch


# The launcher's use of the lease, below: each test on one storage, two on each. What the launcher does with its
# lease does not depend on where the lease lies (the Lease tests above run on both), and each of these trains.
# 48 train groups x 10 epochs / 8 = 60 steps, a checkpoint every 10.
SHORT = {"train.epochs": 10, "train.eval_interval": 10, "train.checkpoint_every_steps": 10}


def _launch(data: str, run_dir: str, stale_after_s: float = 600.0) -> subprocess.Popen:
    """`trm launch --job` of the tiny run, its job file (beside the run dir) with this lease staleness limit."""
    config = load_config(BASE_CONFIG, [flag.removeprefix("--set=") for flag in set_flags({**TINY, **SHORT})])
    tpu = {**tpu_options.launcher_settings(tpu_options.defaults()), "stale_after_seconds": stale_after_s}
    job = f"{run_dir}-job-{stale_after_s:g}.json"
    Job(Run(config, config_hash(config), data, run_dir), (), "local", 1, 1, tpu).write(job)
    command = [sys.executable, "-m", "trm.cli", "launch", "--job", job]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_step(run_dir: str, launcher: subprocess.Popen, step: int) -> None:
    """Until the run's status.json reports `step` (or the launcher exits: a failure)."""
    deadline = time.time() + 300
    while read_run(run_dir).status.get("step", 0) < step:
        assert launcher.poll() is None and time.time() < deadline, launcher.communicate()
        time.sleep(0.2)


def _finished_once(run_dir: str, attempts: int) -> None:
    """The run finished, was trained by `attempts` trainer starts, logged each train record once, holds no lease."""
    state = read_run(run_dir)
    assert state.state == "finished" and state.status["attempt"] == attempts, state
    records = [
        json.loads(line) for line in storage.read_text(storage.join(run_dir, "metrics.jsonl")).splitlines()
    ]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 60
    assert _record(run_dir) is None


@pytest.mark.slow
@pytest.mark.parametrize("storage_root", ["gcs"], indirect=True)
def test_of_two_simultaneous_launches_one_trains_and_the_other_names_it(storage_root, easy_data):
    run_dir = storage.join(storage_root, "run")
    launches = [_launch(easy_data, run_dir), _launch(easy_data, run_dir)]
    try:
        outputs = [proc.communicate(timeout=400) for proc in launches]
    finally:
        for proc in launches:
            proc.kill()
            proc.wait()
    codes = [proc.returncode for proc in launches]
    assert sorted(codes) == [0, 2], outputs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    refusal = outputs[loser][1].strip()
    assert len(refusal.splitlines()) == 1, refusal
    holder = f"another launcher trains this run (host {socket.gethostname()}, process {launches[winner].pid} "
    assert holder in refusal and "since " in refusal
    assert "[host 0]" in outputs[winner][0] and "[host" not in outputs[loser][0]
    _finished_once(run_dir, attempts=1)


def _descendants(pid: int) -> list[int]:
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


@pytest.mark.slow
@pytest.mark.parametrize("storage_root", ["file"], indirect=True)
def test_a_launcher_killed_and_restarted_continues_its_run_at_once(storage_root, easy_data):
    """SIGKILL to the launcher and its trainer (as when its machine's job is killed), then the same command
    again: the dead holder's lease is taken over at once, though the staleness limit is 600 s."""
    run_dir = storage.join(storage_root, "run")
    first = _launch(easy_data, run_dir)
    try:
        _wait_for_step(run_dir, first, 30)  # checkpoints every 10 steps: the one at 10 is surely committed
        for pid in [first.pid, *_descendants(first.pid)]:
            os.kill(pid, signal.SIGKILL)
        first.communicate(timeout=60)
    finally:
        first.kill()
        first.wait()
    started = time.monotonic()
    second = _launch(easy_data, run_dir, 600)
    out, err = second.communicate(timeout=400)
    assert second.returncode == 0, err[-3000:]
    assert f"process {first.pid} " in out and "no longer exists on this machine" in out
    assert "resuming from step" in out
    assert time.monotonic() - started < 300
    _finished_once(run_dir, attempts=2)


@pytest.mark.slow
@pytest.mark.parametrize("storage_root", ["gcs"], indirect=True)
def test_a_launch_takes_over_a_stale_lease_and_says_so(storage_root, easy_data):
    run_dir = storage.join(storage_root, "run")
    holder = _holder_process(run_dir, stale_after_s=600)
    try:
        holder.send_signal(signal.SIGSTOP)  # a hung launcher: alive, silent
        refused = _launch(easy_data, run_dir, 600)
        _, err = refused.communicate(timeout=120)
        assert refused.returncode == 2 and f"process {holder.pid} " in err
        time.sleep(3)  # the lease is now older than the next launcher's limit
        taker = _launch(easy_data, run_dir, 3)
        out, err = taker.communicate(timeout=400)
    finally:
        holder.kill()
        holder.wait()
    assert taker.returncode == 0, err[-3000:]
    assert f"[launch] took over the lease of {run_dir}/lease.json from host {socket.gethostname()}, " in out
    assert f"process {holder.pid} " in out and "not renewed for" in out
    _finished_once(run_dir, attempts=1)


@pytest.mark.slow
@pytest.mark.parametrize("storage_root", ["file"], indirect=True)
def test_a_launch_that_loses_its_lease_kills_its_trainers_and_fails(storage_root, easy_data):
    """Another launcher takes the lease over (here one whose staleness limit every lease exceeds): the running
    launcher's next renewal finds it, kills its trainers at once and exits 1, naming the new holder."""
    run_dir = storage.join(storage_root, "run")
    launcher = _launch(easy_data, run_dir, 4)  # renews every second
    try:
        _wait_for_step(run_dir, launcher, 10)
        trainers = _descendants(launcher.pid)
        assert trainers
        messages: list[str] = []
        taker = _lease(run_dir, messages, stale_after_s=1e-6)
        taker.acquire()
        taken_at = time.monotonic()
        out, _ = launcher.communicate(timeout=120)
        stopped_in = time.monotonic() - taken_at
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == 1, out[-3000:]
    assert f"[launch] lost the lease of {run_dir}/lease.json: it is now held by host " in out
    assert f"(job {taker.holder.job})" in out and "stopped this launcher's trainers" in out
    assert stopped_in < 30, stopped_in
    assert not any(Path(f"/proc/{pid}").exists() for pid in trainers)
    assert not storage.exists(storage.join(run_dir, "_SUCCESS"))
    assert _record(run_dir)["job"] == taker.holder.job  # the loser left the new holder's lease alone

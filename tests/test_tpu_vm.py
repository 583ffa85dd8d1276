"""The tpu-vm launcher against a fake `gcloud` (tests/fake_gcloud/gcloud) whose slice hosts are local processes,
each in its own HOME, with storage on the GCS emulator: a killed launcher's trainers stopped by the next launch, a preempted slice
recreated and the run resumed, a cancelled job leaving no host process, and hostile values never reaching a shell
unquoted. A study through the
tpu-v4-64 profile is in test_chaos.py, its dry runs and canary in test_tpu_profile.py. Every subprocess is bounded
by a timeout and killed in `finally`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_tpu import gcloud_calls, node_pids, wait_until_exited
from tiny_run import TINY, set_flags, stage

from trm import storage
from trm.cli import main as trm_main
from trm.config import BASE_CONFIG, config_hash, load_config
from trm.launch import tpu_options
from trm.launch.job import Job
from trm.run.lease import Lease
from trm.run.lifetime import ENV_CONTROLLER_PID
from trm.run.spec import Run

pytestmark = [pytest.mark.tpu, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
SLICE = "trm-test-a"
# 48 train groups x 8 epochs / 8 = 48 steps, a checkpoint every 4: long enough to preempt mid-run.
RUN = {
    **TINY,
    "arch.halt_max_steps": 2,
    "train.eval_steps": 2,
    "train.epochs": 8,
    "train.eval_interval": 4,
    "train.checkpoint_every_steps": 4,
}


@pytest.fixture(scope="module")
def data(tpu_bucket: str, easy_dataset: Path) -> str:
    return stage(easy_dataset, f"{tpu_bucket}/data")


def _launch_command(
    tpu_bucket: str, tmp: Path, run_dir: str, data: str, *extra: str, tpu: dict | None = None
) -> list[str]:
    """`trm launch --job FILE -- --log-every 4 ...`, its job file (tmp/job.json) written here: the tiny run on
    the fake's 2-host slices, with `extra` `--set=` overrides in its config and other `extra` trainer options
    after `--`, and `tpu` over the job's tpu-vm settings."""
    sets = [arg.removeprefix("--set=") for arg in extra if arg.startswith("--set=")]
    options = [arg for arg in extra if not arg.startswith("--set=")]
    config = load_config(BASE_CONFIG, [arg.removeprefix("--set=") for arg in set_flags(RUN)] + sets)
    settings = {
        **tpu_options.defaults(),
        "slices": [SLICE],
        "zone": "us-central2-b",
        "project": "trm-test-project",
        "code_url": f"{tpu_bucket}/code",
        # The hosts look like the stock image (Python 3.10 only): the set-up makes a venv with this machine's
        # Python 3.11, which has the dependencies, instead of downloading both.
        "python": sys.executable,
        "install_dependencies": False,
        "coordinator_port": 0,
        "lock_dir": str(tmp / "locks"),
        "poll_seconds": 0.5,
        "stop_grace_seconds": 30,
        "start_timeout_seconds": 120,
        **(tpu or {}),
    }
    run = Run(config, config_hash(config), data, run_dir)
    job = Job(run, (), "tpu-vm", 2, 1, tpu_options.launcher_settings(settings))  # the fake's slices: 2 hosts
    path = tmp.with_name(f"{tmp.name}-job.json")  # beside tmp: a test checks that tmp is never made
    job.write(str(path))
    return [sys.executable, "-m", "trm.cli", "launch", "--job", str(path), "--", "--log-every", "4", *options]


def _start(command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)


def _wait(predicate, launcher: subprocess.Popen, log: Path, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert launcher.poll() is None, (
            f"launcher exited {launcher.returncode} before {what}:\n{log.read_text()}"
        )
        assert time.time() < deadline, f"no {what} after {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def _checkpoints(run_dir: str) -> list[int]:
    """Steps whose checkpoint is finalized. On GCS orbax marks a finished step with <step>/commit_success.txt;
    each item (<step>/state/, <step>/record/) gets its own such file earlier, which does not make the step
    restorable."""
    files = storage.list_files(storage.join(run_dir, "ckpt"))
    return sorted(int(f.split("/")[0]) for f in files if re.fullmatch(r"[0-9]+/commit_success\.txt", f))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# ------------------------------------------------------------------------------------------- the launcher


def test_a_restarted_launcher_stops_the_trainers_left_then_a_preempted_slice_is_recreated_and_the_run_resumes(
    cloud, tpu_bucket, data, tmp_path, capsys
):
    """One run through a killed launcher and a preempted slice, on fake hosts that look like the stock image
    (Python 3.10, no 3.11): the set-up makes each host's venv, again on the recreated slice (fresh disks), and the
    trainers join through the explicit distributed start.

    A second launcher of the run is refused while the first holds its lease. The first, killed (controller lost),
    leaves its trainers training on the slice; the next launch of the run goes back to that slice, although it is
    the pool's second and the first is free by then, stops them through their PID file (they save a checkpoint)
    and resumes, keeping both attempts' logs. Its slice is then preempted: the launcher recreates it, keeps the
    run's lease across the recreation, resumes from the last checkpoint and finishes."""
    run_dir = f"{tpu_bucket}/runs/restarted-preempted"
    # 144 steps, checkpoints every 4: long enough to kill, restart and preempt before the run finishes.
    longer = ("--set=train.epochs=24",)
    # The run's slice is the pool's second: the restarted launcher must still go back to it.
    tpu = {"create": True, "slices": ["trm-test-b", SLICE]}
    command = _launch_command(tpu_bucket, tmp_path, run_dir, data, *longer, tpu=tpu)
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    (tmp_path / "locks").mkdir()
    blocker = (tmp_path / "locks" / "us-central2-b-trm-test-b.lock").open("a+")  # another job holds slice b
    fcntl.flock(blocker, fcntl.LOCK_EX)
    first, second = _start(command, first_log), None
    try:
        started = time.time()
        _wait(lambda: _checkpoints(run_dir), first, first_log, 180, "checkpoint")
        first_start = time.time() - started
        lease = json.loads(storage.read_text(f"{run_dir}/lease.json"))
        assert lease["pid"] == first.pid
        # A second launcher of the run (here in this process: cheaper) is refused before it takes a slice.
        refused = _launch_command(tpu_bucket, tmp_path / "second", run_dir, data, *longer, tpu=tpu)
        assert trm_main(refused[3:]) == 2
        assert f"process {first.pid} (job {lease['job']})" in capsys.readouterr().err
        assert not (tmp_path / "second").exists()  # its slice pool's lock folder: never made
        first.kill()
        first.wait()
        left = node_pids(SLICE)
        assert len(left) >= 2  # the trainers outlive a killed launcher on the (remote) hosts
        fcntl.flock(blocker, fcntl.LOCK_UN)
        second = _start(command, second_log)
        stopped = lambda: not set(left) & set(node_pids(SLICE))  # noqa: E731
        _wait(stopped, second, second_log, 180, "the trainers left behind stopped")
        resumed_at = max(_checkpoints(run_dir))
        _wait(lambda: max(_checkpoints(run_dir)) > resumed_at, second, second_log, 120, "a checkpoint")
        # Each host's own log of the run, on the slice's disks (wiped by its recreation below): two starts.
        for host in (cloud / "hosts" / SLICE).iterdir():
            hash_log = next(path for path in (host / ".trm/logs").glob("*.log") if path.name != "setup.log")
            assert hash_log.read_text().count("start of an attempt") == 2
        lease = json.loads(storage.read_text(f"{run_dir}/lease.json"))
        assert lease["pid"] == second.pid  # the dead launcher's lease, taken over
        subprocess.run(["gcloud", "fake-preempt", SLICE], check=True, timeout=30)
        preempted_at = time.time()
        relaunched = lambda: json.loads(storage.read_text(f"{run_dir}/launch.json"))["attempt"] == 2  # noqa: E731
        _wait(relaunched, second, second_log, 120, "relaunch")
        # The launcher keeps its lease across the slice's recreation.
        assert json.loads(storage.read_text(f"{run_dir}/lease.json"))["job"] == lease["job"]
        second.wait(timeout=300)
    finally:
        for launcher in (first, second):
            if launcher is not None:
                _stop(launcher)
        blocker.close()
    output = second_log.read_text()
    assert second.returncode == 0, output[-4000:]
    print(
        f"first start to checkpoint {first_start:.1f} s, preemption to finish {time.time() - preempted_at:.1f} s"
    )
    assert f"slice {SLICE} is ours" in output
    assert storage.exists(f"{run_dir}/_SUCCESS")
    assert not storage.exists(f"{run_dir}/lease.json")  # released at the end
    assert "slice trm-test-a is PREEMPTED" in output
    # The spot slice came back only by deleting and recreating its queued resource; slice b was never made.
    verbs = [argv[3:5] for argv in gcloud_calls(cloud) if argv[2:3] == ["queued-resources"]]
    assert verbs.count(["create", SLICE]) == 2 and verbs.count(["delete", SLICE]) == 1, verbs
    assert ["create", "trm-test-b"] not in verbs
    log = storage.read_text(f"{run_dir}/logs/host-0.log")
    assert re.search(r"stopped by signal 15 at step \d+; checkpoint saved", log), log[-4000:]
    # Three attempts: the first launcher's trainers, the second's (whose output since their last flush the
    # preemption took with them) and the recreated slice's, resumed from a checkpoint the second ones wrote.
    assert log.count("(earlier attempts above)") == 2, log[-4000:]
    resumed = int(log.split("resuming from step ")[-1].split()[0])
    assert resumed > resumed_at, (resumed, resumed_at, log[-4000:])
    launch = json.loads(storage.read_text(f"{run_dir}/launch.json"))
    assert launch["state"] == "finished" and launch["slice"] == SLICE and launch["attempt"] == 2
    # The hosts ran the shipped wheel, not this checkout: the code version is the wheel's.
    assert "+git." in log and ".src." in log
    # Set up by the first launcher, found current by the second on the same slice, and set up again on the
    # recreated one, each time in a venv of its own made with --tpu-python (this suite's interpreter).
    assert first_log.read_text().count("set up code") == 1 and "set-up current" not in first_log.read_text()
    assert output.count("set up code") == 2
    assert output.count("set-up current") == 2  # each host at the second launcher's first start
    for host in (cloud / "hosts" / SLICE).iterdir():
        assert (host / ".trm/venv/.trm-setup").exists()
        assert (
            "version_info = {}.{}.".format(*sys.version_info[:2])
            in (host / ".trm/venv/pyvenv.cfg").read_text()
        )
    wait_until_exited(SLICE)


def test_a_launcher_whose_lease_is_taken_over_kills_its_trainers_and_writes_nothing_more(
    cloud, tpu_bucket, data, tmp_path
):
    subprocess.run(["gcloud", "fake-create-node", SLICE], check=True, timeout=30)  # a slice of the pool
    run_dir = f"{tpu_bucket}/runs/taken-over"
    log = tmp_path / "launcher.log"
    # The lease is renewed every 30 / 4 s; the trainers checkpoint far more often than their 30 s limit.
    stale = {"stale_after_seconds": 30}
    launcher = _start(_launch_command(tpu_bucket, tmp_path, run_dir, data, tpu=stale), log)
    try:
        _wait(lambda: len(node_pids(SLICE)) >= 2, launcher, log, 120, "trainers on both hosts")
        _wait(lambda: storage.exists(f"{run_dir}/status.json"), launcher, log, 120, "status.json")
        launch_before = storage.read_text(f"{run_dir}/launch.json")
        taker = Lease(run_dir, 1e-6, print)  # a launcher for which every lease is stale
        taker.acquire()
        launcher.wait(timeout=90)
    finally:
        _stop(launcher)
    output = log.read_text()
    assert launcher.returncode == 1, output[-4000:]
    assert f"lost the lease of {run_dir}/lease.json: it is now held by" in output
    assert f"(job {taker.holder.job})" in output and "stop trm train on every host" in output
    assert node_pids(SLICE) == [], output[-4000:]
    assert storage.read_text(f"{run_dir}/launch.json") == launch_before  # no marker after the loss
    assert json.loads(storage.read_text(f"{run_dir}/lease.json"))["job"] == taker.holder.job


def test_a_job_whose_controller_died_stops_every_host_through_its_checkpoint_and_hostile_values_stay_quoted(
    cloud, tpu_bucket, data, tmp_path
):
    """Snakemake SIGKILLed: its job's launcher notices (TRM_CONTROLLER_PID) and cancels as on SIGTERM, which it
    sends itself (trm/run/lifetime.py): every host's trainer saves a checkpoint and no host process is left. A
    hostile value of the trainer's options reaches each host as one literal argument."""
    subprocess.run(["gcloud", "fake-create-node", SLICE], check=True, timeout=30)  # a slice of the pool
    run_dir = f"{tpu_bucket}/runs/orphaned"
    hostile = "cache;touch PWNED;$(touch PWNED2)`touch PWNED3`"
    log = tmp_path / "launcher.log"
    controller = subprocess.Popen(["sleep", "600"])  # stands for Snakemake
    command = _launch_command(
        tpu_bucket, tmp_path, run_dir, data, "--set=train.epochs=12", "--cache-dir", hostile
    )
    with open(log, "w") as out:
        env = {**os.environ, ENV_CONTROLLER_PID: str(controller.pid)}
        launcher = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _wait(lambda: _checkpoints(run_dir), launcher, log, 180, "checkpoint")
        controller.kill()
        controller.wait()
        launcher.wait(timeout=120)
    finally:
        _stop(launcher)
        _stop(controller)
    output = log.read_text()
    assert launcher.returncode == 128 + signal.SIGTERM, output[-4000:]
    assert f"the workflow's controller (pid {controller.pid}) is gone" in output
    assert node_pids(SLICE) == [], output[-4000:]
    assert json.loads(storage.read_text(f"{run_dir}/launch.json"))["state"] == "cancelled"
    host_log = storage.read_text(f"{run_dir}/logs/host-0.log")
    assert re.search(r"stopped by signal 15 at step \d+; checkpoint saved", host_log), host_log[-4000:]
    # The hostile argument reached each host as one literal path: nothing was executed.
    hosts = cloud / "hosts" / SLICE
    assert sorted(p.name for p in hosts.iterdir()) == ["0", "1"]
    for host in hosts.iterdir():
        assert (host / hostile).is_dir()
        assert not any(host.glob("PWNED*")) and not any(REPO.glob("PWNED*"))


def test_stock_image_failed_setup_fails_the_job_at_once_with_the_hosts_log_tail(
    cloud, tpu_bucket, data, tmp_path
):
    """No Python 3.11 where the set-up looks (the stock image has 3.10 and the fake forbids downloads): the job
    fails at its first set-up, with each host's log tail, instead of relaunching."""
    subprocess.run(["gcloud", "fake-create-node", SLICE], check=True, timeout=30)
    run_dir = f"{tpu_bucket}/runs/broken-install"
    broken = {"python": "python3.99-missing", "max_relaunches": 5}
    done = subprocess.run(
        _launch_command(tpu_bucket, tmp_path, run_dir, data, tpu=broken),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-4000:]
    launch = json.loads(storage.read_text(f"{run_dir}/launch.json"))
    assert launch["state"] == "failed" and launch["attempt"] == 1, (launch, output[-4000:])
    assert "set-up failed" in launch["message"] and "python3.99-missing" in launch["message"], launch
    setups = [
        argv
        for argv in gcloud_calls(cloud)
        if argv[2:4] == ["tpu-vm", "ssh"] and any("uv" in a for a in argv)
    ]
    assert len(setups) == 1  # not retried, not relaunched
    assert node_pids(SLICE) == []


def test_trainers_failing_before_training_fail_the_job_at_once(cloud, tpu_bucket, tmp_path):
    """No dataset at --data: the trainers fail while setting up and say so in status.json; the launcher fails
    the job at its next poll instead of waiting out the start timeout and relaunching."""
    subprocess.run(["gcloud", "fake-create-node", SLICE], check=True, timeout=30)
    run_dir = f"{tpu_bucket}/runs/no-dataset"
    patient = {"start_timeout_seconds": 900, "max_relaunches": 5}
    command = _launch_command(tpu_bucket, tmp_path, run_dir, f"{tpu_bucket}/no-such-dataset", tpu=patient)
    started = time.time()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-4000:]
    assert time.time() - started < 240, output[-4000:]
    launch = json.loads(storage.read_text(f"{run_dir}/launch.json"))
    assert launch["state"] == "failed" and launch["attempt"] == 1, (launch, output[-4000:])
    assert "no-such-dataset/MANIFEST.json not found" in launch["message"], launch
    status = json.loads(storage.read_text(f"{run_dir}/status.json"))
    assert status["state"] == "failed" and status["slice"] == SLICE
    starts = [argv for argv in gcloud_calls(cloud) if any("trm.cli train" in arg for arg in argv)]
    assert len(starts) == 1  # not relaunched
    wait_until_exited(SLICE)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("slices", ["trm;touch PWNED"]),
        ("zone", "us-central2-b --project=x"),
        ("project", "$(touch PWNED)"),
        ("accelerator_type", "v4-64 && reboot"),
    ],
)
def test_bad_names_are_rejected_before_any_command_runs(cloud, tmp_path, capsys, key, value):
    command = _launch_command("gs://bkt", tmp_path, "gs://bkt/runs/x", "gs://bkt/data", tpu={key: value})[3:]
    assert trm_main(command) == 2
    message = capsys.readouterr().err
    shown = value[0] if isinstance(value, list) else value
    assert f"tpu.{key}" in message and repr(shown) in message and "expected" in message
    assert gcloud_calls(cloud) == []


def test_local_run_dir_is_refused(cloud, tmp_path, capsys):
    command = _launch_command("gs://bkt", tmp_path, str(tmp_path / "run"), "gs://bkt/data")[3:]
    assert trm_main(command) == 2
    assert "run_dir" in capsys.readouterr().err and gcloud_calls(cloud) == []

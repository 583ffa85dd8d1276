"""The tpu-vm launcher against a fake `gcloud` (tests/fake_gcloud/gcloud) whose slice hosts are local processes,
each in its own HOME, with storage on the GCS emulator: a preempted slice recreated and the run resumed, a
cancelled job leaving no host process, hostile values never reaching a shell unquoted, and the tpu-v4-64
profile's dry run and an end-to-end run of two tiny experiments through Snakemake.

Every subprocess is bounded by a timeout and killed in `finally`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_trainer import TINY, _easy_csv, _sets

from trm import storage
from trm.cli import main as trm_main

REPO = Path(__file__).resolve().parents[1]
FAKE_GCLOUD = REPO / "tests" / "fake_gcloud"
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SLICE = "trm-test-a"
OTHER_SLICE = "trm-test-b"
# 48 train groups x 8 epochs / 8 = 48 steps, a checkpoint every 4: long enough to preempt mid-run.
RUN = {
    **TINY,
    "arch.halt_max_steps": 2,
    "train.eval_steps": 2,
    "train.epochs": 8,
    "train.eval_interval": 4,
    "train.checkpoint_every_steps": 4,
}


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake gcloud first on PATH (run by this venv's python3); returns its state folder."""
    state = tmp_path / "cloud"
    path = [str(FAKE_GCLOUD), str(Path(sys.executable).parent), os.environ["PATH"]]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.setenv("FAKE_GCLOUD_STATE", str(state))
    monkeypatch.setenv("FAKE_TPU_WORKERS", "2")
    return state


@pytest.fixture(scope="module")
def bucket(gcs_emulator: str) -> str:
    name = f"tpu-{os.getpid()}-{int(time.time())}"
    fs, _ = storage.filesystem(f"gs://{name}")
    fs.mkdir(name)
    return f"gs://{name}"


@pytest.fixture(scope="module")
def data(bucket: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("tpu-data")
    _easy_csv(tmp / "easy.csv", puzzles=60, blanks=6, seed=0)
    built = tmp / "built"
    args = ["build-dataset", "--source", str(tmp / "easy.csv"), "--num-aug", "4", "--output-dir", str(built)]
    assert trm_main(args) == 0
    assert trm_main(["stage", str(built), f"{bucket}/data"]) == 0
    return f"{bucket}/data"


def _launch_command(
    bucket: str, tmp: Path, run_dir: str, data: str, *extra: str, tpu: tuple = ()
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trm.cli",
        "launch",
        "--backend",
        "tpu-vm",
        "--tpu-slice",
        SLICE,
        "--tpu-zone",
        "us-central2-b",
        "--tpu-project",
        "trm-test-project",
        "--tpu-code-url",
        f"{bucket}/code",
        "--no-tpu-install-dependencies",
        "--tpu-lock-dir",
        str(tmp / "locks"),
        "--tpu-poll-seconds",
        "0.5",
        "--tpu-stop-grace",
        "30",
        "--tpu-start-timeout",
        "120",
        *tpu,
        "--",
        "--config",
        "config/base.yaml",
        "--data",
        data,
        "--run-dir",
        run_dir,
        "--log-every",
        "4",
        *_sets(RUN),
        *extra,
    ]


def _start(command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)


def _node_pids(name: str) -> list[int]:
    """Live processes of the fake slice's hosts (the fake marks them with FAKE_TPU_NODE)."""
    marker = f"FAKE_TPU_NODE={name}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                if (proc / "stat").read_text().split(") ")[1][0] != "Z":
                    pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _wait(predicate, launcher: subprocess.Popen, log: Path, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert launcher.poll() is None, (
            f"launcher exited {launcher.returncode} before {what}:\n{log.read_text()}"
        )
        assert time.time() < deadline, f"no {what} after {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def _wait_until_exited(name: str, timeout: float = 60) -> None:
    """Trainers exit by themselves shortly after writing _SUCCESS (the launcher returns at _SUCCESS)."""
    deadline = time.time() + timeout
    while _node_pids(name) and time.time() < deadline:
        time.sleep(0.5)
    assert _node_pids(name) == []


def _checkpoints(run_dir: str) -> list[int]:
    """Steps whose checkpoint is finalized. On GCS orbax marks a finished step with <step>/commit_success.txt;
    each item (<step>/state/, <step>/record/) gets its own such file earlier, which does not make the step
    restorable."""
    files = storage.list_files(storage.join(run_dir, "ckpt"))
    return sorted(int(f.split("/")[0]) for f in files if re.fullmatch(r"[0-9]+/commit_success\.txt", f))


def _gcloud_calls(state: Path) -> list[list[str]]:
    path = state / "argv.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# ------------------------------------------------------------------------------------------- the launcher


def test_preempted_slice_is_recreated_and_the_run_resumes_from_its_checkpoint(cloud, bucket, data, tmp_path):
    run_dir = f"{bucket}/runs/preempted"
    log = tmp_path / "launcher.log"
    # 144 steps, checkpoints every 4: the preemption must come long before the run could finish on its own
    # (with the default 48 steps it sometimes finished first, and nothing was resumed).
    longer = ("--set=train.epochs=24",)
    launcher = _start(_launch_command(bucket, tmp_path, run_dir, data, *longer, tpu=("--tpu-create",)), log)
    try:
        started = time.time()
        _wait(lambda: _checkpoints(run_dir), launcher, log, 180, "checkpoint")
        first_start = time.time() - started
        subprocess.run(["gcloud", "fake-preempt", SLICE], check=True, timeout=30)
        preempted_at = time.time()
        launcher.wait(timeout=240)
    finally:
        _stop(launcher)
    output = log.read_text()
    assert launcher.returncode == 0, output[-4000:]
    print(
        f"first start to checkpoint {first_start:.1f} s, preemption to finish {time.time() - preempted_at:.1f} s"
    )
    assert storage.exists(f"{run_dir}/_SUCCESS")
    assert "slice trm-test-a is PREEMPTED" in output
    # The spot slice came back only by deleting and recreating its queued resource.
    verbs = [argv[3:5] for argv in _gcloud_calls(cloud) if argv[2:3] == ["queued-resources"]]
    assert verbs.count(["create", SLICE]) == 2 and verbs.count(["delete", SLICE]) == 1
    host_log = storage.read_text(f"{run_dir}/logs/host-0.log")
    assert "resuming from step" in host_log, (
        f"host log:\n{host_log}\nlauncher log:\n{output[-4000:]}\nfiles: {storage.list_files(run_dir)}"
    )
    resumed = int(host_log.split("resuming from step ")[1].split()[0])
    assert resumed in _checkpoints(run_dir) or resumed >= 4
    launch = json.loads(storage.read_text(f"{run_dir}/launch.json"))
    assert launch["state"] == "finished" and launch["slice"] == SLICE and launch["attempt"] == 2
    # The hosts ran the shipped wheel, not this checkout: the code version is the wheel's.
    assert "+git." in host_log and ".src." in host_log
    _wait_until_exited(SLICE)


def test_cancelled_job_stops_every_host_process_and_hostile_values_stay_quoted(cloud, bucket, data, tmp_path):
    subprocess.run(["gcloud", "fake-create-node", SLICE], check=True, timeout=30)  # a slice of the pool
    run_dir = f"{bucket}/runs/cancelled"
    hostile = "cache;touch PWNED;$(touch PWNED2)`touch PWNED3`"
    log = tmp_path / "launcher.log"
    launcher = _start(_launch_command(bucket, tmp_path, run_dir, data, "--cache-dir", hostile), log)
    try:
        _wait(lambda: len(_node_pids(SLICE)) >= 2, launcher, log, 120, "trainers on both hosts")
        _wait(lambda: storage.exists(f"{run_dir}/status.json"), launcher, log, 120, "status.json")
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=90)
    finally:
        _stop(launcher)
    output = log.read_text()
    assert launcher.returncode == 128 + signal.SIGTERM, output[-4000:]
    assert _node_pids(SLICE) == [], output[-4000:]
    launch = json.loads(storage.read_text(f"{run_dir}/launch.json"))
    assert launch["state"] == "cancelled"
    # The hostile argument reached each host as one literal path: nothing was executed.
    hosts = cloud / "hosts" / SLICE
    assert sorted(p.name for p in hosts.iterdir()) == ["0", "1"]
    for host in hosts.iterdir():
        assert (host / hostile).is_dir()
        assert not any(host.glob("PWNED*")) and not any(REPO.glob("PWNED*"))


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--tpu-slice", "trm;touch PWNED"),
        ("--tpu-zone", "us-central2-b --project=x"),
        ("--tpu-project", "$(touch PWNED)"),
        ("--tpu-accelerator-type", "v4-64 && reboot"),
    ],
)
def test_bad_names_are_rejected_before_any_command_runs(cloud, tmp_path, capsys, flag, value):
    command = _launch_command("gs://b", tmp_path, "gs://b/runs/x", "gs://b/data")[3:]
    if flag in command:
        command[command.index(flag) + 1] = value
    else:
        command[command.index("--") : command.index("--")] = [flag, value]
    assert trm_main(command) == 2
    message = capsys.readouterr().err
    assert flag in message and repr(value) in message and "expected" in message
    assert _gcloud_calls(cloud) == []


def test_local_run_dir_is_refused(cloud, tmp_path, capsys):
    command = _launch_command("gs://b", tmp_path, str(tmp_path / "run"), "gs://b/data")[3:]
    assert trm_main(command) == 2
    assert "--run-dir" in capsys.readouterr().err and _gcloud_calls(cloud) == []


# ---------------------------------------------------------------------------------------------- the profile


def test_profile_dry_run_needs_no_gcloud_and_shows_tpu_hours(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    done = subprocess.run(
        [SNAKEMAKE, "--profile", "profiles/tpu-v4-64", "-n", "--config", "groups=[exp06]"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    jobs = [line for line in output.splitlines() if ": train exp06" in line]
    assert len(jobs) == 6 and all("TPU v4 chip-hours" in line and "32 devices" in line for line in jobs)
    assert "scale paper: 6 experiments" in output and "TPU v4 chip-hours of training" in output
    assert "--backend tpu-vm --hosts 8 --devices-per-host 4" in output


def _test_profile(root: Path, bucket: str, tmp: Path) -> Path:
    """profiles/tpu-v4-64 with the same keys, on the emulator: a pool of two slices of 2 hosts x 1 device, smoke
    scale, fast polls."""
    profile = root / "profiles" / "tpu-test"
    shutil.copytree(REPO / "profiles" / "tpu-v4-64", profile)
    settings = yaml.safe_load((profile / "config.yaml").read_text())
    settings["resources"]["tpu"] = 2  # one training job per slice of the pool
    (profile / "config.yaml").write_text(yaml.safe_dump(settings))
    study = yaml.safe_load((profile / "study.yaml").read_text())
    study.update(scale="smoke", storage=f"{bucket}/study", experiments=["exp01a", "exp04a_100"])
    study["launch"].update(hosts=2, devices_per_host=1)
    study["launch"]["tpu"].update(
        slices=[SLICE, OTHER_SLICE],
        project="trm-test-project",
        python="python3",
        install_dependencies=False,
        lock_dir=str(tmp / "locks"),
        poll_seconds=0.5,
        stop_grace_seconds=30,
    )
    (profile / "study.yaml").write_text(yaml.safe_dump(study))
    return profile


def test_profile_runs_two_experiments_on_an_emulated_slice(cloud, bucket, tmp_path):
    root = tmp_path / "study"
    root.mkdir()
    shutil.copy(REPO / "Snakefile", root)
    for folder in ("workflow", "config", "profiles"):
        shutil.copytree(REPO / folder, root / folder)
    profile = _test_profile(root, bucket, tmp_path)
    targets = [f"results/smoke/runs/{exp}/final.json" for exp in ("exp01a", "exp04a_100")]
    started = time.time()
    done = subprocess.run(
        [SNAKEMAKE, "--profile", str(profile), "--cores", "2", *targets],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(f"snakemake --profile tpu-test, two experiments: {time.time() - started:.1f} s")
    logs = "".join(p.read_text() for p in (root / "results/smoke/logs/train").glob("*.log"))
    assert done.returncode == 0, done.stderr[-3000:] + logs[-3000:]
    for target in targets:
        assert json.loads((root / target).read_text())["test"]
    assert "launch state finished" in logs
    # The two jobs ran at once, each on its own slice of the pool.
    ssh = [argv for argv in _gcloud_calls(cloud) if argv[2:4] == ["tpu-vm", "ssh"]]
    assert ssh and all("--worker=all" in argv for argv in ssh)
    assert {argv[4] for argv in ssh} == {SLICE, OTHER_SLICE}
    _wait_until_exited(SLICE)
    _wait_until_exited(OTHER_SLICE)

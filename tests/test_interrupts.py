"""Stopping a study (issue 27, item 5): signals to Snakemake stop each training job through its checkpoint within
seconds, nothing outlives its launcher, the host logs keep every attempt, and a rerun resumes to the same result.

Real Snakemake runs of one smoke experiment (100 steps, workflow_support.LIGHT_ARCH) on a copy of the workflow; every
process the test starts carries a marker in its environment, so /proc shows whether any of them still runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from workflow_support import LIGHT_ARCH, add_references, copy_workflow

from trm.config import dump_config
from trm.run import distributed, layout
from trm.run.state import read_run
from trm.study.plan import plan_study, stage_receipt

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# exp04a_500 (50 smoke puzzles: 100 training steps) with the light model, as a reference of the study in its
# copy: signals, checkpoints and resuming do not depend on the model's depth or dtype.
EXPERIMENT = "interrupted"
RUN = {"data": {"train_puzzles": 500}, "arch": LIGHT_ARCH}
MARKER = "TRM_TEST_MARKER"
# The environment of the workflow's jobs (workflow/rules/common.smk): its persistent XLA cache (the reference run
# compiles for every attempt) and one XLA CPU thread (trm.launch.local.one_thread_per_job), so that the reference
# trains as the job does: the thread pool's width changes float results in the last bit.
JOB_ENV = {
    "JAX_COMPILATION_CACHE_DIR": "results/.cache/jax",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    distributed.ENV_XLA_CPU_THREADS: "1",
}
STOPPED = re.compile(r"stopped by signal \d+ at step (\d+); checkpoint saved")


@dataclass
class Study:
    root: Path  # a copy of the workflow, with the experiment's dataset staged
    config: str  # the experiment's resolved config, as its job trains it
    data: str
    run_dir: Path  # where the workflow trains it
    reference: Path  # the same run, trained without interruption
    steps: int = 0  # its optimizer steps

    def snakemake(self, *args: str) -> list[str]:
        return [str(BIN / "snakemake"), *args, "--cores", "2", "--config", f"experiments=[{EXPERIMENT}]"]

    def launch(self, run_dir: Path, hosts: int = 1) -> list[str]:
        return [
            str(BIN / "trm"),
            "launch",
            "--hosts",
            str(hosts),
            "--config",
            self.config,
            "--data",
            self.data,
            "--run-dir",
            str(run_dir),
            "--test-time-steps",
            "16,32",
        ]


def _environment(marker: str) -> dict[str, str]:
    return {**os.environ, **JOB_ENV, MARKER: marker}


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Study:
    root = copy_workflow(tmp_path_factory.mktemp("interrupts") / "study")
    add_references(root, {EXPERIMENT: RUN})
    experiments, groups = root / "config" / "experiments", root / "config" / "groups.yaml"
    experiment = plan_study("smoke", [EXPERIMENT], experiments_dir=experiments, groups_path=groups)[0]
    dataset = "p{train_puzzles}-a{num_aug}".format(**experiment.config["data"])
    stage = subprocess.run(
        Study(root, "", "", Path(), Path()).snakemake(
            stage_receipt("results/smoke", "results/storage/smoke", dataset)
        ),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stage.returncode == 0, stage.stderr[-3000:]
    config = root / "reference-config.json"  # the config the workflow's job file carries
    config.write_text(dump_config(experiment.config))
    result = Study(
        root=root,
        config=str(config),
        data=f"results/storage/smoke/datasets/{dataset}",
        run_dir=root / f"results/storage/smoke/runs/{experiment.hash}",
        reference=root / "reference",
    )
    done = subprocess.run(
        result.launch(result.reference),
        cwd=root,
        env=_environment("reference"),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    result.steps = json.loads((result.reference / layout.FINAL).read_text())["steps"]
    return result


def _marked(marker: str, what: str = "") -> list[int]:
    """Processes whose environment holds the test's marker (and whose command line holds `what`)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"{MARKER}={marker}".encode() in environ and what in cmdline:
            found.append(int(proc.name))
    return found


def _wait_for(condition, timeout: float, what: str) -> float:
    """Seconds until `condition()` holds (polled every 50 ms); fails after `timeout`."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"not within {timeout} s: {what}"
        time.sleep(0.05)
    return time.monotonic() - start


def _training(run_dir: Path, attempt: int, proc: subprocess.Popen) -> None:
    """Wait until the trainer's attempt `attempt` has started (status.json), and half a second more. It checks
    for a stop after each step, so every attempt trains at least one step; a faster machine may reach the final
    evaluation, which stops through its own saved progress."""

    def started() -> bool:
        assert proc.poll() is None, "the command ended before training"
        status = read_run(str(run_dir)).status
        return status.get("attempt") == attempt and status.get("state") == "running"

    _wait_for(started, 300, f"attempt {attempt} training in {run_dir}")
    time.sleep(0.5)


def _stop_steps(host_log: Path) -> list[int]:
    return [int(step) for step in STOPPED.findall(host_log.read_text())]


def test_sigint_and_sigterm_to_snakemake_stop_the_job_through_its_checkpoint_and_a_rerun_resumes(study):
    marker = uuid.uuid4().hex
    env = _environment(marker)
    target = f"results/smoke/runs/{EXPERIMENT}.json"
    log = study.root / f"results/smoke/logs/train/{EXPERIMENT}.log"
    for attempt, sig in enumerate((signal.SIGINT, signal.SIGTERM), start=1):
        proc = subprocess.Popen(
            study.snakemake(target), cwd=study.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        _training(study.run_dir, attempt, proc)
        proc.send_signal(sig)
        trainer_s = _wait_for(lambda: not _marked(marker, "trm.cli train"), 120, "the trainer to stop")
        output = proc.communicate(timeout=120)[0].decode()
        snakemake_s = trainer_s + _wait_for(lambda: not _marked(marker), 30, "every process to end")
        print(f"{sig.name} to snakemake: trainer gone after {trainer_s:.1f} s, all after {snakemake_s:.1f} s")
        assert proc.returncode == 128 + sig, output[-3000:]
        assert f"Interrupted by {sig.name}" in output and "Rerun the same command to resume" in output
        assert "Will exit after finishing currently running jobs" not in output
        state = read_run(str(study.run_dir)).status["state"]  # preempted: its checkpoint saved; not failed
        assert state == "preempted", (output[-3000:], log.read_text()[-3000:])
        assert "[launch] host exit codes: [42]" in log.read_text()

    # Snakemake SIGKILLed: its job's launcher notices and stops the trainer the same way; the lock stays.
    proc = subprocess.Popen(
        study.snakemake(target), cwd=study.root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _training(study.run_dir, 3, proc)
    proc.kill()
    proc.wait()
    killed_s = _wait_for(lambda: not _marked(marker), 120, "the orphaned job to stop")
    print(f"SIGKILL to snakemake: every process of its job gone after {killed_s:.1f} s")
    assert read_run(str(study.run_dir)).status["state"] == "preempted"
    locked = subprocess.run(study.snakemake(target), cwd=study.root, env=env, capture_output=True, text=True)
    assert locked.returncode != 0 and "--unlock" in locked.stdout + locked.stderr
    unlock = subprocess.run(study.snakemake("--unlock"), cwd=study.root, capture_output=True, text=True)
    assert unlock.returncode == 0, unlock.stderr[-3000:]

    finished = subprocess.run(
        study.snakemake(target), cwd=study.root, env=env, capture_output=True, text=True
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    host_log = Path(layout.host_log(str(study.run_dir), 0))
    stops = _stop_steps(host_log)
    assert (
        len(stops) == 3 and stops == sorted(stops) and 0 < stops[0] < study.steps and stops[-1] <= study.steps
    ), stops
    assert f"resuming from step {stops[-1]} of {study.steps}" in log.read_text()
    assert host_log.read_text().count("(earlier attempts above)") == 3  # four attempts, none overwritten
    final, reference = (json.loads((d / layout.FINAL).read_text()) for d in (study.run_dir, study.reference))
    assert final["params_sha256"] == reference["params_sha256"]
    assert final["ema_sha256"] == reference["ema_sha256"]
    assert final["test"] == reference["test"]
    assert _marked(marker) == []


def _checkpoint_after(run_dir: Path, step: int, proc: subprocess.Popen) -> int:
    """Wait for a checkpoint after `step` (the trainers are past their first steps); its step."""

    def latest() -> int:
        assert proc.poll() is None, "the launcher ended before the checkpoint"
        return max((int(p.name) for p in (run_dir / "ckpt").glob("[0-9]*") if p.name.isdigit()), default=-1)

    _wait_for(lambda: latest() > step, 300, f"a checkpoint after step {step} in {run_dir}")
    return latest()


def test_a_killed_launcher_takes_its_trainers_with_it_through_their_checkpoint(study, tmp_path):
    marker = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    # Two hosts (each stops through JAX's preemption service), checkpoints every 2 steps to see them train.
    command = [*study.launch(run_dir, hosts=2), "--set=train.checkpoint_every_steps=2"]
    with open(tmp_path / "launch.log", "w") as out:
        proc = subprocess.Popen(command, cwd=study.root, env=_environment(marker), stdout=out, stderr=out)
        _checkpoint_after(run_dir, 0, proc)
        proc.kill()
        proc.wait()
    orphans_s = _wait_for(lambda: not _marked(marker), 60, "the killed launcher's trainers to end")
    print(f"launcher SIGKILLed: its 2 trainers gone after {orphans_s:.1f} s")
    # Their parent-death signal is SIGTERM: they saved a checkpoint, and writing to the dead launcher's pipe did
    # not turn that stop into a failure.
    assert read_run(str(run_dir)).status["state"] == "preempted"
    stopped = _stop_steps(Path(layout.host_log(str(run_dir), 0)))
    assert len(stopped) == 1 and stopped == _stop_steps(Path(layout.host_log(str(run_dir), 1)))

    # The relaunch resumes; SIGTERM stops it through the same path, and each host's log keeps both attempts.
    with open(tmp_path / "relaunch.log", "w") as out:
        proc = subprocess.Popen(command, cwd=study.root, env=_environment(marker), stdout=out, stderr=out)
        _checkpoint_after(run_dir, stopped[0], proc)
        proc.send_signal(signal.SIGTERM)
        stop_s = _wait_for(lambda: proc.poll() is not None, 120, "the launcher to stop")
    print(f"SIGTERM to a launcher of 2 hosts: it exited after {stop_s:.1f} s")
    assert proc.returncode == 42
    assert f"resuming from step {stopped[0]} of {study.steps}" in (tmp_path / "relaunch.log").read_text()
    for host in (0, 1):
        host_log = Path(layout.host_log(str(run_dir), host))
        assert len(_stop_steps(host_log)) == 2 and "(earlier attempts above)" in host_log.read_text()
    assert _marked(marker) == []


# A "Snakemake" whose main thread waits for its job (as Snakemake's scheduler does) while the signal is delivered
# to another thread: Python would run the main thread's handler only once the job ends.
BLOCKED_CONTROLLER = """
import signal, subprocess, sys, threading, time
from trm.study import interrupts
interrupts.install()
job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
job_ended = threading.Semaphore(0)
def job_thread():
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIG{name})  # this thread, not the main one
    job.wait()
    print(f"job ended by {{-job.returncode}} after {{time.monotonic() - start:.2f}} s", flush=True)
    time.sleep(0.5)
    job_ended.release()
start = time.monotonic()
threading.Thread(target=job_thread, daemon=True).start()
try:
    job_ended.acquire()
except KeyboardInterrupt:
    print(f"KeyboardInterrupt after {{time.monotonic() - start:.2f}} s", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_delivered_to_another_thread_stops_the_jobs_at_once(sig, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_CONTROLLER.format(name=sig.name[3:])],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ended = re.search(r"job ended by (\d+) after ([\d.]+) s", done.stdout)
    assert ended, done.stdout + done.stderr
    # Ended by SIGINT, as from a terminal's Ctrl-C: sent while the main thread still waited for the job to end (a
    # handler run only by the main thread could not have sent it before the job's own 60 s were over).
    assert int(ended[1]) == signal.SIGINT
    assert f"{sig.name}: stopping the running jobs (1 processes get SIGINT)" in done.stderr
    assert "KeyboardInterrupt after" in done.stdout  # Snakemake's own path still follows

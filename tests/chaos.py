"""The chaos study: a small TPU study under the fake cloud, run once undisturbed and once with injected faults.

Used by tests/test_chaos.py and benchmarks/soak_chaos.py (which imports this module by path). A study is a copy
of the workflow whose experiments are the references `chaos_*` (config/experiments/chaos_*.yaml, tiny width, a
few hundred steps, a checkpoint every few dozen), trained through a test profile derived from profiles/tpu-v4-64
(fake_tpu.tpu_test_profile) on a pool of fake slices (tests/fake_gcloud/gcloud), with storage on the GCS
emulator. A `Chaos` runs Snakemake on it and injects `Fault`s when the runs reach given steps; `fingerprint`
gives every figure that must not depend on the faults, to compare with the undisturbed study's.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fake_tpu import node_pids, tpu_test_profile
from workflow_support import add_references, copy_workflow

from trm import storage
from trm.run import layout
from trm.study.plan import plan_study

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# One chaos experiment, as overrides of config/base.yaml (the smoke scale divides width and batch, sets the
# epochs: trm/study/scale.py): hidden 8, one layer in float32 (the test suite's, and cheaper to compile), batch 8
# (two rows per device of 2 hosts x 2), 20 puzzles x 64 epochs / 8 = 160 steps, a checkpoint every 20.
EXPERIMENT = {
    "arch": {"hidden_size": 128, "num_heads": 2, "L_layers": 1, "H_cycles": 2, "L_cycles": 2, "halt_max_steps": 2,
             "forward_dtype": "float32"},
    "data": {"train_puzzles": 200, "num_aug": 20},
    "train": {"global_batch_size": 1536, "eval_steps": 2, "checkpoint_every_steps": 20},
}  # fmt: skip
TEST_TIME_STEPS = [2, 4]
# Table columns that measure time or speed: they differ between any two runs.
TIMED_COLUMNS = ("examples_per_second", "step_time_s", "wall", "seconds", "elapsed", "_per_s", "hours")


@dataclass
class Study:
    """A copy of the workflow at `root` whose study is `experiments`, run through `profile`."""

    root: Path
    profile: Path
    experiments: list[str]
    env: dict[str, str]
    slices: tuple[str, ...]
    run_dirs: dict[str, str] = field(default_factory=dict)  # experiment -> its run dir's URL
    cores: int = 4  # Snakemake's: how many of its runs' jobs may run at once

    @property
    def results(self) -> Path:
        return self.root / "results" / "smoke"

    def command(self) -> list[str]:
        targets = ["aggregate", *(f"results/smoke/runs/{e}.json" for e in self.experiments)]  # the table too
        return [SNAKEMAKE, "--profile", str(self.profile), "--cores", str(self.cores), *targets]

    def gcloud(self, *args: str) -> None:
        subprocess.run(["gcloud", *args], env=self.env, check=True, timeout=60, capture_output=True)


def make_study(root: Path, storage_url: str, slices: tuple[str, ...], runs: int, env: dict[str, str], tpu: dict,
               experiment: dict = EXPERIMENT) -> Study:  # fmt: skip
    """A study of `runs` runs of `experiment`, differing in their seed, in a new copy of the workflow at `root`."""
    copy_workflow(root)
    experiments = [f"chaos_{chr(ord('a') + n)}" for n in range(runs)]
    seeded = {
        name: {**experiment, "train": {**experiment["train"], "seed": n}}
        for n, name in enumerate(experiments)
    }
    add_references(root, seeded)
    groups = root / "config" / "groups.yaml"
    profile = tpu_test_profile(  # one seed per baseline: no noise-floor run trains (trm/study/selection.py)
        root, storage_url, slices, root / "locks", tpu=tpu, experiments=experiments,
        test_time_steps={"smoke": TEST_TIME_STEPS, "paper": TEST_TIME_STEPS}, replicates={"smoke": {"baseline": 1}},
        test_time_trajectories={"smoke": [], "mini": [4, 16], "paper": []},  # no sampling: no fingerprint reads it
        test_time_subset={"smoke": None, "mini": None, "paper": 43008},  # the whole split: as `trm evaluate` does
    )  # fmt: skip
    study = Study(root, profile, experiments, env, slices)
    plan = plan_study(
        "smoke", experiments, experiments_dir=root / "config" / "experiments", groups_path=groups
    )
    study.run_dirs = {exp.id: f"{storage_url}/smoke/runs/{exp.hash}" for exp in plan}
    return study


def read_json(url: str) -> dict:
    try:
        return json.loads(storage.read_text(url))
    except (FileNotFoundError, ValueError):
        return {}


def fingerprint(study: Study) -> dict:
    """Every figure of the finished study that must not depend on how it got there: per run, the parameter
    digests (of every host), final.json's figures, test_time.json's, metrics.jsonl without its speeds; and the
    table's columns that measure no time."""
    out = {}
    for exp in study.experiments:
        run = study.run_dirs[exp]
        final = json.loads(storage.read_text(layout.path(run, layout.FINAL)))
        keep = ("params_sha256", "ema_sha256", "hosts_params_sha256", "hosts_ema_sha256", "test", "best_test")
        records = [
            json.loads(line) for line in storage.read_text(layout.path(run, layout.METRICS)).splitlines()
        ]
        out[exp] = {
            "final": {key: final[key] for key in keep},
            "test_time": json.loads(storage.read_text(layout.path(run, layout.TEST_TIME)))["results"],
            "metrics": [{k: v for k, v in r.items() if not k.endswith("_per_s")} for r in records],
        }
    with open(next(study.results.glob("selections/*/table.csv"))) as stream:  # the one selection's table
        rows = list(csv.DictReader(stream))
    out["table"] = [{k: v for k, v in row.items() if not any(t in k for t in TIMED_COLUMNS)} for row in rows]
    return out


def progress(study: Study) -> dict[str, dict]:
    """Each run's status.json (empty before its trainers start)."""
    return {exp: read_json(layout.path(url, layout.STATUS)) for exp, url in study.run_dirs.items()}


# ------------------------------------------------------------------------------------------------- faults

FAULT_KINDS = {
    "preempt": "the run's slice is preempted (gcloud fake-preempt): its hosts die",
    "kill-host": "one host's trainer is killed (SIGKILL) between two checkpoints",
    "notice": "one host's trainer gets a preemption notice (SIGTERM): the hosts checkpoint and stop",
    "gcloud": "the next gcloud calls of a verb fail (gcloud fake-fault VERB KIND COUNT)",
    "kill-launcher": "the run's `trm launch` is killed (SIGKILL)",
    "kill-controller": "snakemake is killed (SIGKILL), unlocked (--unlock) and started again",
}
# Faults that stop the run's trainers: the next one on that run waits for a new attempt of them.
STOPPING = ("preempt", "kill-host", "notice", "kill-launcher")
# What the launchers and Snakemake log in reaction to a fault that stops trainers (lines of the job's log and of
# Snakemake's), and to a gcloud fault (a line naming its verb and its error; ssh prints gcloud's own error).
REACTIONS = (
    "is PREEMPTED",
    "to recreate",
    "launch state preempted",
    "launch state failed",
    "starting on the hosts failed",
    "already finished",
    "is in use by another job",
    "Trying to restart job",
)
GCLOUD_ERRORS = {
    "unavailable": "HttpError 503",
    "throttled": "HttpError 429",
    "timeout": "timed out",
    "network": "problem with the connection",
}
GCLOUD_VERBS = {
    "describe": "describe: transient failure",
    "create": "creating queued resource",
    "delete": "delete queued resource",
    "ssh": "ERROR: (gcloud)",
}


@dataclass
class Fault:
    """`kind` (FAULT_KINDS), injected once run `run`'s status.json shows step >= `at_step` (after the previous
    fault of the run; a STOPPING one's in a new attempt of its trainers). `detail`: "VERB KIND COUNT" for gcloud,
    the worker for kill-host and notice."""

    kind: str
    run: str
    at_step: int
    detail: str = ""
    injected_at: float | None = None
    attempt: int = 0  # the run's trainer attempt when injected
    what: str = ""  # what was done, exactly
    triggered: list[str] = field(default_factory=list)  # filled by Chaos.report


def trainer_pid(slice_name: str, worker: int) -> int | None:
    """The `trm train` process of worker `worker` of the fake slice (its HOME is hosts/SLICE/WORKER)."""
    for pid in node_pids(slice_name):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        home = next((e for e in environ if e.startswith(b"HOME=")), b"")
        ours = home.endswith(f"/{slice_name}/{worker}".encode())
        if ours and b"trm.cli" in command and b"train" in command:
            return pid
    return None


def launcher_pid(run_dir: str) -> int | None:
    """The `trm launch --job RESULTS/SCALE/jobs/<hash>.json` process of the job training `run_dir` (which the
    hash names)."""
    job = f"/jobs/{run_dir.rstrip('/').rsplit('/', 1)[-1]}.json".encode()
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if b"launch" in command and any(arg.endswith(job) for arg in command):
            return int(proc.name)
    return None


class Chaos:
    """Runs the study's Snakemake command to the end, injecting `faults` as the runs reach their steps, and keeps
    what the jobs logged (a retried or restarted job truncates its log) and each trainer attempt's first step."""

    def __init__(self, study: Study, faults: list[Fault], say: Callable[[str], None] = print) -> None:
        self.study = study
        self.faults = faults
        self.say = say
        self.controllers: list[subprocess.Popen] = []
        self.logs: dict[Path, list[str]] = {}  # job log -> its contents, one entry per truncation
        self.attempts: dict[str, list[tuple[int, int, float]]] = {e: [] for e in study.experiments}
        self.started = time.time()

    # ------------------------------------------------------------------------------------------ running

    def run(self, timeout: float) -> int:
        """Snakemake's exit code (of its last start); faults not injected by then stay un-injected."""
        self._start()
        pending = list(self.faults)
        deadline = time.time() + timeout
        try:
            while self.controllers[-1].poll() is None:
                if time.time() > deadline:
                    raise TimeoutError(f"the study did not finish within {timeout:.0f} s")
                statuses = progress(self.study)
                self._observe(statuses)
                for fault in [f for f in pending if self._ready(f, statuses, pending)]:
                    self._inject(fault, statuses[fault.run])
                    pending.remove(fault)
                time.sleep(0.2)
            self._observe(progress(self.study))
            return self.controllers[-1].returncode
        finally:
            self.stop()

    def _start(self) -> None:
        log = open(self.study.root / f"snakemake-{len(self.controllers)}.log", "w")
        self.controllers.append(
            subprocess.Popen(
                self.study.command(),
                cwd=self.study.root,
                env=self.study.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        )
        log.close()

    def stop(self) -> None:
        """End every process of the study: its Snakemake runs and their jobs, and the slices' hosts."""
        for proc in self.controllers:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        for name in self.study.slices:
            for pid in node_pids(name):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _ready(self, fault: Fault, statuses: dict[str, dict], pending: list[Fault]) -> bool:
        earlier = [
            f for f in self.faults if f.run == fault.run and self.faults.index(f) < self.faults.index(fault)
        ]
        if any(f in pending for f in earlier):
            return False
        status = statuses[fault.run]
        stopped = [f.attempt for f in earlier if f.kind in STOPPING]
        return (
            status.get("state") == "running"
            and status.get("step", 0) >= fault.at_step
            and status.get("attempt", 0) > max(stopped, default=0)
        )

    def _inject(self, fault: Fault, status: dict) -> None:
        fault.injected_at, fault.attempt = time.time(), status.get("attempt", 0)
        slice_name = status.get("slice", "")
        if fault.kind == "preempt":
            self.study.gcloud("fake-preempt", slice_name)
            fault.what = f"preempted slice {slice_name}"
        elif fault.kind in ("kill-host", "notice"):
            worker = int(fault.detail or 1)
            pid = trainer_pid(slice_name, worker)
            sig = signal.SIGKILL if fault.kind == "kill-host" else signal.SIGTERM
            if pid is not None:
                os.kill(pid, sig)
            fault.what = f"{sig.name} to worker {worker}'s trainer on {slice_name} (pid {pid})"
        elif fault.kind == "gcloud":
            self.study.gcloud("fake-fault", *fault.detail.split())
            fault.what = f"gcloud fake-fault {fault.detail}"
        elif fault.kind == "kill-launcher":
            pid = launcher_pid(self.study.run_dirs[fault.run])
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            fault.what = f"SIGKILL to the trm launch of {fault.run} (pid {pid})"
        elif fault.kind == "kill-controller":
            controller = self.controllers[-1]
            os.kill(controller.pid, signal.SIGKILL)
            controller.wait()
            unlock = subprocess.run(
                [*self.study.command(), "--unlock"], cwd=self.study.root, env=self.study.env,
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            self._start()
            fault.what = (
                f"SIGKILL to snakemake (pid {controller.pid}), --unlock (exit {unlock.returncode}), restarted"
            )
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}: one of {', '.join(FAULT_KINDS)}")
        self.say(f"{time.time() - self.started:6.1f} s  {fault.run} at step {status.get('step')} "
                 f"(attempt {fault.attempt}): {fault.what}")  # fmt: skip

    def _observe(self, statuses: dict[str, dict]) -> None:
        """Record each new trainer attempt with the step it started from, and grow the kept job logs."""
        for exp, status in statuses.items():
            seen = self.attempts[exp]
            if status.get("attempt") and (not seen or seen[-1][0] != status["attempt"]):
                seen.append((status["attempt"], status.get("step", 0), time.time()))
        for path in sorted((self.study.results / "logs" / "train").glob("*.log")):
            text = path.read_text(errors="replace")
            kept = self.logs.setdefault(path, [""])
            if text.startswith(kept[-1]):
                kept[-1] = text
            else:
                kept.append(text)

    # ------------------------------------------------------------------------------------------ reading

    def lines(self) -> list[tuple[float, str, str]]:
        """(time, experiment or "snakemake", line) of every kept job log line and Snakemake's output, each line
        stamped with the latest timestamp at or before it (the logs stamp whole seconds)."""
        out = []
        logs = [(path.stem, text) for path, texts in self.logs.items() for text in texts]
        logs += [
            ("snakemake", p.read_text(errors="replace"))
            for p in sorted(self.study.root.glob("snakemake-*.log"))
        ]
        for source, text in logs:
            stamp = 0.0
            for line in text.splitlines():
                if match := re.match(r"^\[tpu-vm (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", line):
                    stamp = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S"))
                elif match := re.match(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$", line):
                    stamp = time.mktime(time.strptime(match[1], "%a %b %d %H:%M:%S %Y"))
                out.append((stamp, source, line.strip()))
        return out

    def report(self) -> list[Fault]:
        """The injected faults with `triggered` filled. A gcloud fault: the first COUNT lines of any job's log
        from its injection on that name its verb and error. Other faults: the reactions in the run's log and
        Snakemake's (for a killed launcher or controller), and the run's trainer attempts started with their first step, from the fault's injection
        until the next fault on the run (or the next controller kill)."""
        lines = self.lines()
        injected = sorted((f for f in self.faults if f.injected_at), key=lambda f: f.injected_at)
        for n, fault in enumerate(injected):
            begin = int(fault.injected_at)
            if fault.kind == "gcloud":
                verb, kind, *count = fault.detail.split()
                signs = (GCLOUD_VERBS[verb], GCLOUD_ERRORS[kind])
                matches = [f"{source}: {line}" for stamp, source, line in lines
                           if stamp >= begin and all(sign in line for sign in signs)]  # fmt: skip
                fault.triggered = matches[: int(count[0]) if count else 1]
                continue
            later = [f for f in injected[n + 1 :] if f.run == fault.run or f.kind == "kill-controller"]
            end = later[0].injected_at if later else float("inf")
            # Snakemake's lines (a job's retry) answer a killed launcher or controller; a controller kill, any run's.
            sources = {
                fault.run,
                *(["snakemake"] if fault.kind in ("kill-launcher", "kill-controller") else []),
            }
            if fault.kind == "kill-controller":
                sources |= {*self.study.experiments}
            fault.triggered = [
                f"{source}: {line}"
                for stamp, source, line in lines
                if begin <= stamp < end and source in sources and any(reaction in line for reaction in REACTIONS)
            ]  # fmt: skip
            fault.triggered += [
                f"{fault.run}: trainers restarted from step {step} (attempt {attempt})"
                for attempt, step, stamp in self.attempts[fault.run]
                if fault.injected_at <= stamp < end
            ]
        return injected

"""The chaos test: a small TPU study (2 runs, each on its own slice of 2 hosts x 2 devices; tests/chaos.py) under
faults finishes with every run's parameters and reported figures bit-identical to the same study undisturbed.

Faults are injected when a run's status.json shows a given step (after a checkpoint), so what each one hits does
not depend on the machine's speed: transient gcloud errors (503, 429, a call that hangs past the launcher's
gcloud timeout), a preempted slice, a preemption notice to one host, a host's trainer killed outright, and one
job's controller (its `trm launch`) killed, which Snakemake starts again.

The undisturbed study is also the test of a real run through the tpu-v4-64 profile (its dry runs and canary:
tests/test_tpu_profile.py): `trm preflight` once before any job, the slices the study created kept and listed with
their delete commands, the two runs on the pool's two slices at once (in the disturbed study, which runs its jobs
together), and a run's final evaluation done on its slice's hosts, equal to a one-process one to the last bit.

Not here: snakemake itself killed and restarted (`--unlock`, the same command; docs/tpu.md, "Faults a study
survives", says what happens). With its whole process group killed, the launchers die and their trainers train
on; the restarted launcher of each run takes its lease over (the holder's process is gone), starts on the run's
last slice, whose start script stops the orphaned trainers with a checkpoint, and resumes: nothing trains twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chaos import EXPERIMENT, TEST_TIME_STEPS, Chaos, Fault, Study, fingerprint, make_study, read_json
from fake_tpu import gcloud_calls, wait_until_exited

from trm import storage
from trm.run import layout

pytestmark = [pytest.mark.tpu, pytest.mark.workflow, pytest.mark.slow]

# The launcher's settings for the study: a hung gcloud call costs 3 s, a run whose trainers died silently (the
# killed host's peer aborts without a word) is relaunched 30 s after their last heartbeat.
TPU = {"gcloud_timeout_seconds": 3, "stale_after_seconds": 30}
# Shorter runs than the soak's (chaos.EXPERIMENT: 160 steps, a checkpoint every 20) with about as many
# checkpoints: at the smoke scale 15 puzzles x 64 epochs / 8 = 120 steps, a checkpoint every 10. A killed
# launcher's trainers train on until its job's retry stops them (about 50 steps on a loaded machine): that one
# comes early, 90 steps before the end. The test checks the step count, since a change of the smoke scale changes
# it (one did: these runs had grown to 480 steps, four times the time).
STEPS = 120
RUNS = {
    **EXPERIMENT,
    "data": {**EXPERIMENT["data"], "train_puzzles": 150},
    "train": {**EXPERIMENT["train"], "checkpoint_every_steps": 10},
}


def _faults() -> list[Fault]:
    return [
        Fault("gcloud", "chaos_a", 10, "describe unavailable 2"),
        Fault("gcloud", "chaos_a", 10, "describe throttled 1"),
        Fault("gcloud", "chaos_a", 10, "describe timeout 1"),
        Fault("gcloud", "chaos_a", 20, "create unavailable 1"),  # the recreation after the preemption
        Fault("preempt", "chaos_a", 20),
        Fault("notice", "chaos_b", 20, "1"),
        Fault("kill-host", "chaos_b", 50, "1"),
        Fault("kill-launcher", "chaos_a", 30),  # Snakemake retries the job
    ]


def test_a_disturbed_study_ends_bit_identical_to_an_undisturbed_one(cloud, tpu_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TPU_DEVICES", "2")
    env = dict(os.environ)
    tag = f"chaos{os.getpid()}"  # slice names of their own: another pytest worker may run fake slices
    started = time.time()
    reference = make_study(
        tmp_path / "reference", f"{tpu_bucket}/reference", (f"{tag}-r0", f"{tag}-r1"), 2, env, TPU, RUNS
    )
    # One run at a time: the second one's hosts read the programs the first one's compiled, where two at once would
    # both compile them (the runs differ only in their seed).
    reference.cores = 1
    assert Chaos(reference, []).run(timeout=600) == 0, (reference.root / "snakemake-0.log").read_text()[
        -4000:
    ]
    undisturbed = time.time() - started
    steps = {
        exp: read_json(layout.path(url, layout.FINAL)).get("steps") for exp, url in reference.run_dirs.items()
    }
    assert set(steps.values()) == {STEPS}, f"runs of {steps} steps: retune RUNS so the faults fall as planned"
    _the_profile_ran_the_study(reference, gcloud_calls(cloud), tmp_path)

    study = make_study(
        tmp_path / "chaos", f"{tpu_bucket}/chaos", (f"{tag}-c0", f"{tag}-c1"), 2, env, TPU, RUNS
    )
    chaos = Chaos(study, _faults())
    rc = chaos.run(timeout=900)
    faults = chaos.report()
    story = "\n".join(f"{f.kind} {f.run} {f.what}\n  " + "\n  ".join(f.triggered) for f in faults)
    print(f"undisturbed {undisturbed:.0f} s, disturbed {time.time() - started - undisturbed:.0f} s\n{story}")
    logs = "".join(p.read_text() for p in sorted(study.root.glob("snakemake-*.log")))
    assert rc == 0, logs[-4000:] + story
    assert len(faults) == len(chaos.faults), story  # every fault was injected

    assert fingerprint(study) == fingerprint(reference)
    # Its two jobs ran at once, each on its own slice of the pool.
    ssh = [argv for argv in gcloud_calls(cloud) if argv[2:4] == ["tpu-vm", "ssh"] and argv[4] in study.slices]
    assert {argv[4] for argv in ssh} == {*study.slices}

    # Each fault was met by what the launchers are for.
    reactions = {(f.kind, f.detail): "\n".join(f.triggered) for f in faults}
    assert "HttpError 503" in reactions["gcloud", "describe unavailable 2"], story
    assert "HttpError 429" in reactions["gcloud", "describe throttled 1"], story
    assert "timed out" in reactions["gcloud", "describe timeout 1"], story
    assert "creating queued resource" in reactions["gcloud", "create unavailable 1"], story
    assert "is PREEMPTED" in reactions["preempt", ""] and "trainers restarted" in reactions["preempt", ""], (
        story
    )
    assert (
        "preemption notice" in reactions["notice", "1"] and "trainers restarted" in reactions["notice", "1"]
    )
    assert (
        "a host is lost" in reactions["kill-host", "1"]
        and "trainers restarted" in reactions["kill-host", "1"]
    )


def _the_profile_ran_the_study(study: Study, calls: list[list[str]], tmp: Path) -> None:
    """What the profile did in the undisturbed study, whose gcloud calls are `calls`: `trm preflight` once, before
    any job; every ssh to all of a slice's workers; the slices it created kept (launch.tpu.delete_after is false)
    and listed at its end with their delete commands; and a run's final evaluation on its slice's 2 hosts x 2
    devices, in the training job (one pass gives final.json's figures and the test-time ones), equal to a
    one-process, 4-device `trm evaluate` of the same checkpoint, every figure to the last bit (the hosts size their
    CPU thread pools as one process would, trm.run.distributed.size_cpu_thread_pool; without that one cell in
    1,296 differed after one step)."""
    output = (study.root / "snakemake-0.log").read_text()
    assert calls[:2] == [["--version"], ["auth", "list", "--filter=status:ACTIVE", "--format=value(account)"]]
    assert "preflight: every check passed" in output and calls.count(["--version"]) == 1
    ssh = [argv for argv in calls if argv[2:4] == ["tpu-vm", "ssh"]]
    assert ssh and all("--worker=all" in argv for argv in ssh)
    created = sorted({argv[4] for argv in calls if argv[2:4] == ["queued-resources", "create"]})
    assert created and f"{len(created)} TPU slice(s) this workflow created still exist" in output
    for name in created:
        assert f"delete: gcloud compute tpus queued-resources delete {name} --zone=" in output
        wait_until_exited(name)
    # The controller evaluated nothing: the training jobs did.
    assert " summarize " in output and " evaluate --checkpoint" not in output

    run_dir = study.run_dirs[study.experiments[0]]
    on_slice = json.loads(storage.read_text(layout.path(run_dir, layout.TEST_TIME)))
    assert on_slice["devices"] == 4 and [r["steps"] for r in on_slice["results"]] == TEST_TIME_STEPS
    host_log = storage.read_text(layout.host_log(on_slice["checkpoint"], 1))
    assert f"test-time evaluation of step counts {','.join(map(str, TEST_TIME_STEPS))}" in host_log
    final = json.loads(storage.read_text(layout.path(run_dir, layout.FINAL)))
    # At train.eval_steps, the final evaluation's pass gave both.
    assert final["processes"] == 2 and final["test"] == on_slice["results"][0]

    one_process = tmp / "one-process.json"
    env = {**study.env, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}
    env.pop("NPROC", None)
    trm = str(Path(sys.executable).with_name("trm"))
    command = [trm, "evaluate", "--checkpoint", on_slice["checkpoint"], "--data", on_slice["data"]]
    command += ["--steps", ",".join(map(str, TEST_TIME_STEPS)), "--out", str(one_process)]
    command += ["--cache-dir", str(tmp / "cache")]
    done = subprocess.run(command, cwd=study.root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    here = json.loads(one_process.read_text())
    assert here["devices"] == 4 and here["batch_size"] == on_slice["batch_size"]
    assert here["results"] == on_slice["results"]

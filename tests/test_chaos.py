"""The chaos test: a small TPU study (2 runs, each on its own slice of 2 hosts x 2 devices; tests/chaos.py) under
faults finishes with every run's parameters and reported figures bit-identical to the same study undisturbed.

Faults are injected when a run's status.json shows a given step (after a checkpoint), so what each one hits does
not depend on the machine's speed: transient gcloud errors (503, 429, a call that hangs past the launcher's
gcloud timeout), a preempted slice, a preemption notice to one host, a host's trainer killed outright, and one
job's controller (its `trm launch`) killed, which Snakemake starts again.

Not here: snakemake itself killed and restarted (`--unlock`, the same command; docs/tpu.md, "Faults a study
survives", says what happens). With its whole process group killed, the launchers die and their trainers train
on; the restarted launcher of each run takes its lease over (the holder's process is gone), starts on the run's
last slice, whose start script stops the orphaned trainers with a checkpoint, and resumes: nothing trains twice.
"""

from __future__ import annotations

import os
import time

import pytest
from chaos import EXPERIMENT, Chaos, Fault, fingerprint, make_study, read_json

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

"""The tpu-v4-64 profile: its dry run needs no gcloud, credentials or network; a failed `trm preflight` stops a
run through a test profile derived from it (tests/fake_tpu.py, on emulated slices of 2 hosts: tests/fake_gcloud/gcloud,
storage on the GCS emulator) before any job; and its `canary` target runs `trm canary` on every host of one such
slice. A whole study run through that profile, two runs at once on a pool of two slices, is the undisturbed study of
tests/test_chaos.py, which checks what the profile did there.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_tpu import gcloud_calls, tpu_test_profile, wait_until_exited
from workflow_support import TPU_PROFILE, copy_workflow, estimates, lighten, study

pytestmark = [pytest.mark.tpu, pytest.mark.workflow, pytest.mark.slow]

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# Not test_tpu_vm.py's slice names: the two files may run at the same time in different pytest workers.
SLICES = ("trm-profile-a", "trm-profile-b")


def test_profile_dry_run_needs_no_gcloud_and_shows_tpu_hours(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    # In a copy: even a dry run writes Snakemake's .snakemake/ (its job files are written before a real run's first job).
    root = copy_workflow(tmp_path / "study")
    # The profile's storage is a placeholder (docs/tpu.md, set-up step 5): set, as a real run needs it.
    settings = ["groups=[exp06]", "storage=gs://my-trm-bucket/trm-study"]
    done = subprocess.run(
        [SNAKEMAKE, "--profile", "profiles/tpu-v4-64", "-n", "--config", *settings],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    jobs = [line for line in output.splitlines() if ": train exp06" in line]
    assert len(jobs) == 6 + 2 and all(
        "32 devices" in line for line in jobs
    )  # and the baseline's 2 replicates
    # Per job, training and evaluation on labelled lines; the evaluation is a pass at train.eval_steps over the
    # test split's 423,168 puzzles, then one to 128 steps on the test-time subset (test_time_subset.paper), in
    # whole batches.
    training, evaluation = estimates(output, "training"), estimates(output, "evaluation")
    replicates = ["exp06_c~s1", "exp06_c~s2"]
    assert (
        sorted(training)
        == sorted(evaluation)
        == sorted([*(f"exp06_{x}" for x in "abcdef"), "ref_paper", *replicates])
    )
    assert all(hours > 0 for hours in evaluation.values())
    assert "x 128 steps on the test-time subset" in output and "TPU v4 chip-hours" in output
    assert "scale paper: 6 experiments" in output
    assert (
        "  price:      $" in output and "TPU v4 chip-hours at $3.22 each" in output
    )  # the public on-demand price
    # Each training job launches its run's job file, which carries the backend and the job's shape.
    files = {
        line.split(" launch --job ")[1].split()[0] for line in output.splitlines() if " launch --job " in line
    }
    # The jobs those files hold, as a real run writes them before its first job (a dry run writes none).
    planned = study(
        tmp_path / "plan", {"groups": ["exp06"], "storage": settings[1].split("=")[1]}, profile=TPU_PROFILE
    )
    assert not any((root / path).exists() for path in files)
    assert {Path(path).name for path in files} == {
        Path(planned.job_file(exp)).name for exp in planned.distinct_runs()
    }
    jobs = [planned.job(exp) for exp in planned.distinct_runs()]
    shapes = collections.Counter((job.backend, job.hosts, job.devices_per_host) for job in jobs)
    assert shapes == {("tpu-vm", 8, 4): 6 + 2, ("tpu-vm", 1, 4): 1}  # ref_paper on its own v4-8
    # The evaluation runs on the slice, in the training job; the controller only collects its results.
    assert "--test-time-steps 16,32,64,128" in output and " summarize " in output
    assert " evaluate --checkpoint" not in output

    placeholder = subprocess.run(
        [SNAKEMAKE, "--profile", "profiles/tpu-v4-64", "-n"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The profile as shipped: a dry run reaches no storage, so it plans, and warns that the bucket is to be set.
    output = placeholder.stdout + placeholder.stderr
    assert placeholder.returncode == 0, output[-4000:]
    assert "TPU v4 chip-hours" in output and "  price:      $" in output
    assert "YOUR-BUCKET is a placeholder" in output and "docs/tpu.md" in output


def _with_profile(profile: Path, root: Path, *targets: str) -> subprocess.CompletedProcess:
    """Snakemake on the workflow at `root` with `profile`, making `targets`."""
    command = [SNAKEMAKE, "--profile", str(profile), "--cores", "2", *targets]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600)


def test_a_failed_preflight_stops_the_study_before_any_job(cloud, tpu_bucket, workdir, tmp_path, monkeypatch):
    root = workdir
    profile = tpu_test_profile(
        root, f"{tpu_bucket}/study", SLICES, tmp_path / "locks", experiments=["exp01a"]
    )
    monkeypatch.setenv("FAKE_GCLOUD_TPU_API", "disabled")
    done = _with_profile(profile, root, "results/smoke/runs/exp01a.json")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "gcloud services enable tpu.googleapis.com" in output and "trm preflight failed" in output
    assert not any(argv[3:4] == ["ssh"] or argv[3:4] == ["create"] for argv in gcloud_calls(cloud))
    assert not (root / "results/smoke/pool").exists() and not (root / "results/smoke/datasets").exists()


def test_the_canary_runs_on_every_host_of_an_emulated_slice_and_prices_the_plan(
    cloud, tpu_bucket, workdir, tmp_path, monkeypatch
):
    """`snakemake --profile tpu-test canary`: `trm canary` on the 2 hosts x 2 devices of one slice through the
    tpu-vm launcher, its page printed on the controller from storage, and its step time in results/measured/."""
    monkeypatch.setenv("FAKE_TPU_DEVICES", "2")
    lighten(workdir)
    profile = tpu_test_profile(workdir, f"{tpu_bucket}/study", SLICES[:1], tmp_path / "locks")
    started = time.time()
    done = _with_profile(profile, workdir, "canary")
    print(f"snakemake --profile tpu-test canary: {time.time() - started:.1f} s")
    log = (workdir / "results/smoke/logs/canary.log").read_text()
    assert done.returncode == 0, done.stderr[-3000:] + log[-3000:]
    lines = done.stdout.splitlines()
    start = lines.index("canary on 4 cpu devices (2 hosts): GO")
    print("\n".join(lines[start : start + 7]))  # the page, for the record (pytest -s)
    assert all(line.startswith("  ok ") for line in lines[start + 1 : start + 7])
    assert "launch state finished" in log  # the tpu-vm launcher watched the canary's markers
    (measured,) = (workdir / "results/measured").glob("*-4.json")
    assert json.loads(measured.read_text())["devices"] == 4
    assert not (workdir / "results/smoke/runs").exists()  # no study job
    wait_until_exited(SLICES[0])

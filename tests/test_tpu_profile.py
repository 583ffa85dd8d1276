"""The tpu-v4-64 profile: its dry run needs no gcloud, credentials or network, and a Snakemake run through a test
profile derived from it trains two tiny experiments at once, each on its own slice of a pool of two emulated
slices (tests/fake_gcloud/gcloud, storage on the GCS emulator), 2 hosts per slice; and its `canary` target runs
`trm canary` on every host of one such slice.
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

from trm import storage
from trm.run import layout
from trm.study.plan import run_dir_of

pytestmark = [pytest.mark.tpu, pytest.mark.workflow, pytest.mark.slow]

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# Not test_tpu_vm.py's slice names: the two files may run at the same time in different pytest workers.
SLICES = ("trm-profile-a", "trm-profile-b")
# The two trained experiments. Their copy of the workflow trains one float32 layer (workflow_support.lighten):
# what the profile does does not depend on the model's depth or dtype, and with the smoke scale's two bfloat16
# layers compiling was most of these runs' time (four hosts compile at once, cold).
TRAINED = ("exp01a", "exp04a_100")


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


def _test_profile(root: Path, tpu_bucket: str, tmp: Path) -> Path:
    """The tpu-test profile with two experiments, evaluated at the headline's 16 supervision steps and at one:
    where the slice's and a one-process evaluation must agree (see below), every count on the whole test split and
    without sampling (two hosts sample as one does: tests/test_multihost.py). A count past the headline's would
    lengthen the evaluation without testing more."""
    test_time_steps = {"smoke": [1, 16], "paper": [16, 32, 64, 128]}
    return tpu_test_profile(
        root, f"{tpu_bucket}/study", SLICES, tmp / "locks", experiments=[*TRAINED],
        test_time_steps=test_time_steps, test_time_subset={"smoke": None, "mini": None, "paper": 43008},
        test_time_trajectories={"smoke": [], "mini": [4, 16], "paper": []},
    )  # fmt: skip


def test_profile_runs_two_experiments_on_an_emulated_slice(cloud, tpu_bucket, workdir, tmp_path, monkeypatch):
    root = workdir
    monkeypatch.setenv("FAKE_TPU_DEVICES", "2")
    lighten(root)
    profile = _test_profile(root, tpu_bucket, tmp_path)
    targets = [f"results/smoke/runs/{exp}.json" for exp in TRAINED]
    started = time.time()
    done = _with_profile(profile, root, *targets)
    print(f"snakemake --profile tpu-test, two experiments: {time.time() - started:.1f} s")
    logs = "".join(p.read_text() for p in (root / "results/smoke/logs/train").glob("*.log"))
    assert done.returncode == 0, done.stderr[-3000:] + logs[-3000:]
    for target in targets:
        assert json.loads((root / target).read_text())["test_time"]
    assert "launch state finished" in logs
    # trm preflight ran once, before any job, and every check passed.
    calls = gcloud_calls(cloud)
    assert calls[:2] == [["--version"], ["auth", "list", "--filter=status:ACTIVE", "--format=value(account)"]]
    assert "preflight: every check passed" in done.stdout + done.stderr
    assert sum(argv == ["--version"] for argv in calls) == 1
    # The two jobs ran at once, each on its own slice of the pool.
    ssh = [argv for argv in gcloud_calls(cloud) if argv[2:4] == ["tpu-vm", "ssh"]]
    assert ssh and all("--worker=all" in argv for argv in ssh)
    assert {argv[4] for argv in ssh} == {*SLICES}
    for name in SLICES:
        wait_until_exited(name)
    # The study created both slices and kept them (delete_after: false): its end lists them, and how to delete.
    assert "2 TPU slice(s) this workflow created still exist" in done.stderr
    for name in SLICES:
        assert f"delete: gcloud compute tpus queued-resources delete {name} --zone=" in done.stderr
    _evaluated_on_the_hosts_in_the_training_job(
        root, f"{tpu_bucket}/study", done.stdout + done.stderr, tmp_path
    )


def _evaluated_on_the_hosts_in_the_training_job(
    root: Path, storage_root: str, output: str, tmp: Path
) -> None:
    """The final evaluation ran on the slice's 2 hosts x 2 devices, in the training job, not on the controller; one
    pass gave both the test-time figures and final.json's; and they equal a one-process, 4-device `trm evaluate`
    of the same checkpoint, every figure to the last bit (the hosts size their CPU thread pools as one process
    would, trm.run.distributed.size_cpu_thread_pool; without that one cell in 1,296 differed after one step)."""
    assert " summarize " in output and " evaluate --checkpoint" not in output
    summary = json.loads((root / "results/smoke/runs/exp01a.json").read_text())
    run_dir = run_dir_of(storage_root, "smoke", summary["config_hash"])
    slice_run = json.loads(storage.read_text(layout.path(run_dir, layout.TEST_TIME)))
    assert slice_run["devices"] == 4 and [r["steps"] for r in slice_run["results"]] == [1, 16]
    host_log = storage.read_text(layout.host_log(slice_run["checkpoint"], 1))
    assert "test-time evaluation of step counts 1,16" in host_log
    final = json.loads(storage.read_text(layout.path(run_dir, layout.FINAL)))
    assert final["processes"] == 2 and final["test"] == slice_run["results"][1]  # one pass gives both

    one_process = tmp / "one-process.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}
    env.pop("NPROC", None)
    trm = str(Path(sys.executable).with_name("trm"))
    command = [trm, "evaluate", "--checkpoint", slice_run["checkpoint"], "--data", slice_run["data"]]
    command += ["--steps", "1,16", "--out", str(one_process), "--cache-dir", str(tmp / "cache")]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    here = json.loads(one_process.read_text())
    assert here["devices"] == 4 and here["batch_size"] == slice_run["batch_size"]
    assert here["results"] == slice_run["results"]


def test_a_failed_preflight_stops_the_study_before_any_job(cloud, tpu_bucket, workdir, tmp_path, monkeypatch):
    root = workdir
    profile = _test_profile(root, tpu_bucket, tmp_path)
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

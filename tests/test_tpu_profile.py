"""The tpu-v4-64 profile: its dry run needs no gcloud, credentials or network, and a Snakemake run through a test
profile derived from it trains two tiny experiments at once, each on its own slice of a pool of two emulated
slices (tests/fake_gcloud/gcloud, storage on the GCS emulator), 2 hosts per slice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from fake_tpu import gcloud_calls, wait_until_exited

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# Not test_tpu_vm.py's slice names: the two files may run at the same time in different pytest workers.
SLICES = ("trm-profile-a", "trm-profile-b")


def test_profile_dry_run_needs_no_gcloud_and_shows_tpu_hours(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    # The profile's storage is a placeholder, refused until set (docs/tpu.md, set-up step 5).
    settings = ["groups=[exp06]", "storage=gs://my-trm-bucket/trm-study"]
    done = subprocess.run(
        [SNAKEMAKE, "--profile", "profiles/tpu-v4-64", "-n", "--config", *settings],
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

    placeholder = subprocess.run(
        [SNAKEMAKE, "--profile", "profiles/tpu-v4-64", "-n"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = placeholder.stdout + placeholder.stderr
    assert (
        placeholder.returncode != 0 and "YOUR-BUCKET is a placeholder" in output and "docs/tpu.md" in output
    )


def _test_profile(root: Path, tpu_bucket: str, tmp: Path) -> Path:
    """profiles/tpu-v4-64 with the same keys, on the emulator: a pool of two slices of 2 hosts x 1 device, smoke
    scale, fast polls."""
    profile = root / "profiles" / "tpu-test"
    shutil.copytree(REPO / "profiles" / "tpu-v4-64", profile)
    settings = yaml.safe_load((profile / "config.yaml").read_text())
    settings["resources"]["tpu"] = 2  # one training job per slice of the pool
    (profile / "config.yaml").write_text(yaml.safe_dump(settings))
    study = yaml.safe_load((profile / "study.yaml").read_text())
    study.update(scale="smoke", storage=f"{tpu_bucket}/study", experiments=["exp01a", "exp04a_100"])
    study["launch"].update(hosts=2, devices_per_host=1)
    study["launch"]["tpu"].update(
        slices=[*SLICES],
        project="trm-test-project",
        python=sys.executable,  # a local Python 3.11 with the dependencies for the stock-image hosts' venv
        install_dependencies=False,
        coordinator_port=0,
        lock_dir=str(tmp / "locks"),
        poll_seconds=0.5,
        stop_grace_seconds=30,
    )
    (profile / "study.yaml").write_text(yaml.safe_dump(study))
    return profile


def test_profile_runs_two_experiments_on_an_emulated_slice(cloud, tpu_bucket, workdir, tmp_path):
    root = workdir
    profile = _test_profile(root, tpu_bucket, tmp_path)
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


def test_a_failed_preflight_stops_the_study_before_any_job(cloud, tpu_bucket, workdir, tmp_path, monkeypatch):
    root = workdir
    profile = _test_profile(root, tpu_bucket, tmp_path)
    monkeypatch.setenv("FAKE_GCLOUD_TPU_API", "disabled")
    done = subprocess.run(
        [SNAKEMAKE, "--profile", str(profile), "--cores", "2", "results/smoke/runs/exp01a/final.json"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "gcloud services enable tpu.googleapis.com" in output and "trm preflight failed" in output
    assert not any(argv[3:4] == ["ssh"] or argv[3:4] == ["create"] for argv in gcloud_calls(cloud))
    assert not (root / "results/smoke/pool").exists() and not (root / "results/smoke/datasets").exists()

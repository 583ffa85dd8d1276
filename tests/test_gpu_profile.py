"""The gpu profile (profiles/gpu): its dry run plans every job on the machine's GPUs through the local backend,
and a job that asks for GPUs the machine does not show stops in one line before it touches its run dir."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workflow_support import copy_workflow, study

pytestmark = pytest.mark.workflow

BIN = Path(sys.executable).parent


def test_gpu_profile_plans_local_jobs_on_gpus_and_a_missing_gpu_is_one_line(tmp_path, monkeypatch):
    root = copy_workflow(tmp_path / "study")
    env = {**os.environ, "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(BIN / "snakemake"), "--profile", "profiles/gpu", "-n", "--config", "experiments=[exp01a]"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "scale paper: 1 experiments" in output and "NVIDIA H100 GPU-hours" in output
    # exp01a's job, beside the baseline replicates that measure its noise floor (tests/test_selection.py).
    (job_name,) = re.findall(
        r"launch --job (results/paper/jobs/\w+\.json) && \S+ summarize \S+ [^>]*exp01a\.json", output
    )
    job_file = root / job_name
    # A dry run writes nothing; a real run writes the job file before its first job, as here from the same settings.
    assert not job_file.exists()
    monkeypatch.chdir(root)
    profile = yaml.safe_load((root / "profiles/gpu/study.yaml").read_text())
    settings = {"results": "results", "storage": "results/storage", "experiments": ["exp01a"]}
    study(root, settings, profile=profile).write_jobs()
    job = json.loads(job_file.read_text())
    assert (job["backend"], job["platform"], job["hosts"], job["devices_per_host"]) == ("local", "gpu", 1, 1)
    assert f"launch --job {job_file.relative_to(root)}" in output

    # No GPU visible (this machine has none; on a GPU machine CUDA_VISIBLE_DEVICES="" hides them): one line,
    # exit 2, and the run dir is not created, its lease not taken.
    launch = subprocess.run(
        [str(BIN / "trm"), "launch", "--job", str(job_file)],
        cwd=root,
        env={**env, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert launch.returncode == 2, launch.stdout + launch.stderr
    (message,) = [line for line in launch.stderr.splitlines() if ": note: " not in line]  # one line
    assert "Traceback" not in launch.stderr
    assert "launch.platform is gpu, but this machine has no NVIDIA GPU" in message or (
        "needs 1 hosts x 1 GPUs, and this machine shows 0" in message
    )
    assert not (root / job["run_dir"]).exists()  # a local path under results/storage

"""A dry run (`snakemake -n`) writes nothing: the job files and the model-cost cache are written before a real run's
first job (the Snakefile's onstart), each run's job file once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trm.launch.job import read_job
from trm.study.plan import plan_study

pytestmark = pytest.mark.workflow

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file below `root` but Snakemake's own folder: its size and modification time."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and ".snakemake" not in p.relative_to(root).parts
    }


def test_a_dry_run_writes_nothing_and_a_real_run_writes_each_runs_job_file_once(workdir):
    experiments = ["exp01a", "exp01c", "exp05_d"]  # two baselines: one run, one job file (per seed)
    config = ["--config", "experiments=[exp01a,exp01c,exp05_d]", "replicates={smoke: {baseline: 1}}"]
    before = tree(workdir)
    run = subprocess.run([SNAKEMAKE, "-n", *config], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert tree(workdir) == before and "train" in run.stdout + run.stderr
    # A real run, of its cheapest job (the puzzle pool): the job files are written before it, with the model costs.
    pool = "results/smoke/pool/train.csv"
    run = subprocess.run(
        [SNAKEMAKE, "--cores", "1", *config, "--", pool],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (workdir / "results/.cache/model-costs.json").is_file()
    plan = plan_study("smoke", experiments)
    files = sorted((workdir / "results/smoke/jobs").iterdir())
    assert [f.name for f in files] == sorted({f"{exp.hash}.json" for exp in plan}) and len(files) == 2
    for exp in plan:
        job = read_job(str(workdir / f"results/smoke/jobs/{exp.hash}.json"))
        assert job.run.config == exp.config and job.run.config_hash == exp.hash
        assert job.run.run_dir == f"results/storage/smoke/runs/{exp.hash}"

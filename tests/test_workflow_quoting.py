"""No workflow setting ever becomes shell code: every placeholder of every rule's shell command is quoted, a dry
run with shell metacharacters and spaces in every string setting that reaches a command prints each one as a
single quoted argument, and a real run of the dataset stages with such a storage path and results folder runs no
injected command. Bad storage URLs are refused at parse time."""

from __future__ import annotations

import ast
import copy
import os
import re
import shlex
import string
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workflow_support import study

from trm.launch.job import read_job
from trm.study.plan import plan_study, stage_receipt

pytestmark = pytest.mark.workflow

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def hostile(key: str) -> str:
    """A value that runs `touch PWNED-<key>...` in three ways if it reaches a shell unquoted, with spaces and
    both quote characters (no braces: Snakemake reads them as wildcards in output paths)."""
    return f"{key} a;touch PWNED-{key};$(touch PWNED2-{key}) `touch PWNED3-{key}` 'q\"x"


def pwned(*roots: Path) -> list[Path]:
    return [path for root in roots for path in root.rglob("PWNED*")]


def shell_commands(text: str) -> list[str]:
    """The commands a `snakemake -p` run printed ("Shell command: ...")."""
    return [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Shell command: ")]


def snakemake(workdir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SNAKEMAKE, *args], cwd=workdir, capture_output=True, text=True, timeout=timeout, env=os.environ
    )


# ------------------------------------------------------------------------------------------ the rule files


def _shell_templates(path: Path) -> list[str]:
    """The shell command string of each rule in a .smk file (adjacent literals under `shell:`, comments skipped)."""
    templates, lines = [], path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "shell:":
            continue
        indent = len(line) - len(line.lstrip())
        body = []
        for following in lines[i + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            if not following.strip().startswith("#"):
                body.append(following.strip())
        templates.append(ast.literal_eval("(" + " ".join(body).rstrip(",") + ")"))
    return templates


def test_every_placeholder_of_every_shell_command_is_quoted():
    files = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    templates = [template for path in files for template in _shell_templates(path)]
    assert len(templates) >= 8  # every rule that runs a command
    for template in templates:
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(template) if name is not None]
        assert fields, template
        unquoted = [name for name, spec in fields if not (spec or "").endswith("q")]
        assert not unquoted, f"unquoted placeholders {unquoted} in: {template}"


# ------------------------------------------------------------------------------------ hostile settings


@pytest.mark.parametrize("backend", ["local", "tpu-vm"])
def test_dry_run_prints_every_hostile_setting_as_one_quoted_argument(workdir, backend, monkeypatch):
    settings: dict = {"experiments": ["exp01a"]}
    values = {"results": hostile("results"), "lock_dir": hostile("lock_dir")}
    if backend == "local":
        values["storage"] = hostile("storage")
        settings.update(scale="smoke", storage=values["storage"])
    else:  # the paper scale builds from `source`; TPU hosts need gs:// URLs
        values.update(
            storage=f"gs://trm-bucket/{hostile('storage')}",
            code_url=f"gs://trm-bucket/{hostile('code_url')}",
            source=hostile("source"),
        )
        settings.update(scale="paper", storage=values["storage"], source=values["source"])
        settings["launch"] = {"backend": "tpu-vm", "tpu": {"code_url": values["code_url"]}}
    settings["results"] = values["results"]
    settings.setdefault("launch", {}).setdefault("tpu", {})["lock_dir"] = values["lock_dir"]
    (workdir / "hostile.yaml").write_text(yaml.safe_dump(settings))

    done = snakemake(workdir, "-n", "-p", "--configfile", "hostile.yaml")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    commands = shell_commands(output)
    assert len(commands) >= 7, output[-4000:]
    carried = set()
    for command in commands:
        for token in shlex.split(command):  # how sh splits it: a value split into words was not quoted
            for key, value in values.items():
                if f"PWNED-{key}" in token:
                    assert value in token, f"{key} split up or altered in: {command}"
                    carried.add(key)
    in_job = {"lock_dir", "code_url"}  # the launcher's settings reach it in the job file, not in a command
    expected = set(values) - in_job
    assert carried == expected, f"settings that reached no command: {expected - carried}"
    # The job files, as a real run writes them before its first job (a dry run writes none), from the same settings.
    assert not (workdir / values["results"]).exists()
    monkeypatch.chdir(workdir)
    study(workdir, copy.deepcopy(settings)).write_jobs()
    jobs = [read_job(str(path)) for path in (workdir / values["results"]).glob("*/jobs/*.json")]
    assert jobs and all(job.tpu["lock_dir"] == values["lock_dir"] for job in jobs)
    assert all(job.tpu["code_url"] == values.get("code_url", job.tpu["code_url"]) for job in jobs)
    assert not pwned(workdir)


def test_real_run_of_the_dataset_stages_runs_no_injected_command(workdir, tmp_path):
    """The issue's reproducer, run for real: smoke pool, dataset build, stage and verify, and the receipt."""
    storage = "out/s;touch PWNED;echo"
    results = "res $(touch PWNED2) `touch PWNED3` x"
    dataset = plan_study("smoke", ["exp01a"])[0].dataset
    receipt = stage_receipt(f"{results}/smoke", f"{storage}/smoke", dataset)
    done = snakemake(
        workdir, "--cores", "1", receipt, "--config", f"storage={storage}", f"results={results}", timeout=600
    )
    assert not pwned(workdir, tmp_path), (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    staged = f"{storage}/smoke/datasets/{dataset}"
    assert (workdir / receipt).read_text() == staged + "\n"
    assert (workdir / staged / "MANIFEST.json").is_file()
    assert not pwned(workdir, tmp_path)


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ("s3://bucket/study", "unsupported storage 's3://bucket/study'"),
        ("http://example.com/study", "unsupported storage"),
        ("gs://", "has no bucket name"),
        ("gs://Bad_Bucket/x", "not a valid GCS bucket name"),
        ("-n", "starts with '-'"),
    ],
)
def test_bad_storage_is_refused_by_the_dry_run(workdir, storage, expected):
    done = snakemake(workdir, "-n", "--config", f"storage={storage}")
    output = done.stdout + done.stderr
    assert done.returncode != 0 and re.search(expected, output), output[-3000:]
    assert "--config: " in output  # names where the value was set


def test_tpu_backend_needs_gs_storage(workdir):
    done = snakemake(workdir, "-n", "--profile", "profiles/tpu-v4-64", "--config", "storage=results/storage")
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "the tpu-vm backend needs a gs:// URL" in output, output[-3000:]

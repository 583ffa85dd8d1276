"""`snakemake canary` (trm/study/canary_job.py): `trm canary` on the study's baseline through the training launcher,
on 2 local host processes, with its page on the screen and, on a go, the measured step time where the plan reads
it; a host whose parameters differ from host 0's fails the target with the page's NO-GO line.

One copy of the workflow (its dataset built and staged once) serves both tests; each runs the canary again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from workflow_support import copy_workflow, lighten

from trm.study.canary_job import CANARY

pytestmark = [pytest.mark.workflow, pytest.mark.multihost, pytest.mark.slow]

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
TWO_HOSTS = ["--config", "launch={hosts: 2}"]
# A sitecustomize for the hosts' Python: host 1 (TRM_PROCESS_ID, trm/launch/local.py) digests its parameters to
# another value than host 0's, as a host that computed otherwise would.
DIFFERENT_HOST = textwrap.dedent(
    """
    import importlib.abc, importlib.util, os, sys

    class _OtherDigest(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "trm.run.distributed":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                module.params_digest = lambda params: "f" * 64

            spec.loader.exec_module = exec_module
            return spec

    if os.environ.get("TRM_PROCESS_ID") == "1":
        sys.meta_path.insert(0, _OtherDigest())
    """
)


def snakemake(root: Path, *args: str, env: dict | None = None, timeout: float = 600):
    return subprocess.run(
        [SNAKEMAKE, "--cores", "2", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def page(output: str) -> list[str]:
    """The go / no-go page in a run's output: its verdict line and the 6 lines after it."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("canary on ")]
    assert len(starts) == 1, output[-3000:]
    return lines[starts[0] : starts[0] + 7]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A copy of the workflow whose baseline dataset is staged (the canary's one input), training one float32
    layer (workflow_support.lighten: the canary's checks do not depend on the model's depth or dtype)."""
    root = copy_workflow(tmp_path_factory.mktemp("canary") / "study")
    lighten(root)
    dry = snakemake(root, "-n", CANARY, *TWO_HOSTS)
    assert dry.returncode == 0, dry.stderr[-3000:]
    output = dry.stdout + dry.stderr
    receipt = next(
        line.split("output: ")[1] for line in output.splitlines() if "output: " in line and "/staged/" in line
    )
    staged = snakemake(root, receipt)
    assert staged.returncode == 0, staged.stderr[-3000:]
    return root


def test_the_canary_runs_on_every_host_and_its_go_prices_the_plan(study):
    started = time.time()
    done = snakemake(study, CANARY, "--forcerun", CANARY, *TWO_HOSTS)
    print(f"snakemake canary, 2 hosts: {time.time() - started:.1f} s")
    log = (study / "results/smoke/logs/canary.log").read_text()
    assert done.returncode == 0, done.stderr[-3000:] + log[-3000:]
    lines = page(done.stdout)
    assert lines[0] == "canary on 2 cpu devices (2 hosts): GO"
    assert all(line.startswith("  ok ") for line in lines[1:]), lines
    assert "2 hosts, parameters sha256" in lines[4] and lines[4].endswith("all equal")
    # Both hosts ran it, through the launcher, and reached the same verdict.
    assert "[host 0] canary on 2 cpu devices (2 hosts): GO" in log
    assert "[host 1] canary on 2 cpu devices (2 hosts): GO" in log
    (measured,) = (study / "results/measured").glob("*-2.json")
    assert f"measured step time written to results/measured/{measured.name}" in done.stdout
    assert json.loads(measured.read_text())["devices"] == 2
    # No study job ran: only the canary's dataset and the canary.
    assert not (study / "results/smoke/runs").exists()

    plan = snakemake(study, "-n", "--config", "launch={hosts: 2}", "experiments=[exp01c]")
    output = plan.stdout + plan.stderr
    assert plan.returncode == 0, output[-3000:]
    assert f"training at the step time trm canary measured (results/measured/{measured.name})" in output
    # `all` does not depend on the canary.
    assert "canary: the baseline" not in output
    assert not [line for line in output.splitlines() if line.split()[:1] == [CANARY]]


def test_a_host_whose_parameters_differ_fails_the_target_with_the_no_go_line(study, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(DIFFERENT_HOST)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    done = snakemake(study, CANARY, "--forcerun", CANARY, *TWO_HOSTS, env=env)
    log = (study / "results/smoke/logs/canary.log").read_text()
    assert done.returncode != 0
    lines = page(done.stdout + log[-3000:])
    assert lines[0] == "canary on 2 cpu devices (2 hosts): NO-GO (replicas)"
    assert lines[4].startswith("  FAIL replicas:") and lines[4].endswith("hosts 1 differ from host 0")
    assert not list((study / "results/measured").glob("*.json"))  # a no-go prices nothing
    assert "Error in rule canary" in done.stderr

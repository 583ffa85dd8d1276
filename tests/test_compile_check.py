"""`trm compile-check` without compiling (tests/test_tpu_compile.py compiles): which experiments share a compile,
what it says when a step does not fit or libtpu is missing, and how the plan's chip-hours use compiled figures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workflow_support import TPU_PROFILE, study

from trm.config import experiment_path, load_config
from trm.launch import accelerators
from trm.launch.accelerators import ACCELERATORS, GIB, PACKAGE, STEP_SOURCES, step_hash, step_source_digest
from trm.launch.compile_check import fit_problem, roofline_seconds
from trm.study.estimate import compiled_run_hours, compiled_step_seconds, evaluation_passes, training_steps

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
V4_64 = ACCELERATORS["v4-64"]


def _step(temp_gib: float, flops: float = 1e12, bytes_accessed: float = 1e9) -> dict:
    """Compiled figures of one step as compile_steps records them (1 GiB of arguments, updated in place)."""
    return {
        "argument_bytes": GIB,
        "output_bytes": GIB,
        "alias_bytes": GIB,
        "temp_bytes": int(temp_gib * GIB),
        "code_bytes": 0,
        "flops": flops,
        "bytes_accessed": bytes_accessed,
        "model_flops": flops,
        "collectives": {"all-reduce": 1},
        "compile_seconds": 1.0,
    }


def _figures(config: dict, train: dict, evaluation: dict) -> dict:
    return {
        "accelerator": "v4-64",
        "devices": 32,
        "jax": "",
        "step_config": {},
        "train": train,
        "eval": evaluation,
    }


def test_experiments_share_a_compile_exactly_when_their_steps_are_the_same_program():
    hashes = {
        e: step_hash(load_config(experiment_path(e))) for e in ("exp01c", "exp04a_100", "exp09a", "exp10a")
    }
    # Data size, learning rate, schedules: one program.
    assert len(set(hashes.values())) == 1, hashes
    for other in ("exp01f", "exp06_f", "exp05_a", "exp07a", "exp09e", "exp08a"):  # width, batch, halting, ...
        assert step_hash(load_config(experiment_path(other))) != hashes["exp01c"], other


def test_a_change_to_the_steps_source_is_a_new_compile_and_other_code_is_not(tmp_path):
    package = tmp_path / "trm"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    before = step_source_digest(package)
    assert before == step_source_digest(PACKAGE)  # paths relative to the package: the same wherever installed
    (package / "cli.py").write_text((package / "cli.py").read_text() + "# not part of the step\n")
    assert step_source_digest(package) == before
    digests = {before}
    for name in ("model/layers.py", *STEP_SOURCES[1:]):
        changed = tmp_path / name.replace("/", "_")
        shutil.copytree(package, changed / "trm")
        (changed / "trm" / name).write_text((changed / "trm" / name).read_text() + "# changed\n")
        digests.add(step_source_digest(changed / "trm"))
    assert len(digests) == len(STEP_SOURCES) + 1  # each change a new digest


def test_a_step_that_does_not_fit_names_the_experiment_the_numbers_and_the_micro_batches_to_try():
    config = load_config(experiment_path("exp01c"))
    fits = _figures(config, _step(temp_gib=20), _step(temp_gib=1))
    assert fit_problem("exp01c", config, fits, V4_64) is None
    message = fit_problem("exp01c", config, _figures(config, _step(temp_gib=40), _step(temp_gib=1)), V4_64)
    # 1 GiB of arguments + 40 GiB of temporaries; two parts of 3072 rows: about 21 GiB.
    assert "exp01c" in message and "41.00 GiB" in message and "32.00 GiB" in message, message
    assert "train.micro_batches=2" in message and "train.remat" in message, message


def test_roofline_is_the_slower_of_compute_and_memory_and_plans_a_run_from_it(tmp_path):
    assert roofline_seconds(_step(1, flops=275e12, bytes_accessed=1.2e9), V4_64) == 1.0  # compute-bound
    assert roofline_seconds(_step(1, flops=1e12, bytes_accessed=2.4e12), V4_64) == 2.0  # bandwidth-bound

    config = load_config(experiment_path("exp06_a"))
    figures = _figures(config, _step(1, flops=275e12), _step(1, flops=27.5e12))
    (tmp_path / f"{step_hash(config)}.json").write_text(json.dumps(figures))
    seconds = compiled_step_seconds(config, tmp_path)
    assert seconds == {"train": 1.0, "eval": 0.1}
    assert compiled_step_seconds(load_config(experiment_path("exp06_b")), tmp_path) is None  # not compiled
    hours = compiled_run_hours(config, seconds, 32, 1000, [16, 64])
    batch = config["train"]["global_batch_size"]
    passes = evaluation_passes(config, 1000, [16, 64], 32)
    batch_steps = sum(count * rows / batch * steps for count, rows, steps in passes.values())
    assert passes["final"] == (1, 1024, 64)  # 1000 puzzles: one batch of 32 x 32 rows, to the largest count
    assert hours == {
        "training": training_steps(config) * 1.0 * 32 / 3600,
        "evaluation": batch_steps * 0.1 * 32 / 3600,
    }


def _keep(folder: Path, config: dict, train_seconds: float) -> Path:
    """Figures of `config`'s steps in `folder` as compile-check keeps them: a train step of `train_seconds` on a
    v4-64 (compute-bound), an evaluation step of 0.1 s."""
    path = folder / f"{step_hash(config)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    figures = _figures(config, _step(1, flops=train_seconds * 275e12), _step(1, flops=27.5e12))
    path.write_text(json.dumps(figures))
    return path


def test_the_plan_reads_this_machines_figures_then_the_committed_ones_and_never_stale_ones(
    tmp_path, monkeypatch
):
    configs = {e: load_config(experiment_path(e)) for e in ("exp06_a", "exp06_b", "exp06_c", "exp06_d")}
    local, committed = tmp_path / "results/compile/v4-64", tmp_path / "committed/v4-64"
    mine = _keep(local, configs["exp06_a"], 2.0)
    _keep(committed, configs["exp06_a"], 1.0)  # this machine's compile wins
    theirs = _keep(committed, configs["exp06_b"], 1.0)
    # exp06_c's step compiled from other code (another digest of the step's sources) and exp06_d's at another
    # batch: other hashes, so not found.
    with monkeypatch.context() as other_code:
        other_code.setattr(accelerators, "_installed_step_source_digest", lambda: b"the code before")
        _keep(committed, configs["exp06_c"], 1.0)
    _keep(
        committed,
        {**configs["exp06_d"], "train": {**configs["exp06_d"]["train"], "global_batch_size": 64}},
        1.0,
    )

    settings = {
        "experiments": list(configs),
        "storage": "gs://trm-bucket/s",
        "replicates": {"paper": {"baseline": 1}},
    }
    costs = study(tmp_path, settings, profile=TPU_PROFILE, compiled=committed.parent).costs
    assert costs.compiled == {"exp06_a": str(mine), "exp06_b": str(theirs)}
    subset = yaml.safe_load((REPO / "config/config.yaml").read_text())["test_time_subset"]["paper"]
    for exp_id, train in (("exp06_a", 2.0), ("exp06_b", 1.0)):
        hours = compiled_run_hours(
            configs[exp_id], {"train": train, "eval": 0.1}, 32, 423_168, [16, 32, 64, 128], subset
        )
        assert costs.hours[exp_id] == hours
    assert f"at its compiled steps' roofline times ({theirs}), a best case" in costs.message("exp06_b")
    assert all("at an assumed 40% of peak" in costs.message(e) for e in ("exp06_c", "exp06_d"))
    (figures,) = [line for line in costs.plan_text().splitlines() if line.startswith("  figures:")]
    assert figures.startswith(
        f"  figures:    compiled steps of 1 run from {committed}/, 1 run from {local}/; assumed for exp06_c, "
        f"exp06_d: no figures of their step, for this code and config, in {tmp_path / 'results/compile'}/ or "
        f"{committed.parent}/"
    ), figures

    # The compiled_figures target: the committed folder holds this machine's figures of the selection, no others.
    assert costs.commit_figures([str(mine)]) == [str(committed / mine.name)]
    assert sorted(committed.parent.rglob("*.json")) == [committed / mine.name]
    assert (committed / mine.name).read_text() == mine.read_text()


@pytest.mark.slow
def test_dry_run_uses_compiled_steps_where_they_exist_and_says_which(workdir, tmp_path):
    config = load_config(experiment_path("exp06_a"))
    shutil.rmtree(workdir / "config/compiled")  # the repository's figures: only exp06_b's, below
    _keep(workdir / "results/compile/v4-64", config, 1.0)
    _keep(workdir / "config/compiled/v4-64", load_config(experiment_path("exp06_b")), 1.0)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    done = subprocess.run(
        [
            SNAKEMAKE,
            "--profile",
            "profiles/tpu-v4-64",
            "-n",
            "--config",
            "groups=[exp06]",
            "storage=gs://my-trm-bucket/s",
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    lines = {
        line.split("train ")[1].split(":")[0]: line for line in output.splitlines() if ": train exp06" in line
    }
    assert "compiled steps' roofline times (results/compile/v4-64/" in lines["exp06_a"], lines["exp06_a"]
    assert "compiled steps' roofline times (config/compiled/v4-64/" in lines["exp06_b"], lines["exp06_b"]
    assert all("assumed 40% of peak" in lines[f"exp06_{x}"] for x in "cdef"), lines
    subset = yaml.safe_load((workdir / "config/config.yaml").read_text())["test_time_subset"]["paper"]
    hours = compiled_run_hours(config, {"train": 1.0, "eval": 0.1}, 32, 423_168, [16, 32, 64, 128], subset)
    job = output[output.index("train exp06_a:") :]
    assert f"training:   {hours['training']:.4g} TPU v4 chip-hours" in job.splitlines()[1], job[:500]
    assert f"evaluation: {hours['evaluation']:.4g} TPU v4 chip-hours" in job.splitlines()[2], job[:500]
    assert "2 runs at their compiled steps' roofline times" in output  # the study's line
    assert "7 at an assumed 40% of peak" in output  # exp06_c to f, ref_paper and exp06_c's 2 replicates
    assert "compiled steps of 1 run from config/compiled/v4-64/, 1 run from results/compile/v4-64/" in output


def test_without_libtpu_the_command_says_how_to_install_it():
    # A Python where `import libtpu` finds nothing, as without the tpu extra.
    code = (
        "import sys, importlib.abc\n"
        "class NoLibtpu(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'libtpu':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, NoLibtpu())\n"
        "from trm.cli import main\n"
        "sys.exit(main(['compile-check', 'exp01c', '--accelerator', 'v4-8']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stderr[-2000:]
    assert "needs libtpu" in done.stderr and "pip install -e '.[tpu]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr

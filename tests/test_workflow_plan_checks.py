"""The dry run refuses what the job would refuse later: a batch the job's devices cannot split, a bad storage URL,
an unknown key in any settings file; each message names the file (or --config) that set the value."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from workflow_support import TPU_PROFILE, study

from trm.errors import UserError
from trm.launch.job import read_job
from trm.study.plan import check_batches, plan_study

pytestmark = pytest.mark.workflow

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PROFILE = ["--profile", "profiles/tpu-v4-64"]
BUCKET = "storage=gs://my-trm-bucket/trm-study"


def dry_run(workdir: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run([SNAKEMAKE, "-n", *args], cwd=workdir, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_a_batch_the_profiles_devices_cannot_split_is_refused_by_the_dry_run(workdir):
    code, output = dry_run(workdir, *PROFILE, "--config", BUCKET)
    assert code == 0 and "67 experiments" in output, output[-3000:]  # every experiment fits 32 devices

    experiment = workdir / "config/experiments/exp06_a.yaml"
    experiment.write_text(
        experiment.read_text().replace("global_batch_size: 1536", "global_batch_size: 6145")
    )
    code, output = dry_run(workdir, *PROFILE, "--config", BUCKET)
    assert code != 0
    assert "config/experiments/exp06_a.yaml: train.global_batch_size=6145 must be divisible" in output
    assert "32 devices" in output and "profiles/tpu-v4-64/study.yaml" in output
    # The smoke scale on this machine's one device trains it (6145 / 256 -> 24).
    assert dry_run(workdir, "--config", "experiments=[exp06_a]")[0] == 0


def test_check_batches_applies_the_trainers_rule():
    from trm.train.step import check_train_config  # both apply trm.config.batch_split_problem

    exp = plan_study("smoke", ["exp01a"])[0]
    for batch, parts, devices in itertools.product((24, 32, 6145, 6144), (1, 2, 3), (1, 4, 32)):
        train = {**exp.config["train"], "global_batch_size": batch, "micro_batches": parts}
        planned = type(exp)(**{**exp.__dict__, "config": {**exp.config, "train": train}})
        try:
            check_train_config(train, devices)
            trainer_accepts = True
        except UserError:
            trainer_accepts = False
        try:
            check_batches([planned], devices, "test")
            plan_accepts = True
        except UserError:
            plan_accepts = False
        assert plan_accepts == trainer_accepts, (batch, parts, devices)


def test_unknown_keys_name_the_file_that_holds_them(workdir):
    (workdir / "extra.yaml").write_text("launch:\n  tpu:\n    slicez: [a]\n")
    code, output = dry_run(workdir, "--configfile", "extra.yaml")
    assert code != 0 and "extra.yaml: unknown key 'launch.tpu.slicez'; allowed keys: slices" in output

    study = workdir / "profiles/tpu-v4-64/study.yaml"
    study.write_text(study.read_text() + "provision_timeout: 60\n")
    code, output = dry_run(workdir, *PROFILE, "--config", BUCKET)
    assert code != 0 and "profiles/tpu-v4-64/study.yaml: unknown key 'provision_timeout'" in output

    code, output = dry_run(workdir, "--config", "scael=smoke")
    assert code != 0 and "--config: unknown key 'scael'" in output

    settings = workdir / "config/config.yaml"
    settings.write_text(settings.read_text() + "resutls: out\n")
    code, output = dry_run(workdir)
    assert code != 0 and "config/config.yaml: unknown key 'resutls'" in output


def test_bad_storage_names_where_it_was_set(workdir):
    code, output = dry_run(workdir, "--config", "storage=s3://bucket/study")
    assert code != 0 and "--config: unsupported storage 's3://bucket/study'" in output


def test_a_placeholder_bucket_warns_in_a_dry_run_and_stops_a_run_that_reaches_storage(workdir):
    placeholder = (
        "profiles/tpu-v4-64/study.yaml: storage 'gs://YOUR-BUCKET/trm-study': YOUR-BUCKET is a placeholder"
    )
    # The dry run reaches no storage: it prints the plan, and the placeholder on a line of its own.
    code, output = dry_run(workdir, *PROFILE)
    assert code == 0 and "67 experiments" in output and "  price:      $" in output, output[-3000:]
    (warning,) = [line for line in output.splitlines() if "is a placeholder" in line]
    assert warning.startswith(f"warning: {placeholder}") and warning.endswith("(needed before a real run)")

    # A real run refuses before its first job (the smoke pool and datasets are built on this machine first)...
    done = run(workdir, "--config", "scale=smoke", "storage=gs://YOUR-BUCKET/s", "experiments=[exp01a]")
    output = done.stdout + done.stderr
    assert (
        done.returncode != 0
        and "--config: storage 'gs://YOUR-BUCKET/s': YOUR-BUCKET is a placeholder" in output
    )
    assert not (workdir / "results/smoke/pool").exists() and not (workdir / "results/smoke/datasets").exists()
    # ...but a job that reaches neither storage nor a slice runs, and a TPU study skips the preflight for it
    # (this machine has no gcloud: the preflight would fail).
    done = run(
        workdir, *PROFILE, "results/smoke/pool/train.csv", "--config", "scale=smoke", "experiments=[exp01a]"
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (
        "preflight" not in done.stdout + done.stderr and (workdir / "results/smoke/pool/test.csv").is_file()
    )


def run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """A real run on one core, with no gcloud on the PATH (only the venv's commands) and a HOME of its own."""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "HOME": str(workdir)}
    return subprocess.run(
        [SNAKEMAKE, "--cores", "1", *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )


def test_nested_settings_from_the_command_line_are_typed_and_errors_are_one_line(workdir):
    # Snakemake reads the values of a --config mapping as strings; the workflow converts them to the schema's types.
    code, output = dry_run(
        workdir, "--config", "launch={hosts: 2, devices_per_host: 2}", "experiments=exp01a,exp01b"
    )
    assert code == 0, output[-3000:]
    assert "2 experiments" in output and "h of jobs on 4 devices each" in output

    for setting, message in [
        ("launch={hosts: two}", "--config: setting 'launch.hosts' = 'two' is not valid: expected an integer"),
        (
            "launch={backend: tpu}",
            "setting 'launch.backend' = 'tpu' is not valid: expected one of local, tpu-vm",
        ),
        ("experiments=[Exp01]", "setting 'experiments[0]' = 'Exp01' is not valid: expected a name matching"),
        (
            "launch={tpu: {poll_seconds: 0}}",
            "'launch.tpu.poll_seconds' = 0 is not valid: expected more than 0",
        ),
    ]:
        code, output = dry_run(workdir, "--config", setting)
        assert code != 0 and message in output, (setting, output[-2000:])
        assert "Failed validating" not in output and "Traceback" not in output  # no schema dump, no traceback


def test_a_results_folder_that_cannot_be_written_is_one_line(workdir):
    """The job files are written before the first job (never by a dry run): a results folder that refuses them
    (read-only, full, or a file in the way, as here: root may write anywhere) stops the run in one line."""
    (workdir / "results/smoke").mkdir(parents=True)
    (workdir / "results/smoke/jobs").write_text("")
    code, output = dry_run(workdir, "--config", "experiments=[exp01a]")
    assert code == 0, output[-3000:]
    done = subprocess.run(
        [SNAKEMAKE, "--cores", "1", "--config", "experiments=[exp01a]", "--", "results/smoke/pool/train.csv"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    code, output = done.returncode, done.stdout + done.stderr
    assert code != 0 and not (workdir / "results/smoke/pool").exists()
    path = f"results/smoke/jobs/{plan_study('smoke', ['exp01a'])[0].hash}.json"
    assert (
        f"cannot write {workdir / path}: {workdir / 'results/smoke/jobs'} is a file, not a folder" in output
    )
    assert "trm/storage.py" not in output and "UserError" not in output, output[-3000:]  # no frames of ours


def test_an_experiment_file_no_group_lists_stops_only_its_own_run(workdir):
    (workdir / "config/experiments/exp99_new.yaml").write_text("{}\n")
    code, output = dry_run(workdir, "--config", "experiments=[exp01a]")
    assert code == 0, output[-3000:]
    assert "config/experiments/exp99_new.yaml belongs to no group of config/groups.yaml" in output
    code, output = dry_run(workdir, "--config", "experiments=[exp99_new]")
    assert code != 0 and "add it to a group's members there to run it" in output


def test_commands_read_the_config_of_the_checkout_they_run_in(workdir, tmp_path):
    """Two checkouts sharing one environment: each reads its own config/ (the workdir is a second checkout)."""
    base = workdir / "config/base.yaml"
    base.write_text(base.read_text().replace("hidden_size: 512", "hidden_size: 640", 1))
    trm = [str(Path(sys.executable).with_name("trm")), "config", "exp01c"]
    here = subprocess.run(trm, cwd=workdir / "config", capture_output=True, text=True, timeout=60)
    assert here.returncode == 0 and '"hidden_size": 640' in here.stdout, here.stderr
    assert f"reading config/ and docs/ of {workdir.resolve()}" in here.stderr  # says which checkout
    elsewhere = subprocess.run(trm, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert elsewhere.returncode == 0 and '"hidden_size": 512' in elsewhere.stdout  # the installed checkout's
    assert "note:" not in elsewhere.stderr


def test_an_experiment_can_run_on_its_own_accelerator_and_pool(workdir, tmp_path):
    """profiles/tpu-v4-64 runs the paper-recipe reference (batch 768) on a v4-8: its own shape, pool and hours."""
    code, output = dry_run(workdir, *PROFILE, "-p", "--config", BUCKET, "experiments=[exp01c,ref_paper]")
    assert code == 0, output[-3000:]
    lines = output.splitlines()
    jobs = {line.split("train ")[1].split(":")[0]: n for n, line in enumerate(lines) if ": train " in line}
    assert (
        "on the job's 4 devices" in lines[jobs["ref_paper"]]
        and "on the job's 32 devices" in lines[jobs["exp01c"]]
        and "on the job's 32 devices" in lines[jobs["exp01c~s2"]]  # a replicate: its experiment's shape
    )
    hours = {exp: float(lines[n + 1].split("training:")[1].split()[0]) for exp, n in jobs.items()}
    assert hours["ref_paper"] == pytest.approx(hours["exp01c"], rel=0.01)  # same FLOPs, 8x the wall time
    wall = {exp: float(lines[n + 1].split("(")[1].split(" h")[0]) for exp, n in jobs.items()}
    assert wall["ref_paper"] == pytest.approx(8 * wall["exp01c"], rel=0.01)
    # Each job file carries its experiment's shape and pool; the train commands only name them.
    launches = [line for line in lines if " launch --job " in line]
    assert len(launches) == 4 and "--tpu" not in "".join(launches)  # exp01c with its 2 replicates, ref_paper
    # The job files themselves, as a real run writes them before its first job (a dry run writes none).
    settings = {"storage": BUCKET.split("=")[1], "experiments": ["exp01c", "ref_paper"]}
    planned = study(tmp_path, settings, profile=TPU_PROFILE)
    planned.write_jobs()
    jobs = {
        job.run.config["train"]["global_batch_size"]: job
        for job in (read_job(planned.job_file(e)) for e in planned.distinct_runs())
    }
    assert (jobs[768].hosts, jobs[768].devices_per_host, jobs[768].tpu["slices"]) == (1, 4, ["trm-v4-8"])
    assert jobs[768].tpu["accelerator_type"] == "v4-8" and jobs[768].backend == "tpu-vm"
    assert (jobs[6144].hosts, jobs[6144].devices_per_host, jobs[6144].tpu["slices"]) == (8, 4, ["trm-v4-64"])

    five = "launch={per_experiment: {ref_paper: {devices_per_host: 5}}}"
    code, output = dry_run(workdir, *PROFILE, "--config", BUCKET, "experiments=[ref_paper]", five)
    assert code != 0 and "train.global_batch_size=768 must be divisible" in output and "5 devices" in output
    code, output = dry_run(workdir, "--config", "launch={per_experiment: {ref_papr: {hosts: 2}}}")
    assert code != 0 and "launch.per_experiment: no experiment ref_papr" in output

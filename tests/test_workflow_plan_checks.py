"""The dry run refuses what the job would refuse later: a batch the job's devices cannot split, a bad storage URL,
an unknown key in any settings file; each message names the file (or --config) that set the value."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

from trm.errors import UserError
from trm.study.plan import check_batches, plan_study, plan_study_cached

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
    code, output = dry_run(workdir, *PROFILE)
    assert code != 0
    assert (
        "profiles/tpu-v4-64/study.yaml: storage 'gs://YOUR-BUCKET/trm-study': YOUR-BUCKET is a placeholder"
        in output
    )
    code, output = dry_run(workdir, "--config", "storage=s3://bucket/study")
    assert code != 0 and "--config: unsupported storage 's3://bucket/study'" in output


def test_the_cached_plan_is_the_plan_and_follows_an_edited_experiment(workdir, tmp_path):
    experiments, groups = workdir / "config/experiments", workdir / "config/groups.yaml"
    cache = tmp_path / "plan.json"
    where = {"experiments_dir": experiments, "groups_path": groups}
    fresh = plan_study("smoke", ["exp06_a", "exp06_c"], **where)
    assert (
        plan_study_cached(cache, "smoke", ["exp06_a", "exp06_c"], **where) == fresh
    )  # computed, then stored
    assert plan_study_cached(cache, "smoke", ["exp06_a", "exp06_c"], **where) == fresh  # read back
    edited = experiments / "exp06_a.yaml"
    edited.write_text(edited.read_text().replace("global_batch_size: 1536", "global_batch_size: 3072"))
    replanned = plan_study_cached(cache, "smoke", ["exp06_a", "exp06_c"], **where)
    assert replanned == plan_study("smoke", ["exp06_a", "exp06_c"], **where)
    assert replanned[0].hash != fresh[0].hash and replanned[1] == fresh[1]
    assert plan_study_cached(cache, "smoke", ["exp06_c"], **where) == fresh[1:]  # another selection

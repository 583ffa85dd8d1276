"""Job files (trm/launch/job.py) and `trm launch --job`: what a bad job file says, what may follow `--`, a batch the
job's devices cannot split, the hash the job carries checked against the run dir's config by the trainer, the same
job built by hand (`trm launch` without --job); and `trm status` taking its stale limit from the profile in use."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trm import storage
from trm.cli import main as trm
from trm.config import config_hash, dump_config, load_config
from trm.errors import UserError
from trm.launch import tpu_options
from trm.launch.job import Job, read_job
from trm.run import layout
from trm.run import state as runstate
from trm.run.spec import Run

REPO = Path(__file__).resolve().parents[1]
TINY = ["arch.hidden_size=32", "arch.num_heads=2", "train.global_batch_size=8"]


def _job(tmp_path: Path, run_dir: Path, **changes) -> Job:
    config = load_config(REPO / "config/base.yaml", TINY)
    run = Run(config, changes.pop("digest", config_hash(config)), str(tmp_path / "no-dataset"), str(run_dir))
    fields = {"test_time_steps": (16, 32), "backend": "local", "hosts": 1, "devices_per_host": 1}
    tpu = {**tpu_options.defaults(), "code_url": "gs://bucket/code"}
    return Job(run, **{**fields, **changes, "tpu": tpu})


def test_a_job_that_samples_carries_its_trajectories_and_noise_and_one_that_does_not_is_as_before(tmp_path):
    plain, path = _job(tmp_path, tmp_path / "run"), str(tmp_path / "job.json")
    assert "test_time_trajectories" not in plain.to_json()  # its file and digest as before the setting
    job = _job(tmp_path, tmp_path / "run", test_time_trajectories=(1, 4), test_time_noise=0.3)
    job.write(path)
    assert read_job(path) == job
    assert job.host_arguments()[-4:] == ["--test-time-trajectories", "1,4", "--test-time-noise", "0.3"]
    record = json.loads(Path(path).read_text())
    for key, value, says in (
        ("test_time_trajectories", [0], "test_time_trajectories [0]: expected a list of positive integers"),
        ("test_time_noise", -1, "test_time_noise -1: expected a number >= 0"),
    ):
        Path(path).write_text(json.dumps({**record, key: value}))
        with pytest.raises(UserError, match=re.escape(says)):
            read_job(path)


def test_a_job_file_reads_back_as_written_and_a_bad_one_is_one_line_naming_it(tmp_path):
    job, path = _job(tmp_path, tmp_path / "run"), str(tmp_path / "job.json")
    job.write(path)
    assert read_job(path) == job
    assert job.host_arguments() == [
        "--config",
        str(tmp_path / "run/config.json"),
        "--config-hash",
        job.run.config_hash,
        "--data",
        str(tmp_path / "no-dataset"),
        "--run-dir",
        str(tmp_path / "run"),
        "--test-time-steps",
        "16,32",
    ]
    subset = _job(tmp_path, tmp_path / "run", test_time_subset=7)
    assert subset.host_arguments()[-2:] == ["--test-time-subset", "7"]
    subset.write(path)
    assert read_job(path) == subset
    job.write(path)
    record = json.loads(Path(path).read_text())
    bad = {
        "missing": (None, "job file not found"),
        "text": ("{", "not valid JSON"),
        "keys": (json.dumps({k: v for k, v in record.items() if k != "tpu"}), "a job file has the keys"),
        "hosts": (json.dumps({**record, "hosts": "2"}), "hosts '2' is not an integer"),
        "zero": (json.dumps({**record, "devices_per_host": 0}), "devices_per_host 0: must be >= 1"),
        "platform": (json.dumps({**record, "platform": "tpu"}), "platform 'tpu': one of cpu, gpu, auto"),
        "steps": (json.dumps({**record, "test_time_steps": [16, -1]}), "test_time_steps [16, -1]"),
        "config": (json.dumps({**record, "config": {**record["config"], "arhc": {}}}), "config"),
    }
    for name, (text, expected) in bad.items():
        where = tmp_path / f"{name}.json"
        if text is not None:
            where.write_text(text)
        with pytest.raises(UserError) as info:
            read_job(str(where))
        assert str(info.value).startswith(str(where)) and expected in str(info.value), info.value


def test_a_canary_job_file_runs_trm_canary_on_its_folder_and_a_training_job_file_has_no_kind(tmp_path):
    path = str(tmp_path / "job.json")
    _job(tmp_path, tmp_path / "run").write(path)
    assert "kind" not in json.loads(Path(path).read_text())  # the files of existing studies stay as they were
    canary = _job(tmp_path, tmp_path / "canary", test_time_steps=(), kind="canary")
    canary.write(path)
    record = json.loads(Path(path).read_text())
    assert record["kind"] == "canary" and read_job(path) == canary and canary.host_command == "canary"
    assert canary.host_arguments() == [
        "--config",
        str(tmp_path / "canary/config.json"),
        "--data",
        str(tmp_path / "no-dataset"),
        "--out",
        str(tmp_path / "canary"),
    ]
    bad = {
        "kind": ({**record, "kind": "evaluate"}, "kind 'evaluate': one of train, canary"),
        "steps": ({**record, "test_time_steps": [16]}, "a canary job evaluates nothing"),
    }
    for name, (content, expected) in bad.items():
        where = tmp_path / f"{name}.json"
        where.write_text(json.dumps(content))
        with pytest.raises(UserError, match=expected):
            read_job(str(where))


def test_launch_takes_only_trainer_options_after_a_job_and_refuses_a_batch_its_devices_cannot_split(
    tmp_path, capsys
):
    path = str(tmp_path / "job.json")
    _job(tmp_path, tmp_path / "run").write(path)
    assert trm(["launch", "--job", path, "--", "--set=train.epochs=2"]) == 2
    assert (
        f"--set=train.epochs=2: the job file {path} gives the run; after -- only" in capsys.readouterr().err
    )
    assert trm(["launch", "--job", path, "--set=train.epochs=2", "--data", "d"]) == 2
    assert f"--set, --data: the job file {path} gives the run" in capsys.readouterr().err
    assert trm(["launch", "--job", path, "--hosts", "2"]) == 2
    assert f"--hosts: the job file {path} gives the job's shape" in capsys.readouterr().err
    assert trm(["launch", "--job", path, "--platform", "gpu", "--devices-per-host", "2"]) == 2
    assert f"--devices-per-host, --platform: the job file {path} gives" in capsys.readouterr().err
    assert trm(["launch", "--job", path, "--", "--process-id", "1"]) == 2
    assert "--process-id: the launcher sets the multi-host options itself" in capsys.readouterr().err
    _job(tmp_path, tmp_path / "run", hosts=3).write(path)
    assert trm(["launch", "--job", path]) == 2
    assert "train.global_batch_size=8 must be divisible by" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before the run dir is written
    _job(tmp_path, "gs://bucket/runs/x", backend="tpu-vm").write(path)
    assert trm(["launch", "--job", path]) == 2
    err = capsys.readouterr().err
    assert "the job's data" in err and "the tpu-vm backend needs a gs:// URL" in err


def test_the_trainer_checks_the_carried_hash_against_the_run_dirs_config(tmp_path, capsys):
    """The launcher writes the job's config to the run dir; the hosts train that copy with the job's hash, so a
    job whose hash is not its config's fails at once, naming both, and trains nothing."""
    run_dir, path = tmp_path / "run", str(tmp_path / "job.json")
    job = _job(tmp_path, run_dir, digest="0123456789ab")
    job.write(path)
    assert trm(["launch", "--job", path]) != 0
    output = capsys.readouterr().out
    assert (run_dir / "config.json").read_text() == dump_config(job.run.config)
    assert f"holds config {config_hash(job.run.config)}, not this run's 0123456789ab" in output, output[
        -3000:
    ]
    assert not (run_dir / layout.CHECKPOINTS).exists()


def test_status_takes_the_stale_limit_of_the_profile_in_use(tmp_path, capsys):
    run_dir = str(tmp_path / "paper/runs/abc")
    runstate.write_status(run_dir, {"state": "running", "config_hash": "abc", "step": 1})
    url = storage.join(run_dir, layout.STATUS)
    status = json.loads(storage.read_text(url))
    storage.write_text(url, json.dumps({**status, "updated_at": status["updated_at"] - 700}))

    def state(*args: str) -> str:
        assert trm(["status", "--storage", str(tmp_path), "--json", *args]) == 0
        return json.loads(capsys.readouterr().out)["state"]

    assert state() == "lost"  # config/config.yaml: 600 s
    assert state("--profile", "tpu-v4-64") == "running"  # its study file: 900 s
    assert state("--profile", "tpu-v4-64", "--stale-after", "60") == "lost"


def test_by_hand_the_launcher_builds_the_job_a_job_file_would_hold(tmp_path, capsys):
    """`trm launch` without --job parses the run's arguments once and resolves its config once, into the job a job
    file would hold (written, it reads back equal); a bad one is refused before the run dir is written."""
    from trm.cli import _build_parser
    from trm.launch.launch_command import _job_by_hand

    config = load_config(REPO / "config/base.yaml", TINY)
    run = ["--config", str(REPO / "config/base.yaml"), *(f"--set={change}" for change in TINY)]
    run += ["--data", str(tmp_path / "no-dataset"), "--run-dir", str(tmp_path / "run-{config_hash}")]
    args = _build_parser("launch").parse_args(
        ["launch", "--hosts", "2", *run, "--test-time-steps", "32,16", "--test-time-subset", "4", "--", "-x"]
    )
    job = _job_by_hand(args)
    digest = config_hash(config)
    assert job.run == Run(config, digest, str(tmp_path / "no-dataset"), str(tmp_path / f"run-{digest}"))
    assert (job.test_time_steps, job.test_time_subset) == ((16, 32), 4)
    assert (job.backend, job.hosts, job.devices_per_host, job.platform) == ("local", 2, 1, "cpu")
    assert job.tpu == tpu_options.launcher_settings(tpu_options.defaults())
    job.write(str(tmp_path / "job.json"))
    assert read_job(str(tmp_path / "job.json")) == job
    assert args.train_args == ["--", "-x"]  # the trainer's other options, passed to every host as they are
    assert trm(["launch", *run, "--test-time-subset", "0"]) == 2
    assert "trm launch: error: argument --test-time-subset: expected an integer >= 1, got '0'" in (
        capsys.readouterr().err
    )
    assert not list(tmp_path.glob("run-*"))

"""`trm status` and the run-state markers: every state read from what a trainer or launcher wrote, on local
storage and on the GCS emulator; a stale heartbeat shows as lost; the trainer marks a failure."""

from __future__ import annotations

import json
import time

import pytest

from trm import storage
from trm.cli import main as trm
from trm.run import layout
from trm.run import state as runstate
from trm.study.plan import plan_study
from trm.study.status import collect, eta_seconds


def _progress(step: int, **extra) -> dict:
    return {
        "config_hash": "abc",
        "step": step,
        "total_steps": 1000,
        "epoch": step // 10,
        "total_epochs": 100,
        "global_batch_size": 64,
        "examples_per_s": 128.0,  # 2 steps/s
        "eval_exact_accuracy": 0.25,
        "elapsed_s": 120.0,
        "slice": "trm-v4-64-a",
        **extra,
    }


def _age_heartbeat(run_dir: str, seconds: float) -> None:
    """Make the trainer's last heartbeat `seconds` old, as if its hosts had died then."""
    url = storage.join(run_dir, layout.STATUS)
    status = json.loads(storage.read_text(url))
    status["updated_at"] -= seconds
    storage.write_text(url, json.dumps(status))


def _runs_in_every_state(root: str) -> dict[str, str]:
    """A storage root with one run per state; returns run name -> expected state."""
    runs = storage.join(root, "runs")
    runstate.write_status(storage.join(runs, "running"), {"state": "running", **_progress(400)})
    runstate.write_status(storage.join(runs, "lost"), {"state": "running", **_progress(300)})
    _age_heartbeat(storage.join(runs, "lost"), 3600)
    runstate.write_status(storage.join(runs, "preempted"), {"state": "preempted", **_progress(500)})
    runstate.write_status(storage.join(runs, "failed"), {"state": "failed", "error": "boom", **_progress(7)})
    runstate.write_status(storage.join(runs, "finished"), {"state": "finished", **_progress(1000)})
    storage.write_text(storage.join(runs, "finished", layout.SUCCESS), "")
    runstate.write_launch(storage.join(runs, "queued"), "queued", None, 1, "waiting for a v4-64 slice")
    # A preempted trainer whose launcher then waits for a new slice: the newer launcher marker speaks.
    runstate.write_status(storage.join(runs, "requeued"), {"state": "preempted", **_progress(600)})
    time.sleep(0.01)
    runstate.write_launch(storage.join(runs, "requeued"), "queued", "trm-v4-64-b", 2, "slice preempted")
    runstate.write_status(storage.join(runs, "cancelled"), {"state": "running", **_progress(20)})
    time.sleep(0.01)
    runstate.write_launch(storage.join(runs, "cancelled"), "cancelled", "trm-v4-64-a", 1, "job cancelled")
    return {
        "running": "running",
        "lost": "lost",
        "preempted": "preempted",
        "failed": "failed",
        "finished": "finished",
        "queued": "queued",
        "requeued": "queued",
        "cancelled": "cancelled",
    }


def test_status_reads_every_state_from_the_markers(storage_root, capsys):
    expected = _runs_in_every_state(storage_root)
    states = {name: run.state for name, run in collect(storage_root, stale_after_s=600)}
    assert states == expected

    assert trm(["status", "--storage", storage_root]) == 0
    table = capsys.readouterr().out
    lines = {line.split()[0]: line for line in table.splitlines() if line.split()[:1] != []}
    assert lines["lost"].split()[1] == "lost" and "no heartbeat for" in lines["lost"]
    assert lines["running"].split()[1:3] == ["running", "400/1000"]
    assert "0.2500" in lines["running"] and "trm-v4-64-a" in lines["running"]
    assert "5m00s" in lines["running"]  # ETA: 600 steps left at 2 steps/s
    assert "boom" in lines["failed"]
    assert "waiting for a v4-64 slice" in lines["queued"]
    assert "trm-v4-64-b" in lines["requeued"]  # the relaunch's slice, not the preempted one
    assert "8 runs under" in table
    assert "why a run stopped: RUN_DIR/logs/host-<i>.log (every attempt, latest last)" in table

    assert trm(["status", "--storage", storage_root, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["experiment"]: r["state"] for r in records} == expected


def test_a_heartbeat_is_lost_only_past_the_stale_limit(tmp_path):
    run = str(tmp_path / "run")
    runstate.write_status(run, {"state": "running", **_progress(10)})
    _age_heartbeat(run, 120)
    assert runstate.read_run(run, stale_after_s=600).state == "running"
    assert runstate.read_run(run, stale_after_s=60).state == "lost"
    assert eta_seconds(runstate.read_run(run)) == pytest.approx(495)


def test_runs_are_named_by_the_experiments_sharing_their_config(tmp_path, capsys):
    plan = plan_study("smoke", ["exp01a", "exp01c", "exp02a_03"])
    by_id = {exp.id: exp for exp in plan}
    assert by_id["exp01c"].hash == by_id["exp02a_03"].hash  # both are the baseline
    root = tmp_path / "storage"
    for exp_id in ("exp01a", "exp01c"):
        run_dir = str(root / "smoke" / "runs" / by_id[exp_id].hash)
        runstate.write_status(run_dir, {"state": "running", **_progress(1, config_hash=by_id[exp_id].hash)})
    names = [name for name, _ in collect(str(root), stale_after_s=600)]
    assert "exp01a" in names
    assert any(name.startswith("exp01c (+") and name.endswith("same config)") for name in names)


def test_bad_arguments_and_empty_storage(tmp_path, capsys):
    assert trm(["status", "--storage", str(tmp_path)]) == 0
    assert f"no runs under {tmp_path} yet" in capsys.readouterr().out
    # A typo is not an empty study.
    assert trm(["status", "--storage", str(tmp_path / "nothing")]) == 2
    assert "nothing: no such folder" in capsys.readouterr().err
    # A damaged status.json is not a missing one.
    run = tmp_path / "smoke" / "runs" / "abc"
    run.mkdir(parents=True)
    (run / "status.json").write_text('{"state": "runn')
    assert trm(["status", "--storage", str(tmp_path)]) == 0
    assert (
        "status.json is not a JSON object: half-written by a dying host, or damaged"
        in capsys.readouterr().out
    )
    assert trm(["status", "--storage", str(tmp_path), "--stale-after", "0"]) == 2
    assert "argument --stale-after: expected a number > 0, got '0'" in capsys.readouterr().err
    assert trm(["status", "--storage", "ftp://x/y"]) == 2
    assert "unsupported --storage 'ftp://x/y'" in capsys.readouterr().err


def test_a_half_written_marker_is_not_read_as_a_state(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / layout.STATUS).write_text('{"state": "runn')
    assert runstate.read_run(str(run)).state == "unknown"


# ------------------------------------------------------------------------------ from an experiment id to its run


def test_an_experiment_id_leads_to_its_run_dir_at_the_study_scale(tmp_path, capsys):
    """`trm config --scale S --hash` prints the hash of the run dir the plan gives the experiment at S, and
    `trm status --experiment` finds that run dir from the study settings (or a profile's)."""
    smoke, paper = (plan_study(scale, ["exp01a"])[0] for scale in ("smoke", "paper"))
    assert smoke.hash != paper.hash
    for scale, exp in (("smoke", smoke), ("paper", paper)):
        assert trm(["config", "exp01a", "--scale", scale, "--hash"]) == 0
        assert capsys.readouterr().out == exp.hash + "\n"
    assert trm(["config", "exp01a", "--hash"]) == 0
    assert capsys.readouterr().out == paper.hash + "\n"  # as written: the paper scale

    root = tmp_path / "storage"
    run_dir = root / "smoke" / "runs" / smoke.hash
    assert trm(["status", "--storage", str(root), "--experiment", "exp01a"]) == 0
    assert capsys.readouterr().out == f"exp01a: not started (no run dir at {run_dir})\n"
    runstate.write_status(str(run_dir), {"state": "running", **_progress(400, config_hash=smoke.hash)})
    assert trm(["status", "--storage", str(root), "--experiment", "exp01a"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("exp01a"))
    assert row.split()[1:3] == ["running", "400/1000"] and out.endswith(f"run dir: {run_dir}\n")

    # A profile's study file gives storage and scale, as `snakemake --profile` reads them.
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "config.yaml").write_text("cores: 1\nconfigfile: study.yaml\n")
    (profile / "study.yaml").write_text(f"scale: paper\nstorage: {root}\nlaunch:\n  hosts: 8\n")
    assert trm(["status", "--profile", str(profile), "--experiment", "exp01a", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {
        "experiment": "exp01a",
        "run_dir": str(root / "paper" / "runs" / paper.hash),
        "state": "not started",
    }
    assert trm(["status", "--profile", str(profile), "--experiment", "exp01a", "--scale", "smoke"]) == 0
    assert f"run dir: {run_dir}" in capsys.readouterr().out


def test_experiment_status_and_scale_refuse_bad_input(tmp_path, capsys):
    assert trm(["status", "--storage", str(tmp_path), "--experiment", "exp01z"]) == 2
    assert "unknown experiment 'exp01z'" in capsys.readouterr().err
    assert trm(["status", "--storage", str(tmp_path), "--scale", "paper"]) == 2
    assert "--scale paper: goes with --experiment" in capsys.readouterr().err
    assert trm(["status", "--profile", str(tmp_path / "none"), "--experiment", "exp01a"]) == 2
    assert "no profile folder with a config.yaml" in capsys.readouterr().err
    assert trm(["config", "exp01a", "--resolved", "--scale", "smoke"]) == 2
    assert "a resolved config is already at its scale" in capsys.readouterr().err


def test_a_runs_elapsed_time_adds_up_every_attempt_from_its_commands_start(tmp_path):
    """status.json's elapsed_s (final.json's wall_time_s, the run's cost) counts each attempt from its command's
    start, and a resumed attempt adds to what the earlier ones recorded, a killed one up to its last write."""
    run_dir = str(tmp_path / "run")
    first = runstate.TrainerStatus(run_dir, writer=True, attempt_start=time.time() - 10.0)
    first.write("running", step=10)  # then killed: its last write says 10 s
    second = runstate.TrainerStatus(run_dir, writer=True, attempt_start=time.time() - 5.0)
    assert second.elapsed() == pytest.approx(15.0, abs=1.0)
    second.write("finished", step=20)
    status = runstate.read_run(run_dir).status
    assert status["attempt"] == 2 and status["elapsed_s"] == pytest.approx(15.0, abs=1.0)
    assert (
        runstate.TrainerStatus(run_dir, writer=False).elapsed() < 1.0
    )  # another host knows no earlier attempt

"""End-to-end tests of `trm train`: outputs, exact resume after kill and preemption, learning, schedules."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tiny_run import TINY, TRAINED, build_dataset, easy_csv, set_flags, stage, tiny_config

from trm.cli import main as trm
from trm.config import BASE_CONFIG
from trm.data.board import Board
from trm.data.format import read_metadata
from trm.run.state import read_run

pytestmark = pytest.mark.slow


def _train_cmd(data: str, run_dir: Path, cache: Path, extra: dict) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trm.cli",
        "train",
        "--config",
        str(BASE_CONFIG),
        "--data",
        data,
        "--run-dir",
        str(run_dir),
        "--cache-dir",
        str(cache),
        "--log-every",
        "7",  # checkpoints come every 10 steps: a resumed run starts in the middle of a logging window
        *set_flags({**TINY, **extra}),
    ]


REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def _final(run_dir: Path) -> dict:
    return json.loads((run_dir / "final.json").read_text())


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _latest_checkpoint(run_dir: Path) -> int:
    steps = [int(p.name) for p in (run_dir / "ckpt").glob("*") if p.name.isdigit()]
    return max(steps, default=-1)


# 48 train groups x 10 epochs / 8 = 60 steps per evaluation interval, 120 steps in all.
RESUME = {"train.epochs": 20, "train.eval_interval": 10, "train.checkpoint_every_steps": 10}


def test_kill_and_preemption_resume_exactly(easy_data, tmp_path):
    reference = tmp_path / "reference"
    done = _run(_train_cmd(easy_data, reference, tmp_path / "cache", RESUME))
    assert done.returncode == 0, done.stderr[-3000:]
    records = _records(reference)
    assert (reference / "_SUCCESS").exists()
    assert [r["step"] for r in records if r["kind"] == "train"] == [*range(7, 121, 7), 120]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [(e["step"], e["subset"]) for e in evals] == [(60, 8), (120, None)]
    assert evals[-1]["count"] == 12  # the whole test split (20% of 60 puzzles)
    assert _final(reference)["compilations"] == 1  # no recompilation after the first step
    # final.json keeps the final evaluation and the best one (the final on a tie), with where it was taken.
    assert _final(reference)["test"] == {k: v for k, v in evals[-1].items() if k not in ("kind", "split", "subset", "step", "epoch")}  # fmt: skip
    best = max(reversed(evals), key=lambda e: e["exact_accuracy"])
    assert _final(reference)["best_test"] == {k: v for k, v in best.items() if k not in ("kind", "split")}

    # Kill -9 at some moment after the first checkpoint, then SIGTERM (preemption) the resumed run.
    run = tmp_path / "interrupted"
    cmd = _train_cmd(easy_data, run, tmp_path / "cache", RESUME)
    # status.json after each stop: a killed trainer leaves "running" (lost once its heartbeat is stale), a
    # preempted one says so. Its elapsed time adds up the attempts.
    elapsed = [0.0]
    for sig, expected_rc, trainer_state in (
        (signal.SIGKILL, -signal.SIGKILL, "running"),
        (signal.SIGTERM, 42, "preempted"),
    ):
        before = _latest_checkpoint(run) if (run / "ckpt").exists() else -1
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 240
            while not (run / "ckpt").exists() or _latest_checkpoint(run) <= before:
                assert proc.poll() is None, proc.stderr.read()[-3000:]
                assert time.time() < deadline
                time.sleep(0.02)
            proc.send_signal(sig)
            proc.wait(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == expected_rc, proc.stderr.read()[-3000:]
        assert not (run / "_SUCCESS").exists()
        assert 0 < _latest_checkpoint(run) < 120
        state = read_run(str(run))
        assert state.status["state"] == trainer_state
        assert state.state == trainer_state
        assert 0 < state.status["step"] < 120 and state.status["total_steps"] == 120
        assert state.status["elapsed_s"] > elapsed[-1]
        elapsed.append(state.status["elapsed_s"])
        if trainer_state == "running":
            assert read_run(str(run), now=time.time() + 3600, stale_after_s=600).state == "lost"

    started = time.time()
    finished = _run(cmd)
    last_attempt = time.time() - started
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "resuming from step" in finished.stderr
    # The run's cost is every attempt's, not the last one's: final.json's wall time, which the summary reports.
    wall = _final(run)["wall_time_s"]
    assert elapsed[-1] < wall <= elapsed[-1] + last_attempt
    assert wall <= read_run(str(run)).status["elapsed_s"]  # written just before the last status
    assert _final(run)["params_sha256"] == _final(reference)["params_sha256"]
    assert _final(run)["ema_sha256"] == _final(reference)["ema_sha256"]
    assert _final(run)["test"] == _final(reference)["test"]
    assert _final(run)["best_test"] == _final(reference)["best_test"]  # earlier evaluations read back
    status = read_run(str(run))
    assert status.state == "finished"
    assert status.status["attempt"] == 3 and status.status["step"] == 120
    assert status.status["eval_exact_accuracy"] == _final(run)["test"]["exact_accuracy"]
    assert status.status["elapsed_s"] > 0 and status.status["examples_per_s"] > 0

    # The metrics file of the resumed run holds each record once, as if never interrupted.
    def without_speed(rs):
        return [{k: v for k, v in r.items() if k != "examples_per_s"} for r in rs]

    assert without_speed(_records(run)) == without_speed(records)


def test_a_tiny_model_learns_a_6x6_board(tmp_path):
    # Any board's dataset trains unchanged (its seq_len and vocab come from dataset.json); 6x6 learns faster than
    # the other tests' 9x9 puzzles.
    six = Board.of_size(6)
    easy_csv(tmp_path / "easy.csv", puzzles=60, blanks=6, seed=0, board=six)
    built = build_dataset(tmp_path / "easy.csv", tmp_path / "built", num_aug=4, board=six)
    assert read_metadata(built, "test")["seq_len"] == 36
    easy_data = stage(built, f"file://{tmp_path / 'staged'}")
    run = tmp_path / "learn"
    extra = {
        "data.board": "6x6",
        "arch.hidden_size": 64,
        "arch.halt_max_steps": 4,
        "train.epochs": 40,
        "train.eval_interval": 20,
        "optim.lr": 3e-3,
        "optim.ema": False,
        "train.eval_steps": 4,
        "optim.weight_decay": 0.1,
    }
    done = _run(_train_cmd(easy_data, run, tmp_path / "cache", extra))
    assert done.returncode == 0, done.stderr[-3000:]
    train = [r for r in _records(run) if r["kind"] == "train"]
    assert train[-1]["lm_loss"] < 0.5 * train[0]["lm_loss"]
    # Halt steps lie in 1..halt_max_steps, so their variance is at most (halt_max_steps - 1)^2 / 4.
    halt_max = json.loads((run / "config.json").read_text())["arch"]["halt_max_steps"]
    for record in train:
        assert 1 <= record["steps"] <= halt_max
        assert 0 <= record["steps_variance"] <= (halt_max - 1) ** 2 / 4
    assert any(record["steps_variance"] > 0 for record in train)  # rows halt at different steps
    # Chance is 1/6 per cell; copying the givens alone is not enough to be exact on unseen test puzzles.
    assert _final(run)["test"]["accuracy"] > 0.6


def test_curriculum_changes_depth_during_training(easy_data, tmp_path):
    curriculum = {
        "train.epochs": 8,
        "train.eval_interval": 4,
        "arch.H_cycles": 3,
        "arch.L_cycles": 3,
        "schedules.curriculum.enabled": True,
        "schedules.curriculum.start_H_cycles": 1,
        "schedules.curriculum.start_L_cycles": 1,
        "schedules.curriculum.epochs": 6,
    }
    done = _run(_train_cmd(easy_data, tmp_path / "run", tmp_path / "cache", curriculum))
    assert done.returncode == 0, done.stderr[-3000:]
    depths = [(r["H_cycles"], r["L_cycles"]) for r in _records(tmp_path / "run") if r["kind"] == "train"]
    assert depths[0] < (3, 3) and depths[-1] == (3, 3) and depths == sorted(depths)
    # One compiled step per distinct depth, and no others.
    assert _final(tmp_path / "run")["compilations"] == len(set(depths)) > 2


def test_exploration_probability_reaches_the_compiled_step(easy_data, tmp_path):
    """With a Q head that halts every row at once, exploration (a traced input) keeps rows running."""
    import jax.numpy as jnp

    from trm.data.format import load_split
    from trm.data.verify import fetch_dataset
    from trm.model.config import ModelConfig
    from trm.train.batches import TrainBatches
    from trm.train.step import ModelTemplate, TrainStep, init_state

    config = tiny_config()
    split = load_split(fetch_dataset(easy_data, tmp_path / "cache"), "train")
    model = ModelTemplate(ModelConfig.from_dict(config["arch"], split.metadata), seed=0)
    batch = TrainBatches(split, 8, 1, seed=0).batch(0).as_dict()
    step = TrainStep(model, config, total_steps=10)
    halted = {}
    for prob in (0.0, 1.0):
        state = init_state(model, config, 8)
        q_head = dict(state.params["q_head"], bias=jnp.array([5.0, -5.0]))  # q_halt > 0: halt now
        state = state._replace(params=dict(state.params, q_head=q_head))
        state, _ = step(state, batch, jnp.float32(prob), (2, 2), update=1)
        halted[prob] = state.carry.halted
    assert bool(halted[0.0].all())  # Q halting alone: every row stops after one step
    assert not bool(halted[1.0].any())  # exploration on every row: each must run at least 2 steps
    assert step.compilations == 1  # a new probability is a new input, not a new program


def test_runs_differing_in_learning_rates_ema_rate_or_length_share_one_program(easy_data, tmp_path):
    """Those hyperparameters are inputs of the train step, so such runs of the study (exp04a, exp08, exp10) hit
    the persistent compilation cache; a beta is still compiled in, and makes another program."""
    from trm.data.format import load_split
    from trm.data.verify import fetch_dataset
    from trm.model.config import ModelConfig
    from trm.train.batches import TrainBatches
    from trm.train.step import ModelTemplate, TrainStep, init_state

    split = load_split(fetch_dataset(easy_data, tmp_path / "cache"), "train")
    batch = TrainBatches(split, 8, 1, seed=0).batch(0).as_dict()
    variants = {
        "baseline": ({}, 10),
        "hyperparameters": ({"optim.lr": 3e-3, "optim.lr_min_ratio": 0.1, "optim.ema_rate": 0.5}, 40),
        "beta2": ({"optim.beta2": 0.99}, 10),
    }
    programs = {}
    for name, (sets, total_steps) in variants.items():
        config = tiny_config(sets)
        model = ModelTemplate(ModelConfig.from_dict(config["arch"], split.metadata), seed=0)
        step = TrainStep(model, config, total_steps=total_steps)
        state = init_state(model, config, 8)
        programs[name] = step.lower(state, batch, 0.1, (2, 2), update=3).as_text()
        assert step.hyperparameters(3).lr == np.float32(
            config["optim"]["lr"] * 3 / 5
        )  # in the 5-step warm-up
    assert programs["hyperparameters"] == programs["baseline"]
    assert programs["beta2"] != programs["baseline"]


def test_bad_config_is_rejected_before_training(easy_data, tmp_path, capsys):
    run = tmp_path / "bad"
    done = _run(_train_cmd(easy_data, run, tmp_path / "cache", {"arch.hidden_size": 30, "arch.num_heads": 4}))
    assert done.returncode == 2
    assert "arch.hidden_size" in done.stderr
    assert not run.exists()
    # The final evaluation's step counts (the workflow's test_time_steps) are checked before anything runs too.
    command = _train_cmd(easy_data, run, tmp_path / "cache", {})
    assert trm([*command[3:], "--test-time-steps", "16,x"]) == 2
    assert "--test-time-steps '16,x': expected comma-separated positive integers" in capsys.readouterr().err
    assert not run.exists()


def test_run_dir_refuses_a_different_config(easy_data, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"train": {}}))
    done = _run(_train_cmd(easy_data, run, tmp_path / "cache", {"train.epochs": 2, "train.eval_interval": 1}))
    assert done.returncode == 2
    assert "config.json" in done.stderr and "--run-dir" in done.stderr
    assert os.listdir(run) == ["config.json"]  # the other config's run dir: no failed status written there


def test_data_settings_the_dataset_does_not_have_are_refused_before_training(easy_data, tmp_path, capsys):
    """The issue's `trm train --set data.train_puzzles=100` on a smaller dataset trained, and its config.json said
    100: now one line names the setting and the dataset, and nothing trains (the run dir says why, as for any
    failure while setting up)."""
    run = tmp_path / "run"
    for key, value, message in (
        (
            "data.train_puzzles",
            100,
            "data.train_puzzles is 100, but the dataset at {} holds 48 training puzzles",
        ),
        (
            "data.num_aug",
            7,
            "data.num_aug is 7, but the dataset at {} holds 4 augmentations per training puzzle",
        ),
    ):
        short = {"train.epochs": 1, "train.eval_interval": 1}  # what it would train: 6 steps
        command = _train_cmd(easy_data, run / key, tmp_path / "cache", {**short, key: value})
        assert trm(command[3:]) == 2
        err = capsys.readouterr().err
        assert f"trm train: error: {message.format(easy_data)}" in err and "Traceback" not in err, err
        assert sorted(p.name for p in (run / key).iterdir()) == ["config.json", "logs", "status.json"]
        assert "UserError: " + message.format(easy_data) in read_run(str(run / key)).detail


def test_a_run_refuses_to_resume_on_another_dataset(trained, tmp_path, capsys):
    """The issue's resume with another --data continued from the checkpoint, under the first config's hash: the
    run dir records its dataset (data.json), and `trm train` and `trm launch` refuse another one in one line,
    writing nothing in the run dir."""
    run = Path(shutil.copytree(trained["run"], tmp_path / "run"))
    bound = json.loads((run / "data.json").read_text())
    assert bound["url"] == trained["staged"]
    other = tmp_path / "other"  # the same puzzles and settings, another seed: other content
    build = ["build-dataset", "--source", str(trained["csv"]), "--num-aug", "4", "--seed", "4"]
    assert trm([*build, "--output-dir", str(other)]) == 0
    other_url = stage(other, f"file://{tmp_path / 'staged'}")
    before = {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    run_args = ["--config", str(BASE_CONFIG), "--data", other_url, "--run-dir", str(run), *set_flags(TRAINED)]
    for command in (["train", *run_args, "--cache-dir", str(tmp_path / "cache")], ["launch", *run_args]):
        capsys.readouterr()
        assert trm(command) == 2
        err = capsys.readouterr().err
        assert (
            f"{run}/data.json: this run trains on the dataset {bound['manifest_sha256'][:16]} staged at "
            f"{trained['staged']}, not on "
        ) in err and f"at --data {other_url}: resume it on its own dataset, or use a new --run-dir" in err
        assert "Traceback" not in err, err
        after = {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
        assert after == before


def test_a_run_that_fails_before_training_is_marked_failed_with_its_reason(tmp_path):
    run = tmp_path / "run"
    done = _run(
        _train_cmd("/nonexistent", run, tmp_path / "cache", {"train.epochs": 2, "train.eval_interval": 1})
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "/nonexistent/MANIFEST.json not found" in done.stderr
    state = read_run(str(run))
    assert state.state == "failed" and "UserError: /nonexistent/MANIFEST.json not found" in state.detail
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()) == [
        "config.json",
        "logs/host-0.log",
        "status.json",
    ]


def test_a_failing_step_marks_the_run_failed_with_its_error(easy_data, tmp_path):
    from trm.train.trainer import Trainer

    config = tiny_config({"train.epochs": 2, "train.eval_interval": 1})
    run = tmp_path / "run"
    trainer = Trainer(config, easy_data, str(run), str(tmp_path / "cache"), log_every=1, use_wandb=False)

    def broken_step(*_args, **_kwargs):  # an injected fault, e.g. a device error in the middle of training
        raise RuntimeError("injected device failure")

    trainer.train_step = broken_step
    with pytest.raises(RuntimeError, match="injected"):
        trainer.run()
    state = read_run(str(run))
    assert state.state == "failed"
    assert state.detail == "RuntimeError: injected device failure"
    assert not (run / "_SUCCESS").exists()


def test_remat_recomputes_the_differentiated_recursion_with_the_same_gradients(easy_data, tmp_path):
    import re

    import jax

    from trm.data.format import load_split
    from trm.data.verify import fetch_dataset
    from trm.model.config import ModelConfig
    from trm.train.batches import TrainBatches
    from trm.train.step import ModelTemplate, TrainStep, init_state

    sets = {"arch.hidden_size": 64, "arch.L_cycles": 4, "train.global_batch_size": 16}
    split = load_split(fetch_dataset(easy_data, tmp_path / "cache"), "train")
    batch = TrainBatches(split, 16, 1, seed=0).batch(0).as_dict()
    grads, matmuls = {}, {}
    for remat in (False, True):
        config = tiny_config({**sets, "train.remat": remat})
        model = ModelTemplate(ModelConfig.from_dict(config["arch"], split.metadata), seed=0)
        step = TrainStep(model, config, total_steps=10)
        state = init_state(model, config, 16)
        grads[remat] = step.gradients(state, batch, 0.0, (2, 4))[2]
        # The program just run (read from the compilation cache), not the whole step's: a second compilation.
        compiled = step.lower_gradients(state, batch, 0.0, (2, 4)).compile().as_text()
        matmuls[remat] = len(re.findall(r" dot\(", compiled))
    for plain, rematerialised in zip(
        jax.tree.leaves(grads[False]), jax.tree.leaves(grads[True]), strict=True
    ):
        np.testing.assert_allclose(np.asarray(rematerialised), np.asarray(plain), rtol=1e-5, atol=1e-7)
    # The backward pass recomputes the forward of the differentiated net calls instead of storing them.
    assert matmuls[True] > matmuls[False], matmuls

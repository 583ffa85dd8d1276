"""`trm evaluate`: multi-count pass vs separate runs and the trainer's own evaluation, devices, outputs, bad input."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from tiny_run import TRAINED, set_flags

from trm.cli import main as trm
from trm.data.manifest import write_build_record
from trm.train.evaluate_checkpoint import load_eval_split
from trm.train.evaluator import Evaluator, evaluate
from trm.train.step import ModelTemplate
from trm.train.test_time import run_test_time_evaluation
from trm.train.weights import load_weights

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _evaluate(weights, split, counts: tuple[int, ...], batch_size: int) -> list[dict]:
    evaluator = Evaluator(ModelTemplate(weights.model_cfg, seed=0), counts)
    on_device = evaluator.put_weights(weights.params, weights.puzzle_emb, weights.buffers)
    return evaluate(evaluator, on_device, split, batch_size)


def test_multi_count_pass_equals_separate_runs_and_the_trainers_evaluation(trained):
    weights = load_weights(str(trained["run"]))
    assert weights.source == "ema"
    split = load_eval_split(str(trained["built"]), "test", str(trained["cache"]))
    # 12 test puzzles in batches of 8, the trainer's: 4 padding rows, which must count nowhere.
    multi = _evaluate(weights, split, (2, 16, 32), batch_size=8)
    single = _evaluate(weights, split, (16,), batch_size=8)
    assert [r["steps"] for r in multi] == [2, 16, 32]
    assert multi[1] == single[0]
    assert multi[0] != multi[1]  # more steps change the answers of a barely trained model

    # The trainer evaluated the same EMA weights after eval_steps = 2 with the same evaluator (one compiled
    # supervision step, the same rows per batch, the same devices): equal by construction, bit for bit.
    final = json.loads((trained["run"] / "final.json").read_text())["test"]
    assert multi[0] == final and final["count"] == len(split.inputs)
    assert 0 < multi[0]["accuracy"] < 1
    # The spread over puzzles that the sampling interval of a one-run cell accuracy reads.
    assert 0 < multi[0]["accuracy_puzzle_sd"] < 1
    for record in multi:
        assert 1 <= record["mean_halt_step"] <= record["steps"]
        assert 0 <= record["halted_fraction"] <= 1


def test_the_trainer_and_trm_evaluate_evaluate_in_batches_of_the_runs_eval_batch_size(easy_data, tmp_path):
    # train.eval_batch_size 4 against a training batch of 8: 12 test puzzles in 3 batches, not 2 of 8.
    run, cache = tmp_path / "run", tmp_path / "cache"
    flags = set_flags({**TRAINED, "train.epochs": 1, "train.eval_interval": 1, "train.eval_batch_size": 4})
    args = ["train", "--config", str(REPO / "config/base.yaml"), "--data", easy_data, "--run-dir", str(run)]
    assert trm([*args, "--cache-dir", str(cache), *flags]) == 0
    final = json.loads((run / "final.json").read_text())["test"]
    weights = load_weights(str(run))
    split = load_eval_split(easy_data, "test", str(cache))
    assert _evaluate(weights, split, (2,), batch_size=4) == [final]  # bit for bit: the same program and rows
    # `trm evaluate` reads the run's eval batch, so that its figures are the trainer's.
    out = tmp_path / "evaluate.json"
    evaluate_args = ["evaluate", "--checkpoint", str(run), "--data", easy_data, "--steps", "2"]
    assert trm([*evaluate_args, "--cache-dir", str(cache), "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["batch_size"] == 4 and summary["results"] == [final]


def test_a_stopped_final_evaluation_continues_where_it_stopped(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    weights = load_weights(str(run))
    split = load_eval_split(str(trained["built"]), "test", str(trained["cache"]))
    evaluator = Evaluator(ModelTemplate(weights.model_cfg, seed=0), (2,))
    on_device = evaluator.put_weights(weights.params, weights.puzzle_emb, weights.buffers)
    summary = {"checkpoint": str(run), "checkpoint_step": weights.step, "weights": weights.source}
    # The trainer evaluated train.eval_steps = 2; counts 3 and 5 are new. 12 test puzzles: 2 batches of 6.
    common = {"run_dir": str(run), "counts": (2, 3, 5), "batch_size": 6, "summary": summary, "writer": True}
    trained_at_2 = json.loads((run / "test_time.json").read_text())["results"]
    assert [r["steps"] for r in trained_at_2] == [2]
    stopped = run_test_time_evaluation(
        evaluator, on_device, split, stop=lambda batches: batches == 1, **common
    )
    assert stopped is None
    assert json.loads((run / "test_time.json").read_text())["results"] == trained_at_2  # nothing half-written
    evaluated = []
    resumed = run_test_time_evaluation(
        evaluator, on_device, split, stop=lambda batches: evaluated.append(batches) or False, **common
    )
    assert evaluated == [2]  # only the second batch, and no pass for the count already written
    # Continued from the saved float64 sums: the figures of an unbroken pass, bit for bit.
    assert [resumed[3], resumed[5]] == _evaluate(weights, split, (3, 5), batch_size=6)
    written = json.loads((run / "test_time.json").read_text())
    assert written["results"] == [trained_at_2[0], resumed[3], resumed[5]] and resumed[2] == trained_at_2[0]


def _umask() -> int:
    return int(
        next(
            line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("Umask:")
        )[6:],
        8,
    )


def test_a_failed_write_of_the_final_evaluation_loses_no_batch(trained, tmp_path, capsys, monkeypatch):
    """`trm train` cannot write test_time.json: one line, exit 2, the run marked failed; the pass's batches are
    saved, and the rerun evaluates none of them again and writes the figures of an unbroken pass."""
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    for name in ("_SUCCESS", "final.json", "test_time.json"):
        (run / name).unlink()
    # test_time.json is a link to a path below a regular file: its write fails (for root too), while the
    # progress file beside it can be written. (A full disk fails the same way in trm.storage, with ENOSPC:
    # tests/test_writing_files.py. A link to /dev/full cannot stand in for one: reading it never ends.)
    (tmp_path / "notes").write_text("mine")
    (run / "test_time.json").symlink_to(tmp_path / "notes" / "test_time.json")
    evaluated = []
    real_call = Evaluator.__call__
    monkeypatch.setattr(Evaluator, "__call__", lambda *a: evaluated.append(1) or real_call(*a))
    train = ["train", "--config", str(REPO / "config/base.yaml"), "--data", trained["staged"]]
    train += ["--run-dir", str(run), "--cache-dir", str(trained["cache"]), "--test-time-steps", "3,5"]
    train += set_flags(TRAINED)

    assert trm(train) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    expected = f"cannot write {run / 'test_time.json'}: {tmp_path / 'notes'} is a file, not a folder"
    assert error.startswith(f"trm train: error: {expected}")
    assert error.endswith("without evaluating again")
    assert json.loads((run / "status.json").read_text())["state"] == "failed"
    assert len(evaluated) == 2  # 12 test puzzles in batches of 8
    assert json.loads((run / "test_time.progress.json").read_text())["tally"]["batches"] == 2
    assert (tmp_path / "notes").read_text() == "mine"

    (run / "test_time.json").unlink()  # the way is clear again
    evaluated.clear()
    assert trm(train) == 0
    assert "test-time evaluation continues after batch 2" in capsys.readouterr().err
    assert evaluated == []  # not one batch evaluated again
    weights = load_weights(str(run))
    unbroken = _evaluate(
        weights, load_eval_split(str(trained["built"]), "test", str(trained["cache"])), (2, 3, 5), 8
    )
    assert json.loads((run / "test_time.json").read_text())["results"] == unbroken
    assert json.loads((run / "final.json").read_text())["test"] == unbroken[0]
    # Every file the run's writer wrote has the umask's permissions (0644 under the usual 022), not mkstemp's 0600.
    written = ["config.json", "status.json", "metrics.jsonl", "test_time.json", "final.json", "_SUCCESS"]
    assert {name: stat.S_IMODE(os.stat(run / name).st_mode) for name in written} == dict.fromkeys(
        written, 0o666 & ~_umask()
    )


def _evaluate_cli(trained, out: Path, data: str, extra: list[str] = ()) -> dict:
    args = ["evaluate", "--checkpoint", str(trained["run"]), "--data", data, "--steps", "2,6"]
    assert (
        trm([*args, "--batch-size", "6", "--cache-dir", str(trained["cache"]), "--out", str(out), *extra])
        == 0
    )
    return json.loads(out.read_text())


def test_cli_outputs_on_staged_dataset_and_csv(trained, tmp_path):
    summary = _evaluate_cli(trained, tmp_path / "staged.json", trained["staged"])
    assert summary["weights"] == "ema" and summary["split"] == "test"
    assert [r["steps"] for r in summary["results"]] == [2, 6]
    rows = (tmp_path / "staged.csv").read_text().splitlines()
    assert rows[0].split(",")[:4] == ["steps", "count", "exact_accuracy", "accuracy"]
    assert [float(x) for x in rows[2].split(",")[:4]] == [
        summary["results"][1][k] for k in ("steps", "count", "exact_accuracy", "accuracy")
    ]
    # The CSV the dataset was built from, read directly; its first 5 puzzles.
    from_csv = _evaluate_cli(trained, tmp_path / "csv.json", str(trained["csv"]), ["--subset", "5"])
    assert from_csv["split"] == "csv" and from_csv["results"][0]["count"] == 5


def test_same_results_on_one_and_two_devices(trained, tmp_path):
    assert jax.local_device_count() == 1
    one = _evaluate_cli(trained, tmp_path / "one.json", str(trained["built"]), ["--steps", "1,2"])
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "trm.cli", "evaluate", "--checkpoint", str(trained["run"])]
    cmd += [
        "--data",
        str(trained["built"]),
        "--steps",
        "1,2",
        "--batch-size",
        "6",
        "--out",
        str(tmp_path / "two.json"),
    ]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    two = json.loads((tmp_path / "two.json").read_text())
    assert (one["devices"], two["devices"]) == (1, 2)
    # Per-puzzle outcomes are identical; the float32 per-puzzle losses may differ in the last bit, since
    # XLA may order a reduction differently for a shard of 3 rows than for 6. One and two supervision steps:
    # the untrained recurrence amplifies such a difference about x19 per step, so more steps could flip an
    # answer on some CPUs.
    for a, b in zip(one["results"], two["results"], strict=True):
        assert {k: v for k, v in a.items() if "loss" not in k} == {
            k: v for k, v in b.items() if "loss" not in k
        }
        assert (a["lm_loss"], a["q_halt_loss"]) == pytest.approx((b["lm_loss"], b["q_halt_loss"]), rel=1e-6)


def test_llvms_expensive_passes_change_no_figure(trained, tmp_path):
    # The suite (tests/conftest.py) and the workflow's CPU hosts (trm/launch/local.py) compile without them; the
    # trainer's final evaluation was compiled so. Evaluated again with them, in a process of its own.
    flags = [flag for flag in os.environ["XLA_FLAGS"].split() if "llvm_disable_expensive_passes" not in flag]
    env = {**os.environ, "XLA_FLAGS": " ".join(flags)}
    cmd = [sys.executable, "-m", "trm.cli", "evaluate", "--checkpoint", str(trained["run"]), "--steps", "2"]
    cmd += ["--data", str(trained["built"]), "--out", str(tmp_path / "full.json")]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    final = json.loads((trained["run"] / "final.json").read_text())["test"]
    assert json.loads((tmp_path / "full.json").read_text())["results"] == [final]


def test_bad_input(trained, tmp_path, capsys):
    base = ["evaluate", "--cache-dir", str(trained["cache"]), "--out", str(tmp_path / "out.json")]

    def fails(*args: str) -> str:
        assert trm([*base, *args]) == 2
        return capsys.readouterr().err

    err = fails("--checkpoint", str(tmp_path / "nope"), "--data", str(trained["built"]))
    assert "nope: no such checkpoint" in err
    err = fails("--checkpoint", str(trained["run"]), "--data", str(trained["built"]), "--steps", "0,16")
    assert "--steps" in err

    # --out cannot be written (a folder of its path is a file): one line, and the results on stdout.
    (tmp_path / "notes").write_text("mine")
    out = tmp_path / "notes" / "out.json"
    args = [
        "--checkpoint",
        str(trained["run"]),
        "--data",
        str(trained["built"]),
        "--steps",
        "2",
        "--out",
        str(out),
    ]
    assert trm([*base, *args]) == 2
    printed = capsys.readouterr()
    assert (
        f"trm evaluate: error: cannot write {tmp_path / 'notes' / 'out.csv'}" in printed.err.splitlines()[-1]
    )
    assert [r["steps"] for r in json.loads(printed.out)["results"]] == [2]
    assert (tmp_path / "notes").read_text() == "mine"

    # Another vocabulary: the dataset's metadata disagrees with the checkpoint's embedding table.
    other = tmp_path / "other"
    shutil.copytree(trained["built"], other)
    meta_path = other / "test" / "dataset.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "vocab_size": 12}))
    err = fails("--checkpoint", str(trained["run"]), "--data", str(other))
    assert "test/dataset.json: truncated" in err and "rebuild it" in err, "changed after its build: refused"
    write_build_record(other)  # as if built so
    err = fails("--checkpoint", str(trained["run"]), "--data", str(other))
    assert "vocab_size = 12" in err and "has vocab_size = 11" in err

    # Another architecture: config.json says hidden_size 64, the checkpoint's arrays are 32 wide.
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    config = json.loads((run / "config.json").read_text())
    config["arch"]["hidden_size"] = 64
    (run / "config.json").write_text(json.dumps(config))
    err = fails("--checkpoint", str(run), "--data", str(trained["built"]))
    assert "another architecture" in err and "embed_tokens" in err

    # Damaged checkpoints: the state item gone, then every array file garbled.
    damaged = tmp_path / "damaged"
    shutil.copytree(trained["run"], damaged)
    (step,) = [p for p in (damaged / "ckpt").iterdir() if p.name.isdigit()]
    state = step / "state"
    garbled = tmp_path / "garbled"
    shutil.copytree(trained["run"], garbled)
    shutil.rmtree(state)
    err = fails("--checkpoint", str(damaged), "--data", str(trained["built"]))
    assert f"ckpt/{step.name}: the checkpoint cannot be read" in err and "Traceback" not in err
    for file in (garbled / "ckpt" / step.name / "state").rglob("*"):
        if file.is_file() and "metadata" not in file.name:
            file.write_bytes(b"\x00garbage" * 3)
    err = fails("--checkpoint", str(garbled), "--data", str(trained["built"]))
    assert f"ckpt/{step.name}: the checkpoint cannot be read" in err, err
    assert not (tmp_path / "out.json").exists()

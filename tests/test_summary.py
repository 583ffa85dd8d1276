"""`trm summarize`: a finished run dir (a file:// URL or a gs:// bucket) turned into the one summary the results table
reads; an unfinished run or one lacking a test-time count refused, writing nothing (the workflow then relaunches
its job); the metrics as the registry (trm/study/metrics.py) defines them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trm import storage
from trm.analysis.summary import REEVALUATE, SUMMARY_KEYS, _pooled_variance, run_metrics, weights_digest
from trm.cli import main as trm_main
from trm.run import layout
from trm.study.metrics import SUMMARY_METRICS, TEST_TIME_METRICS
from trm.train.records import EVAL_STATS, best_evaluation

CONFIG = {"train": {"eval_interval": 10, "global_batch_size": 8}}


def _eval(step: int, exact: float, subset: int | None = 8192) -> dict:
    """An eval record as the trainer writes it (metrics abridged)."""
    count = 8192 if subset else 422_786
    return {"kind": "eval", "split": "test", "subset": subset, "step": step, "epoch": step / 10, "count": count,
            "exact_accuracy": exact, "accuracy": 0.9, "accuracy_puzzle_sd": 0.05}  # fmt: skip


def _train(step: int, halt_steps: list[int], rate: float) -> dict:
    """A train record as the trainer writes it: rows counted, their mean and (population) variance of halt steps."""
    return {"kind": "train", "step": step, "epoch": step / 10, "count": len(halt_steps), "steps": np.mean(halt_steps),
            "steps_variance": np.var(halt_steps), "exact_accuracy": 0.5, "examples_per_s": rate}  # fmt: skip


def _result(steps: int, exact: float) -> dict:
    """One step count of test_time.json, with a field the table does not keep (a loss)."""
    return {"steps": steps, "count": 32, **{name: 0.5 for name in EVAL_STATS}, "exact_accuracy": exact}


def finished_run(root: str, counts: tuple[int, ...] = (16, 32), success: bool = True) -> str:
    """A run dir under `root` as the trainer leaves it: config, metrics, test-time evaluation, final.json, _SUCCESS."""
    run = storage.join(root, "runs", "abc")
    evals = [_eval(200, 0.82), _eval(400, 0.8, None)]
    records = [
        _train(100, [1, 2], 50.0),
        _train(350, [3, 16, 7], 100.0),
        evals[0],
        _train(400, [2, 4], 120.0),
    ]
    records.append(evals[1])
    final = {"config_hash": "abc", "devices": 4, "steps": 400, "epochs": 40.0, "test": evals[-1],
             "best_test": best_evaluation(records), "params_sha256": "p" * 64, "ema_sha256": "e" * 64,
             "wall_time_s": 60.5}  # fmt: skip
    # A newer trainer may add fields (e.g. the subset evaluated): the summary ignores what it does not read.
    evaluation = {"checkpoint_step": 400, "weights": "ema", "subset": None,
                  "results": [_result(k, 0.8 - k / 1000) for k in counts]}  # fmt: skip
    files = {
        "config.json": json.dumps(CONFIG),
        "metrics.jsonl": "".join(json.dumps(r) + "\n" for r in records),
        "test_time.json": json.dumps(evaluation),
        "final.json": json.dumps(final),
    }
    if success:
        files["_SUCCESS"] = ""
    for name, text in files.items():
        storage.write_text(storage.join(run, name), text)
    return run


def summarize(run: str, output: Path, steps: str = "16,32") -> int:
    return trm_main(["summarize", run, "--test-time-steps", steps, "--output", str(output)])


def test_a_finished_run_is_summarised_from_storage(storage_root, tmp_path):
    run = finished_run(storage_root)
    output = tmp_path / "runs" / "exp.json"
    assert summarize(run, output, "32,16") == 0
    summary = json.loads(output.read_text())
    # What identifies the run and what it measured; not its config, whose copy outside the run dir is its job file.
    assert sorted(summary) == sorted(SUMMARY_KEYS)
    assert (summary["config_hash"], summary["devices"]) == ("abc", 4)
    assert summary["weights_sha256"] == weights_digest({"params_sha256": "p" * 64, "ema_sha256": "e" * 64})
    assert summary["test_exact_accuracy"] == 0.8 and summary["test_cell_accuracy"] == 0.9
    assert summary["test_cell_accuracy_puzzle_sd"] == 0.05
    best = (summary["best_test_exact_accuracy"], summary["best_test_epoch"], summary["best_test_puzzles"])
    assert best == (0.82, 20.0, 8192)
    # The last eval interval (epochs 30 to 40) holds the train records of steps 350 and 400: the halt steps are
    # those of their rows; throughput is the median of the records after the first.
    assert summary["mean_halt_steps"] == pytest.approx(np.mean([3, 16, 7, 2, 4]))
    assert summary["halt_steps_variance"] == pytest.approx(np.var([3, 16, 7, 2, 4]))
    assert summary["examples_per_second"] == 110.0 and summary["step_time_s"] == 8 / 110.0
    assert summary["train_test_gap"] == pytest.approx(0.5 - 0.8) and summary["epochs_to_85pct"] is None
    assert summary["curve"] == [
        {"epoch": 20.0, "count": 8192, "test_exact_accuracy": 0.82, "test_cell_accuracy": 0.9},
        {"epoch": 40.0, "count": 422_786, "test_exact_accuracy": 0.8, "test_cell_accuracy": 0.9},
    ]
    # The requested counts, in order, with the test-time table's fields only.
    assert [r["steps"] for r in summary["test_time"]] == [16, 32]
    assert all(sorted(r) == sorted(TEST_TIME_METRICS) for r in summary["test_time"])
    assert summary["test_time"][1]["exact_accuracy"] == 0.8 - 32 / 1000
    # Experiments sharing the run (one config hash) each get the same summary.
    assert summarize(run, tmp_path / "runs" / "other.json", "32,16") == 0
    assert (tmp_path / "runs" / "other.json").read_text() == output.read_text()


def test_an_unfinished_run_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    run = finished_run(f"file://{tmp_path / 'storage'}", success=False)
    output = tmp_path / "runs" / "exp.json"
    assert summarize(run, output) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"trm summarize: error: {run}: the run has not finished (no _SUCCESS marker); its job trains it\n"
    )
    assert not output.parent.exists()


def test_a_run_lacking_a_test_time_count_is_refused_so_that_its_job_relaunches(tmp_path, capsys):
    run = finished_run(str(tmp_path / "storage"), counts=(2, 16))
    output = tmp_path / "exp.json"
    assert summarize(run, output) == 2
    err = capsys.readouterr().err
    assert "test_time.json: the run's final evaluation has step counts 2,16, not 32: rerun its job" in err
    assert len(err.splitlines()) == 1 and not output.exists()
    assert summarize(run, output, "16") == 0  # the counts it has are enough for a study asking only those


def test_an_evaluation_of_another_checkpoint_is_refused(tmp_path, capsys):
    run = finished_run(str(tmp_path / "storage"))
    url = storage.join(run, "test_time.json")
    evaluation = json.loads(storage.read_text(url))
    storage.write_text(url, json.dumps({**evaluation, "checkpoint_step": 300}))
    assert summarize(run, tmp_path / "exp.json") == 2
    assert "evaluates the checkpoint of step 300, but the run finished at step 400" in capsys.readouterr().err
    assert not (tmp_path / "exp.json").exists()


@pytest.mark.parametrize(
    ("name", "line", "remedy"),
    [
        ("metrics.jsonl", 5, layout.RETRAIN),  # its last record cut short
        ("config.json", 1, layout.RETRAIN),
        ("final.json", 1, REEVALUATE),
        ("test_time.json", 1, REEVALUATE),
    ],
)
def test_a_damaged_file_of_a_finished_run_is_named_with_its_line_and_what_to_do(
    tmp_path, capsys, name, line, remedy
):
    """A file cut short (a crash, a full disk) or edited: one line naming it, where it stops parsing and what to
    do (the evaluation's files are made again from the last checkpoint; the training's only by training)."""
    run = finished_run(str(tmp_path / "storage"))
    url = storage.join(run, name)
    text = storage.read_text(url)
    storage.write_text(url, text[: len(text.rstrip()) - 20])
    assert summarize(run, tmp_path / "exp.json") == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"trm summarize: error: {url}: damaged (cut short, or edited?): not valid JSON at line {line} ("
    )
    assert err.endswith(f"); {remedy}\n") and err.count("\n") == 1
    assert not (tmp_path / "exp.json").exists()


def test_the_summary_computes_exactly_the_registrys_run_metrics():
    records = [_train(100, [1, 2], 50.0), _eval(100, 0.9, None)]
    final = {"steps": 100, "epochs": 10.0, "test": records[-1], "best_test": best_evaluation(records)}
    metrics = run_metrics(CONFIG, records, final)
    assert tuple(metrics) == SUMMARY_METRICS
    assert metrics["epochs_to_85pct"] == 10.0 and metrics["examples_per_second"] == 50.0


def test_test_time_metrics_are_the_trainers_evaluation_fields_but_the_losses():
    assert tuple(TEST_TIME_METRICS) == (
        "steps",
        "count",
        *(name for name in EVAL_STATS if not name.endswith("_loss")),
    )


def test_pooled_variance_equals_the_variance_of_every_row():
    groups = [[3, 16, 7], [2, 2, 10, 4], [16]]
    pooled = _pooled_variance([_train(1, g, 1.0) for g in groups])
    assert pooled == pytest.approx(np.var(sum(groups, [])), rel=1e-12)
    assert _pooled_variance([]) is None
    assert _pooled_variance([{"count": 0, "steps": 0.0, "steps_variance": 0.0}]) is None  # no row halted


def test_best_evaluation_is_the_highest_and_the_latest_among_equals():
    records = [
        _eval(100, 0.5),
        {"kind": "train", "step": 150},
        _eval(200, 0.8),
        _eval(300, 0.7),
        _eval(400, 0.8, None),
    ]
    assert best_evaluation(records) == {k: v for k, v in records[-1].items() if k not in ("kind", "split")}
    assert best_evaluation(records[:4])["step"] == 200
    assert best_evaluation([{"kind": "train", "step": 1}]) is None


def test_a_runs_wall_time_is_its_own_whichever_job_collects_it(tmp_path):
    """A job that only collects a finished run (another controller trained it, or a rerun after a full disk) takes
    a second; the summary reports the run's own wall time over all its attempts (final.json), and for a run
    finished by a trainer that did not record it there, status.json's elapsed time."""
    run = finished_run(str(tmp_path / "storage"))
    assert summarize(run, tmp_path / "a.json") == 0
    assert json.loads((tmp_path / "a.json").read_text())["wall_time_s"] == 60.5
    final = json.loads(storage.read_text(storage.join(run, "final.json")))
    del final["wall_time_s"]
    storage.write_text(storage.join(run, "final.json"), json.dumps(final))
    storage.write_text(storage.join(run, "status.json"), json.dumps({"state": "finished", "elapsed_s": 58.0}))
    assert summarize(run, tmp_path / "b.json") == 0
    assert json.loads((tmp_path / "b.json").read_text())["wall_time_s"] == 58.0
    storage.write_text(storage.join(run, "status.json"), "{")  # damaged: not measured
    assert summarize(run, tmp_path / "c.json") == 0
    assert json.loads((tmp_path / "c.json").read_text())["wall_time_s"] is None


def test_the_weights_digest_tells_bit_identical_runs_apart():
    final = {"params_sha256": "p" * 64, "ema_sha256": "e" * 64}
    assert weights_digest(final) == weights_digest(dict(final))
    assert weights_digest({**final, "ema_sha256": "f" * 64}) != weights_digest(final)  # another EMA rate
    assert weights_digest({**final, "ema_sha256": None}) != weights_digest(final)
    assert weights_digest({}) is None

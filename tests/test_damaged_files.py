"""A file that a crash, a full disk or a hand edit cut short: its reader names it in one line, where it stops parsing
and what to do (trm.storage.read_json and read_json_lines, the one way a file's JSON is read), or, when the file
only holds work that can be done again (a cache, an evaluation in progress), does that work again."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from tiny_run import tiny_config

from trm import storage
from trm.run import layout
from trm.train.records import MetricsLog

PACKAGE = Path(__file__).resolve().parents[1] / "trm"

# The modules that parse JSON themselves, and why a damaged input is handled there: every other reader uses
# trm.storage's helpers.
OWN_JSON_READERS = {
    "config/schema.py": "the package's own schema.json, which no run writes",
    "config/load.py": "config files the user writes: errors name the file and the line (read_mapping)",
    "data/manifest.py": "a manifest's text, refused as 'not a valid dataset manifest' naming it",
    "data/stage.py": "the staging marker: refused naming it, with what to do",
    "run/state.py": "status.json and launch.json: `trm status` shows a half-written marker as damaged",
    "run/lease.py": "lease.json: refused naming it, with what to do",
    "study/measured.py": "the local plan's measurements: a file it cannot read measures nothing (skipped)",
    "launch/slice_ledger.py": "a half-written slice record names no slice to delete: skipped",
    "launch/gcloud.py": "gcloud's output, not a file",
    "run/timing.py": "a process's output (its timings record), read by a benchmark and a test, not by a command",
}


def _cut(path: Path) -> None:
    """Cut the file short in the middle of its last line, as a crash or a full disk would."""
    text = path.read_bytes()
    path.write_bytes(text[: len(text.rstrip()) - 5])


def test_json_files_are_read_through_the_storage_helpers():
    parsing = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            called = getattr(node, "func", None)
            if isinstance(called, ast.Attribute) and called.attr in ("load", "loads"):
                if isinstance(called.value, ast.Name) and called.value.id == "json":
                    parsing.add(path.relative_to(PACKAGE).as_posix())
    assert parsing - {"storage.py"} == set(OWN_JSON_READERS), "read files with trm.storage.read_json"


def test_the_helpers_name_the_file_the_line_and_what_to_do(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b'{"a": 1,\n "b": [1, \xff]}')
    with pytest.raises(storage.DamagedFile) as info:
        storage.read_json(str(path), "missing", "do this")
    assert (
        str(info.value)
        == f"{path}: damaged (cut short, or edited?): not text (byte 19 is not UTF-8); do this"
    )
    path.write_text('{"a": 1,\n "b": [1, 2')
    with pytest.raises(storage.DamagedFile) as info:
        storage.read_json(str(path), "missing", "do this")
    assert str(info.value).startswith(f"{path}: damaged (cut short, or edited?): not valid JSON at line 2 (")
    lines = tmp_path / "a.jsonl"
    lines.write_text('{"step": 1}\n\n{"step": 2}\n{"st')
    with pytest.raises(storage.DamagedFile, match=r"a\.jsonl: damaged .* at line 4 \(.*\); do that$"):
        storage.read_json_lines(str(lines), "missing", "do that")
    lines.write_text('{"step": 1}\n\n{"step": 2}\n')
    assert storage.read_json_lines(str(lines), "missing", "do that") == [{"step": 1}, {"step": 2}]


def test_a_resumed_run_with_a_damaged_metrics_log_or_config_stops_naming_it(tmp_path):
    """The trainer keeps the records up to the checkpoint it resumes from: a damaged one cannot be kept, and the
    run's figures would miss it, so the run stops before training, naming the file and line."""
    url = str(tmp_path / layout.METRICS)
    records = [{"kind": "train", "step": step} for step in (10, 20, 30)]
    Path(url).write_text("".join(json.dumps(r) + "\n" for r in records))
    assert MetricsLog(url, resume_step=20).records == records[:2]  # the later one is written again
    _cut(Path(url))
    with pytest.raises(storage.DamagedFile) as info:
        MetricsLog(url, resume_step=20)
    assert str(info.value).startswith(f"{url}: damaged (cut short, or edited?): not valid JSON at line 3 (")
    assert str(info.value).endswith(f"); {layout.RETRAIN}")
    (tmp_path / layout.CONFIG).write_text('{"arch": {"hidden_size": 5')
    with pytest.raises(storage.DamagedFile, match=f"config.json: damaged .*; {layout.RETRAIN}$"):
        layout.stored_config_hash(str(tmp_path))


def test_a_damaged_evaluation_or_its_progress_is_evaluated_again(tmp_path, capsys):
    from trm.train.test_time import _saved_tally, read_evaluation

    run = str(tmp_path)
    (tmp_path / layout.TEST_TIME).write_text('{"checkpoint_step": 24, "results": [{"steps": 2, "cou')
    assert read_evaluation(run, 24) == {}
    (tmp_path / layout.TEST_TIME_PROGRESS).write_text('{"key": {"counts": [2]}, "tally": {"batc')
    assert _saved_tally(run, {"counts": [2]}).batches == 0  # a fresh pass
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": damaged")[0] for line in err] == [
        str(tmp_path / layout.TEST_TIME),
        str(tmp_path / layout.TEST_TIME_PROGRESS),
    ]
    assert all(line.endswith("; evaluating again") for line in err)


def test_a_damaged_cost_cache_is_computed_again_and_a_damaged_figure_names_how_to_compile_it(
    tmp_path, capsys
):
    from trm.launch.accelerators import COMPILE_AGAIN, step_figures
    from trm.study.estimate import CostCache, compiled_step_seconds

    cache = tmp_path / "model-costs.json"
    cache.write_text('{"abc": {"parameter_count": 12')
    costs = CostCache(cache)
    assert costs.entries == {} and capsys.readouterr().err.endswith("; computing the costs again\n")
    costs.costs("def", tiny_config())
    costs.save()
    assert list(json.loads(cache.read_text())) == ["def"]

    config = tiny_config()
    figures = Path(step_figures(tmp_path / "compiled", config))
    figures.parent.mkdir()
    figures.write_text('{"accelerator": "v4", "tra')
    with pytest.raises(storage.DamagedFile) as info:
        compiled_step_seconds(config, tmp_path / "compiled")
    assert str(info.value).startswith(f"{figures}: damaged") and str(info.value).endswith(COMPILE_AGAIN)


def test_a_host_log_cut_inside_a_character_keeps_the_run_going(tmp_path):
    import sys

    from trm.train.hostlog import HostLog

    url = tmp_path / "host-0.log"
    url.write_bytes("train: 100%|██████████|".encode()[:-3])  # a progress bar cut inside its last character
    log = HostLog()
    try:
        print("next attempt", file=sys.stderr)
        log.attach(str(url))
    finally:
        log.close()
    text = url.read_text()
    assert (
        text.startswith("train: 100%|█████████")
        and "this attempt's output" in text
        and "next attempt" in text
    )

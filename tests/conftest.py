"""Shared pytest fixtures."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from trm.launch.local import MALLOC_HUGE_PAGES, with_tunable

pytest_plugins = ["gcs_emulator", "fake_tpu"]  # GCS emulator and fake gcloud fixtures (tests/*.py)

# One persistent XLA compilation cache for the session, inherited by every subprocess (trainers, hosts): the
# tests compile the same tiny programs many times, and on 2 cores compiling is much of their time. Set before
# anything imports jax. A fresh folder per session, so no run depends on an earlier one.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="trm-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Dataset copies fetched by trainers and evaluators go to a session folder, never the user's ~/.cache/trm
# (tests write only inside their own temporary folders; tests/system_guard.py checks it).
if "TRM_CACHE_DIR" not in os.environ:
    _datasets = tempfile.mkdtemp(prefix="trm-tests-datasets-")
    atexit.register(shutil.rmtree, _datasets, ignore_errors=True)
    os.environ["TRM_CACHE_DIR"] = _datasets
# Skip LLVM's expensive optimisation passes: the tests' programs are tiny, so compiling costs more than running
# (a smoke training: 25 s -> 21 s, same accuracy). And optimise at LLVM's level 1, not 2: a tiny trainer's cold
# start 10.2 -> 8.2 CPU-seconds, its steps as fast (240 steps at hidden 32, 64 and 128: the same time); only a
# float32 sum's last bit may differ (an evaluation's mean loss), and every comparison in the suite runs under the
# same flags. The workflow's own CPU hosts keep level 2 (trm/launch/local.py).
for _flag in ("--xla_llvm_disable_expensive_passes=true", "--xla_backend_optimization_level=1"):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()
# The allocator setting of the workflow's hosts (trm/launch/local.py), inherited by the xdist workers started
# after this: glibc reads it only when a process starts.
os.environ["GLIBC_TUNABLES"] = with_tunable(os.environ.get("GLIBC_TUNABLES", ""), *MALLOC_HUGE_PAGES)

# Test modules by decreasing run time (wall seconds of their tests in a three-worker `make test`, 2026-12-07),
# run first: with `pytest -n 3 --dist loadfile --no-loadscope-reorder` (make test) each module goes to one worker,
# in this order, and starting with the longest ones lets the workers finish at about the same time. Without
# --no-loadscope-reorder, pytest-xdist orders modules by their number of tests: the one-test chaos study ran last.
LONGEST_MODULES = [
    "test_chaos.py",  # 193 s
    "test_multihost.py",  # 146
    "test_tpu_vm.py",  # 140
    "test_trainer.py",  # 95
    "test_workflow.py",  # 91
    "test_interrupts.py",  # 85
    "test_workflow_plan_checks.py",  # 51
    "test_tpu_profile.py",  # 50
    "test_canary_workflow.py",  # 42
    "test_lease.py",  # 37
    "test_tpu_compile.py",  # 36
    "test_canary.py",  # 32
    "test_act.py",  # 29: this one and the five below measured on 2026-12-06, on two workers
    "test_sampled.py",  # 29
    "test_workflow_quoting.py",  # 27
    "test_tpu_cloud.py",  # 26
    "test_model.py",  # 22
    "test_evaluate.py",  # 20
]

REPO_ROOT = Path(__file__).resolve().parents[1]
# Real hard puzzles, committed as a small fixture (its README names the sources).
SUDOKU_DATA = REPO_ROOT / "tests" / "data" / "sudoku"


@pytest.fixture(scope="session")
def sudoku_data() -> Path:
    """Folder of real hard Sudoku puzzles in the Sudoku-Extreme CSV format (tests/data/sudoku/README.md)."""
    return SUDOKU_DATA


# The fixtures below import trm inside: the GCS emulator plugin must set its variables before trm.storage is
# imported, and this module is imported before the plugins.


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the workflow and its config, so a test can edit files and write results in isolation."""
    from workflow_support import copy_workflow

    return copy_workflow(tmp_path / "study")


@pytest.fixture(scope="session")
def base_config() -> dict:
    """config/base.yaml, resolved."""
    from trm.config import load_config

    return load_config()


@pytest.fixture(scope="session")
def experiment_configs() -> dict[str, dict]:
    """Every experiment file of config/experiments, resolved: {experiment id: config}."""
    from trm.config import experiment_ids, experiment_path, load_config

    return {exp_id: load_config(experiment_path(exp_id)) for exp_id in experiment_ids()}


@pytest.fixture(scope="session")
def easy_puzzles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CSV of 60 easy puzzles, 6 blanks each (tests/tiny_run.py `easy_csv`)."""
    from tiny_run import easy_csv

    path = tmp_path_factory.mktemp("easy") / "easy.csv"
    easy_csv(path, puzzles=60, blanks=6, seed=0)
    return path


@pytest.fixture(scope="session")
def easy_dataset(easy_puzzles: Path) -> Path:
    """`easy_puzzles` built with 4 augmentations: 48 train groups of 5 puzzles, 12 test puzzles."""
    from tiny_run import build_dataset

    return build_dataset(easy_puzzles, easy_puzzles.parent / "built", num_aug=4)


@pytest.fixture(scope="session")
def easy_data(easy_dataset: Path) -> str:
    """`easy_dataset` staged: the file:// URL that `trm train --data` takes."""
    from tiny_run import stage

    return stage(easy_dataset, f"file://{easy_dataset.parent / 'staged'}")


@pytest.fixture(scope="session")
def trained(easy_puzzles: Path, easy_dataset: Path, easy_data: str, tmp_path_factory) -> dict:
    """A tiny model trained 24 steps by `trm train` on `easy_data` (tests/tiny_run.py TRAINED), once per session.
    Tests copy its run dir before changing anything in it. Keys: csv, built, staged (the data's three forms),
    run (the run dir), cache (the dataset cache of `trm train` and `trm evaluate`)."""
    from tiny_run import TRAINED, set_flags

    from trm.cli import main as trm
    from trm.config import BASE_CONFIG

    folder = tmp_path_factory.mktemp("trained")
    run, cache = folder / "run", folder / "cache"
    args = ["train", "--config", str(BASE_CONFIG), "--data", easy_data, "--run-dir", str(run)]
    assert trm([*args, "--cache-dir", str(cache), *set_flags(TRAINED)]) == 0
    return {"csv": easy_puzzles, "built": easy_dataset, "staged": easy_data, "run": run, "cache": cache}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order otherwise kept


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--allow-skips",
        action="store_true",
        help="do not fail the session when a test is skipped (the suite must skip nothing on a fresh clone)",
    )


def _skipped(config: pytest.Config) -> list:
    """Skipped tests that fail the session (none under --allow-skips; a pytest-xdist worker leaves the decision
    to the controller, which sees every worker's reports)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.getoption("--allow-skips") or hasattr(config, "workerinput"):
        return []
    return reporter.stats.get("skipped", [])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a session that skipped a test: every test must run on every machine (CI runs this suite)."""
    if _skipped(session.config) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if skipped := _skipped(config):
        names = ", ".join(sorted({report.nodeid for report in skipped})[:5])
        terminalreporter.write_sep("=", f"{len(skipped)} skipped, which fails the session: {names}", red=True)

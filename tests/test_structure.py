"""The shape of the package (docs/architecture.md): imports flow one way down the pipeline, no module grows past
400 lines, and one module names the files of a run directory."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "trm"
# The packages in pipeline order: each may import itself, the foundation and the packages before it.
ORDER = ["config", "data", "model", "run", "train", "launch", "study", "analysis"]
FOUNDATION = {
    "errors",
    "storage",
    "gcs",
    "checkout",
    "platform",
}  # modules of trm/ itself, importable from anywhere
MAX_LINES = 400  # a module a researcher reads in one sitting


def _layer(module: str) -> str:
    """'trm.train.step' -> 'train'; 'trm.storage' -> 'storage'."""
    return module.split(".")[1]


def _imports(path: Path) -> set[str]:
    """Every trm module `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("trm.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "trm":
            if node.module == "trm":  # from trm import storage
                found |= {f"trm.{alias.name}" for alias in node.names}
            else:
                found.add(node.module)
    return found


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_imports_flow_one_way_down_the_pipeline():
    wrong = []
    for path in _modules():
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if own == "cli":  # the `trm` command: imports each subcommand's module by name when it runs
            continue
        allowed = FOUNDATION | ({own} | set(ORDER[: ORDER.index(own)]) if own in ORDER else FOUNDATION)
        wrong += [f"{path.relative_to(REPO)} imports {m}" for m in _imports(path) if _layer(m) not in allowed]
    assert not wrong, "imports against the pipeline order " + " -> ".join(ORDER) + ":\n" + "\n".join(wrong)


def _module_name(path: Path) -> str:
    """trm/study/costs.py -> 'trm.study.costs'; trm/config/__init__.py -> 'trm.config'."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_circle():
    """No module imports, even for type hints or inside a function, one that imports it back (directly or
    through others): the layers' order leaves room for circles within a package, which this closes."""
    names = {_module_name(path): path for path in _modules()}
    graph = {name: {m for m in _imports(path) if m in names and m != name} for name, path in names.items()}
    circles, state = [], {}  # state: 1 while on the DFS path, 2 when done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_every_package_is_placed_in_the_order():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "cli"}
    assert packages == set(ORDER) and modules == FOUNDATION


def test_no_module_is_longer_than_400_lines():
    modules = [
        *_modules(),
        *sorted((REPO / "tests").glob("*.py")),
        *sorted((REPO / "benchmarks").glob("*.py")),
    ]
    long = {
        str(p.relative_to(REPO)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def test_no_test_module_imports_another():
    """Shared test code lives in the support modules and conftest.py, so each test module can be read, run and
    changed on its own."""
    tests = sorted((REPO / "tests").glob("test_*.py"))
    names = {path.stem for path in tests}
    wrong = []
    for path in tests:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported = {node.module.split(".")[0]}
            else:
                continue
            wrong += [f"{path.name} imports {name}" for name in sorted(imported & names)]
    assert not wrong, wrong


RUN_FILES = (
    "config.json",
    "data.json",
    "_SUCCESS",
    "final.json",
    "status.json",
    "launch.json",
    "metrics.jsonl",
    "ckpt",
)


def test_only_the_layout_module_names_the_files_of_a_run_dir():
    layout = PACKAGE / "run" / "layout.py"
    named = []
    for path in _modules():
        if path == layout:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in RUN_FILES:
                named.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    quoted = re.compile("[\"'](" + "|".join(map(re.escape, RUN_FILES)) + ")[\"']")
    for path in [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if quoted.search(line):
                named.append(f"{path.relative_to(REPO)}:{number}")
    assert not named, named


# Libraries only the computing commands need: `trm --help`, `trm COMMAND --help` and the workflow's planning must
# not import them.
HEAVY = ("jax", "flax", "optax", "orbax", "torch", "pandas", "pyarrow", "matplotlib", "gcsfs")
HELP_PROBE = """
import contextlib, io
from trm.cli import COMMANDS, main
for argv in [["--help"], *([name, "--help"] for name in COMMANDS)]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        main(argv)
    assert "usage: trm" in out.getvalue(), argv
"""
# The workflow's Study as Snakemake's controller builds it (workflow/rules/common.smk), every experiment planned and
# priced (JAX's import was 1.2 s of every `snakemake` start).
STUDY_PROBE = """
import yaml
from trm.study.study import Study
config = yaml.safe_load(open("config/config.yaml"))
config.update(results=sys.argv[1] + "/results", storage=sys.argv[1] + "/storage")
study = Study(config, lambda key: "config/config.yaml", "workflow/schemas/config.schema.yaml")
assert len(study.plan) > 67, len(study.plan)
"""


def heavy_imports(probe: str, *args: str) -> list[str]:
    """The HEAVY modules a fresh Python process has imported after running `probe` (with `args` as sys.argv[1:])."""
    import json
    import subprocess
    import sys

    report = "print(json.dumps([name for name in sys.modules if name.split('.')[0] in HEAVY]))"
    script = f"import json, sys\nHEAVY = {HEAVY!r}\n{probe}\n{report}"
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_help_of_every_command_imports_no_heavy_library():
    assert heavy_imports(HELP_PROBE) == []


def test_planning_the_study_imports_no_heavy_library(tmp_path):
    assert heavy_imports(STUDY_PROBE, str(tmp_path)) == []


def test_the_checkouts_files_are_found_one_way(monkeypatch):
    # trm.checkout.checkout_path: the working checkout's file, spelled as given from its root (short paths in
    # messages), in full from anywhere else (the study's settings, groups, experiments and compiled figures).
    from trm.checkout import CHECKOUT, checkout_path

    monkeypatch.chdir(CHECKOUT)
    assert checkout_path("config/groups.yaml") == "config/groups.yaml"
    monkeypatch.chdir(CHECKOUT / "trm")
    assert checkout_path("config/groups.yaml") == str(CHECKOUT / "config" / "groups.yaml")

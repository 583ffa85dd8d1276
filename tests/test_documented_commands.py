"""Every command the documentation shows runs as written, and the documentation points only at files we ship.

Commands are taken from fenced code blocks and inline code of README.md and docs/ (the group guides included),
the comments of the Snakefile, the profiles and config/config.yaml, and every `trm COMMAND --help` text. Each is
checked as far as it can be without a cloud or hours of CPU:
- `trm ...`: parsed by the command's own parser (a missing required flag or a misspelt option fails); the config
  it names (`trm config`, `trm model-info`, `trm train --config FILE --set ...`) is resolved and validated.
- `snakemake ...`: parsed by Snakemake's parser; a run (not a dry run) says how many cores it may use, directly or
  through the TPU profile; its targets are rules; its settings (profile, --configfile, --config) pass the
  workflow's checks and select experiments.
Placeholders (FILE, URL, gs://BUCKET/...) are plain strings to a parser. A synopsis line (`[--opt]`, `...`,
`<args>`, `a|b`) describes a command rather than showing one, and is not run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml
from snakemake.cli import get_argument_parser, parse_config

from trm.cli import COMMANDS, _build_parser
from trm.config import load_config, merged
from trm.study.plan import plan_study
from trm.study.settings import check_settings, load_schema

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
COMMENTED = [REPO / "Snakefile", REPO / "config/config.yaml", *sorted((REPO / "profiles").glob("*/*.yaml"))]
COMMAND = re.compile(r"^(?:\$ )?(?:\.venv/bin/)?((?:trm|snakemake) .*)$")
SYNOPSIS = re.compile(r"(?:^|\s)\[|\.\.\.(?:\s|$)|…|<|\||COMMAND")
RULES = set(re.findall(r"^rule (\w+):", "\n".join(p.read_text() for p in REPO.glob("**/*.smk")), re.M)) | {
    "all"
}


def _commands_in(text: str, code_only: bool) -> list[str]:
    """Command lines of fenced blocks and of inline code (or, for commented files, of comment lines)."""
    text = re.sub(r"\s*\\\n\s*", " ", text)  # a command continued over lines
    found = []
    if code_only:
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            found += block.splitlines()
        found += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    else:
        found += [line.lstrip("# ") for line in text.splitlines() if line.lstrip().startswith("#")]
    return [command for line in found if (command := _command(line))]


def _command(line: str) -> str | None:
    """The command on a line, without a trailing explanation; None for prose or a bare `trm NAME` mention."""
    line = re.split(r"\s{2,}|\s#\s", line.strip())[0]
    match = COMMAND.match(line)
    if not match:
        return None
    words = match.group(1).split()
    return match.group(1) if len(words) > (2 if words[0] == "trm" else 1) else None


def _help_texts() -> dict[str, str]:
    texts = {"trm --help": _build_parser(None).format_help()}
    for name in COMMANDS:
        parser = _build_parser(name)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        texts[f"trm {name} --help"] = sub.choices[name].format_help()
    return texts


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) of every documented command, each command once."""
    found: dict[str, str] = {}
    for path in DOCS:
        for command in _commands_in(path.read_text(), code_only=True):
            found.setdefault(command, str(path.relative_to(REPO)))
    for path in COMMENTED:
        for command in _commands_in(path.read_text(), code_only=False):
            found.setdefault(command, str(path.relative_to(REPO)))
    for where, text in _help_texts().items():
        for line in re.sub(r"\s*\\\n\s*", " ", text).splitlines():
            if command := _command(line):
                found.setdefault(command, where)
    return sorted((where, command) for command, where in found.items() if not SYNOPSIS.search(command))


def _parse_trm(argv: list[str]) -> argparse.Namespace:
    parser = _build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
        try:
            return parser.parse_args(argv)
        except SystemExit as exit:
            if exit.code == 0:  # --help
                return argparse.Namespace(command=None)
            raise AssertionError(errors.getvalue().strip().splitlines()[-1]) from None


def check_trm(argv: list[str]) -> None:
    args = _parse_trm(argv)
    config = getattr(args, "config", None)
    overrides = getattr(args, "overrides", None) or getattr(args, "set", None) or []
    if args.command == "config" and args.experiment:
        name = args.experiment
        path = REPO / (name if "." in name else f"config/experiments/{name}.yaml")
        if path.is_file():  # not a placeholder
            load_config(path, overrides, **({"base": None} if args.resolved else {}))
    elif isinstance(config, str) and (REPO / config).is_file():
        load_config(REPO / config, overrides)


def check_snakemake(argv: list[str]) -> None:
    args = get_argument_parser().parse_args(argv)
    profile_settings: dict = {}
    settings = yaml.safe_load((REPO / "config/config.yaml").read_text())
    files = []
    if args.profile:
        name = args.profile[0] if isinstance(args.profile, list) else args.profile
        profile = REPO / "profiles" / Path(name).name
        profile_settings = yaml.safe_load((profile / "config.yaml").read_text())
        files.append(profile / profile_settings["configfile"])
    files += [REPO / f for f in args.configfile or [] if (REPO / f).is_file()]
    if not args.dryrun and not args.report and not args.unlock and args.cores is None and args.jobs is None:
        assert "cores" in profile_settings, "a run needs --cores N (or a profile that sets cores)"
    assert set(args.targets) <= RULES, f"unknown target(s) {set(args.targets) - RULES}"

    for file in files:
        settings = merged(settings, yaml.safe_load(file.read_text()))
    settings = merged(settings, parse_config(args.config or []))
    schema = load_schema(str(REPO / "workflow/schemas/config.schema.yaml"))
    check_settings(settings, schema, lambda key: "the command")
    assert plan_study(settings["scale"], settings["experiments"], settings["groups"])


COMMANDS_FOUND = documented_commands()


def test_the_documentation_shows_commands_of_every_kind():
    """The extraction finds what a reader sees: a failure here means the patterns above went blind."""
    commands = [command for _, command in COMMANDS_FOUND]
    assert len(commands) > 40
    assert any(c.startswith("snakemake --profile tpu-v4-64") for c in commands)
    assert any(c.startswith("trm config") for c in commands)
    assert any(where.startswith("trm train --help") for where, _ in COMMANDS_FOUND)
    assert any(where.startswith("docs/experiments/") for where, _ in COMMANDS_FOUND)


@pytest.mark.parametrize("where, command", COMMANDS_FOUND, ids=[f"{w}: {c}" for w, c in COMMANDS_FOUND])
def test_documented_command_runs_as_written(where, command):
    argv = shlex.split(command)
    try:
        (check_trm if argv[0] == "trm" else check_snakemake)(argv[1:])
    except Exception as err:  # noqa: BLE001 - any failure is the documentation's
        pytest.fail(f"{where}: `{command}` fails: {err}")


# Files of the spec we worked from, or beside the repository: a user's clone has neither.
OUTSIDE = re.compile(
    r"\.\./shared|spec/|\bspec (?:trm\.md|§)|\btrm\.md\b|\bplatform\.md\b|\bexperiments\.md\b"
)
REPO_PATH = re.compile(r"(?<![\w./-])((?:docs|config|trm|tests|benchmarks|profiles|workflow)/[\w./-]*\w)")


def _shipped_text_files() -> list[Path]:
    suffixes = {".md", ".py", ".yaml", ".smk", ".rst", ".toml", ".json"}
    roots = [REPO / name for name in ("trm", "docs", "config", "profiles", "workflow", "benchmarks", "tests")]
    files = [
        p for root in roots for p in root.rglob("*") if p.suffix in suffixes and "__pycache__" not in p.parts
    ]
    return [*files, REPO / "README.md", REPO / "Snakefile", REPO / "Makefile", REPO / "pyproject.toml"]


def test_documentation_and_code_point_only_at_files_in_the_repository():
    outside, missing = [], []
    for path in _shipped_text_files():
        if path.name == Path(__file__).name:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            if OUTSIDE.search(line):
                outside.append(f"{where}: {line.strip()}")
            for ref in REPO_PATH.findall(line) if path.parent.name != "tests" else []:  # tests make files
                if re.search(r"[<{*]|\.\.\.|\b[A-Z]{2,}\b", ref):  # a placeholder: <id>, {group}, ID, NAME
                    continue
                if not (REPO / ref).exists() and not (REPO / ref.rstrip(".")).exists():
                    missing.append(f"{where}: {ref}")
    assert not outside, "references to files outside the repository:\n" + "\n".join(outside)
    assert not missing, "references to files that do not exist:\n" + "\n".join(missing)

"""The `trm` command: one program, one subcommand per stage.

Each subcommand lives in its own module, which defines `add_arguments(parser)` and `main(args) -> int`.
Modules are imported only when their subcommand runs, so `trm --help` stays fast (no JAX import).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from trm.checkout import foreign_checkout_note
from trm.errors import UserError, system_refusal
from trm.platform import choose_platform

# name -> (module, one-line help), in pipeline order. The module's docstring is the subcommand's long description.
COMMANDS: dict[str, tuple[str, str]] = {
    "build-dataset": ("trm.data.build", "Build the augmented Sudoku dataset (train/test .npy files)."),
    "dataset-info": ("trm.data.info", "Print counts, shapes, dtypes and the content hash of a dataset."),
    "stage": ("trm.data.stage", "Copy a dataset to storage (gs:// or file://) with a checksum manifest."),
    "verify": ("trm.data.verify", "Check a staged dataset against its manifest."),
    "smoke-pool": ("trm.data.pool", "Write generated puzzles as train.csv/test.csv (smoke source)."),
    "config": (
        "trm.study.config_command",
        "Resolve, validate and print a run config (base <- experiment <- --set).",
    ),
    "model-info": ("trm.model.info", "Print the parameter count and FLOPs of a model configuration."),
    "train": (
        "trm.train.train_command",
        "Train a TRM on a staged dataset, resuming from the latest checkpoint.",
    ),
    "evaluate": (
        "trm.train.evaluate_checkpoint",
        "Evaluate a checkpoint at several test-time step counts (JSON, CSV).",
    ),
    "import-torch": ("trm.train.import_torch", "Import an original PyTorch TRM checkpoint as a run dir."),
    "export-torch": ("trm.train.export_torch", "Export a run dir's model as an original PyTorch state_dict."),
    "launch": (
        "trm.launch.launch_command",
        "Run `trm train` on every host of a job (local processes or a TPU slice).",
    ),
    "preflight": (
        "trm.launch.preflight",
        "Check gcloud, credentials, bucket, TPU API, slices, ssh for a TPU study.",
    ),
    "compile-check": (
        "trm.launch.compile_check",
        "Compile experiments' train and eval steps for a TPU slice: HBM per chip, step time, MFU.",
    ),
    "canary": (
        "trm.study.canary",
        "A few minutes on this machine's devices before a study: kernel, loss, replicas, checkpoint, step time.",
    ),
    "guides": ("trm.study.guides", "Write the study guides (docs/experiments/) from config/groups.yaml."),
    "status": ("trm.study.status", "Show every run in storage: state, progress, accuracy, time to finish."),
    "summarize": (
        "trm.analysis.summary",
        "Summarise a finished run from its run dir as one local JSON file.",
    ),
    "aggregate": (
        "trm.analysis.aggregate",
        "Gather all runs of the study into one table, with their curves (CSV files).",
    ),
    "plot-group": ("trm.analysis.plots", "Plot one experiment group's main plots (PNG and SVG)."),
    "verdicts": ("trm.analysis.verdicts", "Evaluate each group's success criteria on the results table."),
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose refusal of an argument is one line, as every other error of `trm`: the usage it
    would print first is in `--help`."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _build_parser(selected: str | None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trm",
        description="Tiny Recursive Model scaling study: data, training and evaluation.",
        epilog="Run 'trm COMMAND --help' for the options of one command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        if name == selected:
            module = importlib.import_module(module_name)
            p = sub.add_parser(
                name,
                help=help_text,
                description=(module.__doc__ or help_text).strip(),
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
            module.add_arguments(p)
            p.set_defaults(_main=module.main)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in argv if not a.startswith("-")), None)
    parser = _build_parser(selected if selected in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, or a refused argument (said in one line): its exit code
        return done.code if isinstance(done.code, int) else 0
    if args.command is None:
        parser.print_help()
        return 2
    choose_platform()  # before any JAX import: no libtpu probing on a machine without a TPU
    note = foreign_checkout_note()
    if note:
        print(f"trm {args.command}: {note}", file=sys.stderr)
    try:
        return int(args._main(args) or 0)
    except UserError as err:
        print(f"trm {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except OSError as err:
        line = system_refusal(err)
        if line is None:
            raise
        print(f"trm {args.command}: error: {line}", file=sys.stderr)
        return UserError.exit_code
    except KeyboardInterrupt:
        print(f"trm {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Load, merge and validate run configurations: base.yaml <- experiment file <- `--set key.path=value` overrides.

The layers are checked against the schema (trm/config/schema.py) with nothing required; the merged result must be
complete and pass the cross-field rules (trm/config/checks.py). Every error is a `UserError` naming the file (or
`--set`) and the dotted key. A command resolves its `--config` and `--set` once (`resolve_config_arguments`); what it
writes, a run dir's config.json, is the resolved file every later step reads.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from trm import storage
from trm.checkout import CHECKOUT
from trm.config.checks import impossible_values
from trm.config.schema import (
    check_document,
    floats_where_numbers,
    full_schema,
    got,
    leaves,
    missing_keys,
    partial_schema,
    raise_if,
)
from trm.errors import UserError

CONFIG_DIR = CHECKOUT / "config"  # of the current directory's checkout (trm/checkout.py)
BASE_CONFIG = CONFIG_DIR / "base.yaml"
EXPERIMENTS_DIR = CONFIG_DIR / "experiments"
# Experiment ids become file names, run names, GCS paths and shell arguments.
EXPERIMENT_ID = re.compile(r"^[a-z0-9_]+$")


# ------------------------------------------------------------------------------------------------------- YAML


# libyaml's parser when PyYAML has it (about 10x faster: the plan reads ~140 YAML files per dry run).
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeLoader):
    """SafeLoader that reads 1e-4 as a float (YAML 1.2; PyYAML reads it as a string) and rejects duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def _parse_yaml(text: str | IO[str], source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        raise UserError(f"{source}: not valid YAML: {err}") from None


def read_mapping(path: str | Path, what: str = "config file") -> dict:
    """Read a YAML (or JSON) mapping from a path or storage URL; an empty document is an empty mapping. Errors
    name the file (`what`: what it is), the line of a YAML error, and what was expected."""
    path = str(path)
    try:
        if "://" in path:  # a resolved config in storage, e.g. a run dir's config.json
            text = storage.read_text(path)
            doc = json.loads(text) if path.endswith(".json") else _parse_yaml(text, path)
        else:
            with open(path) as stream:  # a stream, so YAML error marks name the file
                doc = json.load(stream) if path.endswith(".json") else _parse_yaml(stream, path)
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON: {err}") from None
    except UnicodeDecodeError as err:
        raise UserError(
            f"{path}: not a text file (byte {err.start} is not UTF-8); expected YAML or JSON"
        ) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a mapping of keys ({what}) at the top level, got {got(doc)}")
    return doc


# ---------------------------------------------------------------------------------------------------- merging


def _merge(into: dict, overrides: dict, source: str, origin: dict[str, str]) -> None:
    """Deep-merge `overrides` into `into` in place, recording which source set each leaf."""

    def merge(target: dict, doc: dict, prefix: str) -> None:
        for key, value in doc.items():
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                merge(target[key], value, f"{prefix}{key}.")
            else:
                target[key] = copy.deepcopy(value)
                for leaf in leaves(value, f"{prefix}{key}."):
                    origin[leaf] = source

    merge(into, overrides, "")


def merged(into: dict, over: dict) -> dict:
    """`over` merged into a copy of `into`, mappings key by key (as Snakemake merges its config files): the one
    deep merge of settings, for run configs (`_merge`, which also records origins) and workflow settings."""
    result = copy.deepcopy(into)
    _merge(result, over, "", {})
    return result


def parse_set(item: str) -> dict:
    """Parse one `key.path=value` override into a nested mapping; the value is a YAML scalar or list."""
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise UserError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. optim.lr=3e-4")
    value = _parse_yaml(text, f"--set {item}")
    for part in reversed(parts):
        value = {part: value}
    return value


# ----------------------------------------------------------------------------------------------------- public


def validate_config(
    config: dict, source: str = "config", origin: dict[str, str] | None = None, base: str | None = None
) -> dict:
    """Check that `config` is a complete, possible config; return it with numbers normalised to floats.

    `origin` maps each dotted key to the source that set it; `base` names the base layer among them.
    """
    full = full_schema()
    config = with_added_keys(config)
    check_document(config, source, full)
    config = floats_where_numbers(config, full)
    raise_if(impossible_values(config, origin or dict.fromkeys(leaves(config), source), base))
    return config


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    base: str | Path | None = BASE_CONFIG,
) -> dict:
    """Resolve a run config: `base` <- experiment file `path` <- `--set` overrides, validated.

    With `base=None`, `path` is a complete, resolved config (e.g. the config.json of a run directory, a local path
    or a storage URL, so a TPU host needs no repository) and is validated as such.
    """
    if base is None:
        if path is None:
            raise UserError("no config given: pass an experiment file, or a resolved config with base=None")
        foundation = str(path)
        config = with_added_keys(read_mapping(foundation))
        _check_complete(config, foundation)
        layers = []
    else:
        foundation = str(base)
        if not Path(foundation).exists():
            raise UserError(
                f"base config {foundation} not found; on a host without the repository, "
                "load the resolved config written to the run directory instead (base=None)"
            )
        config = read_mapping(foundation)
        layers = [] if path is None else [(str(path), read_mapping(path))]
    layers += [(f"--set {item}", parse_set(item)) for item in overrides]

    partial = partial_schema()
    check_document(config, foundation, partial)
    origin = dict.fromkeys(leaves(config), foundation)
    for source, doc in layers:
        check_document(doc, source, partial)
        _merge(config, doc, source, origin)
    return validate_config(config, foundation, origin, base=None if base is None else foundation)


def _check_complete(config: dict, source: str) -> None:
    """A file read as a resolved config must hold every key: one line (the first few missing keys) for one that
    does not, typically an experiment file, instead of one line per missing key."""
    missing = missing_keys(config, full_schema())
    if missing:
        shown = ", ".join(f"'{key}'" for key in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise UserError(
            f"{source}: not a resolved config (missing {shown}{more}); an experiment file is resolved over "
            "config/base.yaml: `trm config FILE` without --resolved, or --config FILE.yaml"
        )


def dump_config(config: dict) -> str:
    """Canonical text of a resolved config: JSON with sorted keys (readable back with `load_config(p, base=None)`)."""
    return json.dumps(config, sort_keys=True, indent=2, allow_nan=False) + "\n"


# Keys added to config/base.yaml after runs had been trained without them, each with its neutral value: the value
# that does what the code did before the key existed. At that value a key is left out of what names a run
# (`config_hash`) and a compiled step (trm/launch/accelerators.py `step_config`): adding a key must not rename
# every run dir, which would train every finished run of a study again. Any other value is hashed (it changes
# the run's numbers). A resolved config written before a key existed (an older run dir's config.json) reads it
# as its neutral value. docs/configuration.md, "Keys added later", says the same for users.
ADDED_KEYS: dict[str, Any] = {
    # The fused MLP-T kernel: auto is what every run did before (fused on TPU where it applies).
    "arch.mlp_t_kernel": "auto",
    # The evaluation batch: null is what every run did before (the training batch).
    "train.eval_batch_size": None,
}


def _parent(config: dict, dotted: str) -> tuple[dict | None, str]:
    """The mapping that holds dotted key `dotted` in `config` (None where a section is missing) and its leaf."""
    *path, leaf = dotted.split(".")
    for key in path:
        config = config.get(key) if isinstance(config, dict) else None
    return (config if isinstance(config, dict) else None), leaf


def hashed_form(config: dict) -> dict:
    """`config` without the ADDED_KEYS that hold their neutral value: the part of it that names a run (a copy)."""
    form = copy.deepcopy(config)
    for dotted, neutral in ADDED_KEYS.items():
        section, leaf = _parent(form, dotted)
        if section is not None and leaf in section and section[leaf] == neutral:
            del section[leaf]
    return form


def with_added_keys(config: dict) -> dict:
    """A resolved config (a copy) with each of the ADDED_KEYS it lacks at its neutral value: how a config written
    before a key existed is read."""
    config = copy.deepcopy(config)
    for dotted, neutral in ADDED_KEYS.items():
        section, leaf = _parent(config, dotted)
        if section is not None:
            section.setdefault(leaf, neutral)
    return config


def config_hash(config: dict) -> str:
    """First 12 hex digits of the sha256 of the compact, key-sorted JSON of `config` (its `hashed_form`); run names
    derive from it."""
    text = json.dumps(hashed_form(config), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def experiment_ids(directory: str | Path = EXPERIMENTS_DIR) -> list[str]:
    """Sorted ids of the experiment files `<id>.yaml` in `directory`; any other file name is an error."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"{directory}: experiments directory not found")
    ids, bad = [], []
    for file in sorted(directory.iterdir()):
        if file.suffix != ".yaml" or not EXPERIMENT_ID.match(file.stem):
            bad.append(file.name)
        else:
            ids.append(file.stem)
    if bad:
        raise UserError(
            f"{directory}: file names must be <id>.yaml with id matching {EXPERIMENT_ID.pattern}: {', '.join(bad)}"
        )
    return ids


def experiment_path(exp_id: str, directory: str | Path = EXPERIMENTS_DIR) -> Path:
    """The file of experiment `exp_id`, which must exist."""
    if not EXPERIMENT_ID.match(exp_id):
        raise UserError(f"invalid experiment id {exp_id!r}: ids match {EXPERIMENT_ID.pattern}")
    path = Path(directory) / f"{exp_id}.yaml"
    if not path.exists():
        close = difflib.get_close_matches(exp_id, experiment_ids(directory), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UserError(f"unknown experiment {exp_id!r}: {path} not found{hint}")
    return path


# ---------------------------------------------------------------------------------------------- command line


def add_config_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """`--config FILE` and `--set KEY.PATH=VALUE`, the run config of a command (read by `resolve_config_arguments`)."""
    parser.add_argument(
        "--config",
        required=required,
        help="experiment YAML (its overrides of config/base.yaml) or a resolved config .json (a path or URL, "
        "e.g. a run dir's config.json)",
    )
    add_overrides_argument(parser)


def add_overrides_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override one key (repeatable), e.g. --set optim.lr=3e-4",
    )


def resolve_config_arguments(args: argparse.Namespace) -> dict:
    """The config of `--config` and `--set`: a .json file is a resolved config, anything else an experiment file
    over config/base.yaml (none: the baseline alone); `--set` applies last in both cases."""
    resolved = args.config is not None and str(args.config).endswith(".json")
    return load_config(args.config, args.overrides, base=None if resolved else BASE_CONFIG)

"""Load, merge and validate run configurations: base.yaml <- experiment file <- `--set key.path=value` overrides.

One JSON Schema (schema.json) describes a full, resolved config. Experiment files and `--set` overrides are checked
against the same schema with nothing required; the merged result must then be complete and pass the cross-field
checks in `_impossible_values`. Every error is a `UserError` naming the file (or `--set`) and the dotted key.
"""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import jsonschema
import yaml

from trm.errors import UserError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
BASE_CONFIG = CONFIG_DIR / "base.yaml"
EXPERIMENTS_DIR = CONFIG_DIR / "experiments"
SCHEMA_PATH = Path(__file__).with_name("schema.json")
# Experiment ids become file names, run names, GCS paths and shell arguments.
EXPERIMENT_ID = re.compile(r"^[a-z0-9_]+$")


# ----------------------------------------------------------------------------------------------------- schema


@functools.cache
def _schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def schema() -> dict:
    """The JSON Schema of a full, resolved config (a fresh copy)."""
    return copy.deepcopy(_schema())


def _without_required(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_required(v) for k, v in node.items() if k != "required"}
    return node


@functools.cache
def _override_schema() -> dict:
    return _without_required(_schema())


def override_schema() -> dict:
    """The schema of an experiment file or `--set` override: the full schema with nothing required."""
    return copy.deepcopy(_override_schema())


def _is_integer(_checker: Any, instance: Any) -> bool:
    # JSON Schema counts 512.0 as an integer; a shape or a step count must be a real int.
    return isinstance(instance, int) and not isinstance(instance, bool)


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


# ------------------------------------------------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
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


def _read_document(path: Path) -> dict:
    """Read a YAML (or JSON) mapping; an empty document means no overrides."""
    try:
        with open(path) as stream:  # a stream, so YAML error marks name the file
            doc = json.load(stream) if path.suffix == ".json" else _parse_yaml(stream, str(path))
    except FileNotFoundError:
        raise UserError(f"{path}: config file not found") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON: {err}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a mapping of config keys at the top level, got {_got(doc)}")
    return doc


# --------------------------------------------------------------------------------------------------- checking


def _text(value: Any) -> str:
    """A value as the user wrote it in YAML: true, null, 'text'."""
    return repr(value) if isinstance(value, str) else json.dumps(value, default=repr)


def _got(value: Any) -> str:
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "mapping", list: "list"}
    kind = "null" if value is None else kinds.get(type(value), type(value).__name__)
    return f"{_text(value)} ({kind})"


def expected_values(node: dict) -> str:
    """Describe in words what a schema node accepts, e.g. 'an integer >= 1 or null'."""
    if "properties" in node:
        return f"a mapping with keys {', '.join(node['properties'])}"
    if "enum" in node:
        values = [v if isinstance(v, str) else json.dumps(v) for v in node["enum"]]
        return f"only {values[0]}" if len(values) == 1 else "one of " + ", ".join(values)
    types = node["type"] if isinstance(node["type"], list) else [node["type"]]
    bounds = [
        f"{op} {node[word]}"
        for word, op in [
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        ]
        if word in node
    ]
    names = {"integer": "an integer", "number": "a number", "boolean": "true or false", "null": "null"}
    words = [
        names[t] + (" " + " and ".join(bounds) if bounds and t in ("integer", "number") else "")
        for t in types
    ]
    return " or ".join(words)


def _unknown_key_errors(doc: Any, node: dict, source: str, prefix: str = "") -> list[str]:
    """Keys of `doc` that the schema does not know, with the allowed keys at that level."""
    if not isinstance(doc, dict) or "properties" not in node:
        return []  # a type mismatch; the schema validator reports it
    allowed = node["properties"]
    errors = []
    for key, value in doc.items():
        dotted = f"{prefix}{key}"
        if key in allowed:
            errors += _unknown_key_errors(value, allowed[key], source, dotted + ".")
            continue
        close = difflib.get_close_matches(str(key), list(allowed), n=1)
        hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
        level = f"in '{prefix[:-1]}'" if prefix else "at the top level"
        errors.append(f"{source}: unknown key '{dotted}'{hint}; allowed keys {level}: {', '.join(allowed)}")
    return errors


def _schema_errors(doc: dict, node: dict, source: str) -> list[str]:
    """Type, range, enum and missing-key errors of `doc` (unknown keys are left to `_unknown_key_errors`)."""
    errors = []
    for err in sorted(_Validator(node).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        dotted = ".".join(map(str, err.absolute_path))
        if err.validator == "additionalProperties":
            continue
        if err.validator == "required":
            prefix = dotted + "." if dotted else ""
            missing = [k for k in err.validator_value if k not in err.instance]
            errors += [f"{source}: missing key '{prefix}{k}'" for k in missing]
            continue
        errors.append(
            f"{source}: {dotted or 'the config'}: expected {expected_values(err.schema)}, got {_got(err.instance)}"
        )
    return errors


def _raise_if(errors: list[str]) -> None:
    if len(errors) == 1:
        raise UserError(errors[0])
    if errors:
        raise UserError(f"{len(errors)} problems in the configuration:\n  " + "\n  ".join(errors))


def _check_document(doc: dict, source: str, node: dict) -> None:
    _raise_if(_unknown_key_errors(doc, node, source) or _schema_errors(doc, node, source))


def _get(config: dict, dotted: str) -> Any:
    for key in dotted.split("."):
        config = config[key]
    return config


def _impossible_values(config: dict, origin: dict[str, str], base: str | None = None) -> list[str]:
    """Cross-field checks the schema cannot express; each message names the keys and where they were set.

    `base` is the source name of the base layer when the config was merged from layers (None for a resolved
    config): a key inherited from it may belong to a setting a later layer changed.
    """

    def ref(key: str) -> str:
        return f"{key} = {_text(_get(config, key))} (from {origin.get(key, '?')})"

    def value(key: str) -> Any:
        return _get(config, key)

    errors = []
    if value("arch.hidden_size") % value("arch.num_heads"):
        errors.append(f"{ref('arch.hidden_size')} must be divisible by {ref('arch.num_heads')}")
    elif not value("arch.mlp_t") and value("arch.pos_encodings") == "rope":
        if (value("arch.hidden_size") // value("arch.num_heads")) % 2:
            errors.append(
                f"rotary encoding needs an even head_dim: {ref('arch.hidden_size')} / {ref('arch.num_heads')} is odd"
            )
    # The base's `none` goes with its MLP-T recipe: a later layer that turns MLP-T off must say which encoding
    # its attention uses (without positions, attention cannot tell the cells apart).
    if (
        base is not None
        and not value("arch.mlp_t")
        and value("arch.pos_encodings") == "none"
        and origin.get("arch.mlp_t") != base
        and origin.get("arch.pos_encodings") == base
    ):
        errors.append(
            f"{ref('arch.mlp_t')} selects attention, but {ref('arch.pos_encodings')} belongs to the base's MLP-T "
            "recipe: set arch.pos_encodings beside arch.mlp_t (rope, as the original's attention TRM; none or "
            "learned only on purpose)"
        )
    emb_ndim = value("arch.puzzle_emb_ndim") or value("arch.hidden_size")
    # puzzle_emb_len 0 means just enough positions, which always fits.
    if 0 < value("arch.puzzle_emb_len") * value("arch.hidden_size") < emb_ndim:
        errors.append(
            f"the puzzle embedding ({ref('arch.puzzle_emb_ndim')}) must fit in "
            f"{ref('arch.puzzle_emb_len')} positions of {ref('arch.hidden_size')}"
        )
    if value("train.global_batch_size") % value("train.micro_batches"):
        errors.append(f"{ref('train.global_batch_size')} must be divisible by {ref('train.micro_batches')}")
    if value("train.epochs") % value("train.eval_interval"):
        errors.append(f"{ref('train.eval_interval')} must divide {ref('train.epochs')}")
    if value("schedules.curriculum.enabled"):
        for short in ("H_cycles", "L_cycles"):
            if value(f"schedules.curriculum.start_{short}") > value(f"arch.{short}"):
                errors.append(
                    f"{ref(f'schedules.curriculum.start_{short}')} must be <= {ref(f'arch.{short}')}"
                )
        if value("schedules.curriculum.epochs") > value("train.epochs"):
            errors.append(f"{ref('schedules.curriculum.epochs')} must be <= {ref('train.epochs')}")
    return errors


def _floats_where_numbers(config: Any, node: dict) -> Any:
    """Turn ints into floats where the schema says `number`, so `lr: 1` and `lr: 1.0` resolve (and hash) alike."""
    if "properties" in node:
        return {k: _floats_where_numbers(v, node["properties"][k]) for k, v in config.items()}
    if node.get("type") == "number" and isinstance(config, int) and not isinstance(config, bool):
        return float(config)
    return config


# ---------------------------------------------------------------------------------------------------- merging


def _leaves(doc: Any, prefix: str = "") -> Iterable[str]:
    if not isinstance(doc, dict):
        yield prefix[:-1]
        return
    for key, value in doc.items():
        yield from _leaves(value, f"{prefix}{key}.")


def _merge(into: dict, overrides: dict, source: str, origin: dict[str, str]) -> None:
    """Deep-merge `overrides` into `into` in place, recording which source set each leaf."""

    def merge(target: dict, doc: dict, prefix: str) -> None:
        for key, value in doc.items():
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                merge(target[key], value, f"{prefix}{key}.")
            else:
                target[key] = copy.deepcopy(value)
                for leaf in _leaves(value, f"{prefix}{key}."):
                    origin[leaf] = source

    merge(into, overrides, "")


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
    full = _schema()
    _check_document(config, source, full)
    config = _floats_where_numbers(config, full)
    _raise_if(_impossible_values(config, origin or dict.fromkeys(_leaves(config), source), base))
    return config


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    base: str | Path | None = BASE_CONFIG,
) -> dict:
    """Resolve a run config: `base` <- experiment file `path` <- `--set` overrides, validated.

    With `base=None`, `path` is a complete, resolved config (e.g. the config.json written to a run directory, so a
    TPU host needs no repository) and is validated as such.
    """
    if base is None:
        if path is None:
            raise UserError("no config given: pass an experiment file, or a resolved config with base=None")
        foundation = Path(path)
        config = _read_document(foundation)
        layers = []
    else:
        foundation = Path(base)
        if not foundation.exists():
            raise UserError(
                f"base config {foundation} not found; on a host without the repository, "
                "load the resolved config written to the run directory instead (base=None)"
            )
        config = _read_document(foundation)
        layers = [] if path is None else [(str(path), _read_document(Path(path)))]
    layers += [(f"--set {item}", parse_set(item)) for item in overrides]

    partial = _override_schema()
    _check_document(config, str(foundation), partial)
    origin = dict.fromkeys(_leaves(config), str(foundation))
    for source, doc in layers:
        _check_document(doc, source, partial)
        _merge(config, doc, source, origin)
    return validate_config(config, str(foundation), origin, base=None if base is None else str(foundation))


def dump_config(config: dict) -> str:
    """Canonical text of a resolved config: JSON with sorted keys (readable back with `load_config(p, base=None)`)."""
    return json.dumps(config, sort_keys=True, indent=2, allow_nan=False) + "\n"


def config_hash(config: dict) -> str:
    """First 12 hex digits of the sha256 of the compact, key-sorted JSON of `config`; run names derive from it."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False)
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

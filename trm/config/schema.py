"""The config schema (schema.json) and the messages of its checks: every error names its source and dotted key.

One JSON Schema describes a full, resolved config. Experiment files and `--set` overrides are checked against the
same schema with nothing required (`override_schema`).
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema

from trm.errors import UserError

SCHEMA_PATH = Path(__file__).with_name("schema.json")


@functools.cache
def full_schema() -> dict:
    """The JSON Schema of a full, resolved config (shared: do not modify; `schema()` gives a copy)."""
    return json.loads(SCHEMA_PATH.read_text())


def _without_required(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_required(v) for k, v in node.items() if k != "required"}
    return node


@functools.cache
def partial_schema() -> dict:
    """The schema of an experiment file or `--set` override: the full schema with nothing required (shared)."""
    return _without_required(full_schema())


def schema() -> dict:
    """The JSON Schema of a full, resolved config (a fresh copy)."""
    return copy.deepcopy(full_schema())


def override_schema() -> dict:
    """`partial_schema()` as a fresh copy."""
    return copy.deepcopy(partial_schema())


def _is_integer(_checker: Any, instance: Any) -> bool:
    # JSON Schema counts 512.0 as an integer; a shape or a step count must be a real int.
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_number(_checker: Any, instance: Any) -> bool:
    # YAML's .nan and .inf are floats that pass every bound (nan > 0 is false, and so is nan <= 0): no setting
    # means them, and a config holding one could not be written as JSON.
    return isinstance(instance, int | float) and not isinstance(instance, bool) and math.isfinite(instance)


# The validator of this project's schemas (the config's here, the workflow settings' in trm/study/settings.py).
Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _is_integer, "number": _is_number}
    ),
)


def text(value: Any) -> str:
    """A value as the user wrote it in YAML: true, null, 'text', .nan."""
    if isinstance(value, float) and not math.isfinite(value):
        return {math.inf: ".inf", -math.inf: "-.inf"}.get(value, ".nan")
    return repr(value) if isinstance(value, str) else json.dumps(value, default=repr)


def got(value: Any) -> str:
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "mapping", list: "list"}
    kind = "null" if value is None else kinds.get(type(value), type(value).__name__)
    if isinstance(value, float) and not math.isfinite(value):
        kind = "not a finite number"
    return f"{text(value)} ({kind})"


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
    for err in sorted(Validator(node).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        dotted = ".".join(map(str, err.absolute_path))
        if err.validator == "additionalProperties":
            continue
        if err.validator == "required":
            prefix = dotted + "." if dotted else ""
            missing = [k for k in err.validator_value if k not in err.instance]
            errors += [f"{source}: missing key '{prefix}{k}'" for k in missing]
            continue
        errors.append(
            f"{source}: {dotted or 'the config'}: expected {expected_values(err.schema)}, got {got(err.instance)}"
        )
    # jsonschema reports one `required` error per missing key, each listing every missing key of its mapping.
    return list(dict.fromkeys(errors))


def missing_keys(doc: Any, node: dict, prefix: str = "") -> list[str]:
    """Dotted keys that `node` requires and `doc` lacks (a missing mapping counts once, not per leaf)."""
    if not isinstance(doc, dict) or "properties" not in node:
        return []
    missing = []
    for key, child in node["properties"].items():
        if key not in doc:
            if key in node.get("required", ()):
                missing.append(prefix + key)
        else:
            missing += missing_keys(doc[key], child, f"{prefix}{key}.")
    return missing


def raise_if(errors: list[str]) -> None:
    if len(errors) == 1:
        raise UserError(errors[0])
    if errors:
        raise UserError(f"{len(errors)} problems in the configuration:\n  " + "\n  ".join(errors))


def check_document(doc: dict, source: str, node: dict) -> None:
    raise_if(_unknown_key_errors(doc, node, source) or _schema_errors(doc, node, source))


def floats_where_numbers(config: Any, node: dict) -> Any:
    """Turn ints into floats where the schema says `number`, so `lr: 1` and `lr: 1.0` resolve (and hash) alike."""
    if "properties" in node:
        return {k: floats_where_numbers(v, node["properties"][k]) for k, v in config.items()}
    if node.get("type") == "number" and isinstance(config, int) and not isinstance(config, bool):
        return float(config)
    return config


def leaves(doc: Any, prefix: str = "") -> Iterable[str]:
    if not isinstance(doc, dict):
        yield prefix[:-1]
        return
    for key, value in doc.items():
        yield from leaves(value, f"{prefix}{key}.")

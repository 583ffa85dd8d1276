"""The workflow's settings (config/config.yaml, a profile's study file, `--config`): typed, checked, one-line errors.

`snakemake --config` takes only top-level keys (`--config launch.hosts=2` is refused by Snakemake itself, before
the workflow runs); a nested setting is given as a YAML mapping, `--config 'launch={hosts: 2}'`, merged into the
file's values, or in a file given with `--configfile`. Snakemake reads the values inside such a mapping as
strings, so `coerce` converts them to the schema's type; a list may be written `a,b` as well as `[a, b]`.
Errors name the setting, where its value came from and what is allowed, in one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jsonschema
import yaml

from trm.config import config_value
from trm.config.schema import Validator, text
from trm.errors import UserError

# Where a setting's value came from ("--config", a file), for error messages: `source_of("launch.hosts")`.
SourceOf = Callable[[str], str]


def load_schema(path: str) -> dict:
    with open(path) as stream:
        return yaml.safe_load(stream)


def check_settings(settings: dict, schema: dict, source_of: SourceOf) -> None:
    """Refuse unknown keys and values of the wrong type (converting strings from `--config` first), in place."""
    _check_keys(settings, schema, "", source_of)
    coerce(settings, schema)
    error = jsonschema.exceptions.best_match(Validator(schema).iter_errors(settings))
    if error is not None:
        dotted = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
        )[1:]
        top = ".".join(str(part) for part in error.absolute_path if isinstance(part, str))
        raise UserError(
            f"{source_of(top)}: setting '{dotted}' = {text(error.instance)} is not valid: "
            f"{_expected(error)} (every setting: docs/configuration.md)"
        )


def coerce(settings: dict, schema: dict) -> None:
    """Convert string values to the schema's type where the string reads as one (`--config` nested values)."""
    for key, value in settings.items():
        spec = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
        if not isinstance(spec, dict):
            continue
        if isinstance(value, dict):
            coerce(value, spec)
        elif isinstance(value, str):
            settings[key] = _typed(value, spec)
        elif isinstance(value, list):
            item_spec = _array_spec(spec).get("items", {})
            settings[key] = [_typed(item, item_spec) if isinstance(item, str) else item for item in value]


def _typed(text: str, spec: dict) -> Any:
    if _accepts(spec, "string", text):
        return text
    array = _array_spec(spec)
    if array:  # "exp01a" or "exp01a,exp01b": a list
        items = [item.strip() for item in text.strip("[]").split(",") if item.strip()]
        return [_typed(item, array.get("items", {})) for item in items]
    value = yaml.safe_load(text) if text.strip() else text
    if (
        _accepts(spec, "boolean", value)
        or _accepts(spec, "null", value)
        or _accepts(spec, "integer", value)
        or _accepts(spec, "number", value)
    ):
        return value
    return text


def _accepts(spec: dict, kind: str, value: Any) -> bool:
    """Whether `spec` (or one of its `oneOf` branches) is of JSON type `kind` and takes `value`'s Python type."""
    branches = spec.get("oneOf", [spec])
    python = {"string": str, "boolean": bool, "null": type(None), "integer": int, "number": (int, float)}[
        kind
    ]
    if kind != "boolean" and isinstance(value, bool):
        return False
    for branch in branches:
        if branch.get("const") == value or value in branch.get("enum", []):
            return True
        if branch.get("type") == kind and isinstance(value, python):
            return True
    return False


def _array_spec(spec: dict) -> dict:
    return next((branch for branch in spec.get("oneOf", [spec]) if branch.get("type") == "array"), {})


def _expected(error: jsonschema.ValidationError) -> str:
    """What the failing setting accepts, from its schema, in words."""
    spec, rule = error.schema, error.validator
    if rule in ("oneOf", "anyOf"):
        return "expected " + " or ".join(f"'{b['const']}'" if "const" in b else _kind(b) for b in spec[rule])
    words = {
        "type": lambda: f"expected {_kind(spec)}",
        "enum": lambda: "expected one of " + ", ".join(map(str, spec["enum"])),
        "minimum": lambda: f"expected at least {spec['minimum']}",
        "exclusiveMinimum": lambda: f"expected more than {spec['exclusiveMinimum']}",
        "maximum": lambda: f"expected at most {spec['maximum']}",
        "minItems": lambda: f"expected at least {spec['minItems']} item(s)",
        "pattern": lambda: f"expected a name matching {spec['pattern']}",
    }
    return words[rule]() if rule in words else error.message


def _kind(spec: dict) -> str:
    if spec.get("type") == "array":
        item = spec.get("items", {})
        return f"a list of {item.get('type', 'value')}s, e.g. [a, b] or a,b"
    kind = spec.get("type", "value")
    if kind == "number":
        return "a finite number"  # not .nan or .inf
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _check_keys(settings: dict, schema: dict, where: str, source_of: SourceOf) -> None:
    """Name a misspelt setting, where it was set and the allowed ones (jsonschema only says 'was unexpected')."""
    allowed = schema.get("properties", {})
    for key, value in settings.items():
        if key not in allowed:
            raise UserError(
                f"{source_of(where + key)}: unknown key '{where}{key}'; allowed keys: {', '.join(allowed)}"
            )
        if isinstance(value, dict) and "properties" in allowed[key]:
            _check_keys(value, allowed[key], f"{where}{key}.", source_of)


def setting_source(dotted: str, command_line: dict, config_files: list[str], default: str) -> str:
    """Where the workflow setting `dotted` gets its value: `--config` (`command_line`), the last of
    `config_files` (`--configfile`, e.g. a profile's study file) that sets it, or the `default` file."""

    def holds(tree: Any) -> bool:
        try:
            config_value(tree, dotted)
        except (KeyError, TypeError):
            return False
        return True

    if holds(command_line):
        return "--config"
    for path in reversed(config_files):
        with open(path) as stream:
            if holds(yaml.safe_load(stream)):
                return os.path.relpath(path)
    return default

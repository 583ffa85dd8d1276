"""The configuration system: schema, merging, validation messages, --set, hashing, `trm config`. The experiment
files and their groups: test_experiments.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from trm.config import (
    BASE_CONFIG,
    CONFIG_DIR,
    SCHEMA_PATH,
    config_hash,
    dump_config,
    experiment_ids,
    experiment_path,
    load_config,
    parse_set,
    schema,
    validate_config,
)
from trm.errors import UserError
from trm.study.config_docs import CONFIG_DOCS_PATH, config_docs_markdown
from trm.study.groups import config_keys


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------------------- baseline and schema


def test_base_is_complete_and_the_only_source_of_defaults(base_config):
    assert validate_config(yaml.safe_load(BASE_CONFIG.read_text()), "base") == base_config
    assert base_config["arch"]["expansion"] == 4.0 and isinstance(base_config["arch"]["expansion"], float)
    # Defaults live in config/base.yaml (runs) and config/config.yaml (the workflow): the schemas only check.
    workflow_schema = CONFIG_DIR.parent / "workflow" / "schemas" / "config.schema.yaml"
    for text in (SCHEMA_PATH.read_text(), workflow_schema.read_text()):
        assert '"default"' not in text and "default:" not in text


def test_snakemake_validate_accepts_base_and_rejects_unknown_key(base_config):
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    assert schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    validate(copy.deepcopy(base_config), str(SCHEMA_PATH))
    bad = copy.deepcopy(base_config)
    bad["arch"]["hiden_size"] = 3
    with pytest.raises(WorkflowError):
        validate(bad, str(SCHEMA_PATH))


# ----------------------------------------------------------------------------------------------- bad input


def test_unknown_key_names_file_dotted_key_and_allowed_keys(tmp_path):
    path = write(tmp_path, "arch:\n  hiden_size: 256\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    assert "unknown key 'arch.hiden_size'" in message
    assert "did you mean 'arch.hidden_size'?" in message
    assert "allowed keys in 'arch': hidden_size, num_heads" in message


def test_unknown_nested_and_top_level_keys_are_all_reported(tmp_path):
    path = write(tmp_path, "schedules:\n  curriculum:\n    enable: true\nmodel: {}\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    message = str(err.value)
    assert "2 problems" in message
    assert "'schedules.curriculum.enable' (did you mean 'schedules.curriculum.enabled'?)" in message
    assert "unknown key 'model'" in message and "allowed keys at the top level: data, arch, optim" in message


@pytest.mark.parametrize(
    "text, key, expected, got",
    [
        ("arch:\n  hidden_size: big\n", "arch.hidden_size", "an integer >= 1", "'big' (string)"),
        ("arch:\n  hidden_size: 512.0\n", "arch.hidden_size", "an integer >= 1", "512.0 (number)"),
        ("arch:\n  puzzle_emb_ndim: 0\n", "arch.puzzle_emb_ndim", "an integer >= 1 or null", "0 (integer)"),
        ("optim:\n  ema: 'yes'\n", "optim.ema", "true or false", "'yes' (string)"),
        ("train: 5\n", "train", "a mapping with keys global_batch_size", "5 (integer)"),
        ("train:\n  eval_subset: 0\n", "train.eval_subset", "an integer >= 1 or null", "0 (integer)"),
    ],
)
def test_wrong_type_names_key_expected_type_and_value(tmp_path, text, key, expected, got):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: {key}: expected {expected}")
    assert str(err.value).endswith(f"got {got}")


def _number_keys(node: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose schema type is a number."""
    if "properties" in node:
        return [
            k for key, child in node["properties"].items() for k in _number_keys(child, f"{prefix}{key}.")
        ]
    types = node.get("type")
    return [prefix[:-1]] if "number" in (types if isinstance(types, list) else [types]) else []


def test_nan_and_inf_are_refused_by_every_number_setting(tmp_path):
    """YAML's .nan passes every bound (nan > 0 and nan <= 0 are both false) and .inf every lower one: no setting
    means either, and a config holding one cannot be written as JSON. One line naming the file and the key."""
    path = write(tmp_path, "optim:\n  lr: .nan\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: optim.lr: expected a number > 0, got .nan (not a finite number)"
    keys = _number_keys(schema())
    assert len(keys) >= 10 and "optim.lr" in keys and "schedules.halt_exploration.start" in keys
    for key in keys:
        for value in (".nan", ".inf", "-.inf"):
            with pytest.raises(UserError) as err:
                load_config(None, [f"{key}={value}"])
            assert str(err.value).startswith(f"--set {key}={value}: {key}: expected ")
            assert str(err.value).endswith(f", got {value} (not a finite number)")


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("optim:\n  lr: 0\n", ["optim.lr: expected a number > 0, got 0"]),
        ("optim:\n  lr: -1e-4\n", ["optim.lr: expected a number > 0, got -0.0001"]),
        (
            "optim:\n  optimizer: sgd\n",
            ["optim.optimizer: expected one of adam_atan2, adamw, lion, got 'sgd'"],
        ),
        ("arch:\n  forward_dtype: fp8\n", ["expected one of float32, bfloat16, float16"]),
        ("arch:\n  L_cycles: 0\n", ["arch.L_cycles: expected an integer >= 1, got 0"]),
        ("optim:\n  beta2: 1.0\n", ["optim.beta2: expected a number >= 0 and < 1, got 1.0"]),
        (
            "arch:\n  hidden_size: 500\n",
            ["arch.hidden_size = 500 (from {file})", "divisible by arch.num_heads = 8"],
        ),
        (
            "train:\n  global_batch_size: 6000\n  micro_batches: 7\n",
            ["train.global_batch_size = 6000 (from {file}) must be divisible by train.micro_batches = 7"],
        ),
        (
            "train:\n  eval_interval: 3000\n",
            ["train.eval_interval = 3000 (from {file}) must divide train.epochs"],
        ),
        (
            "arch:\n  H_cycles: 2\nschedules:\n  curriculum:\n    enabled: true\n    start_H_cycles: 3\n",
            [
                "schedules.curriculum.start_H_cycles = 3 (from {file}) must be <= arch.H_cycles = 2 (from {file})"
            ],
        ),
        (
            "train:\n  epochs: 5000\nschedules:\n  curriculum: {enabled: true}\n",
            [
                "schedules.curriculum.epochs = 10000 (from {base}) must be <= train.epochs = 5000 (from {file})"
            ],
        ),
        (
            "arch:\n  puzzle_emb_ndim: 8193\n",
            [
                "the puzzle embedding (arch.puzzle_emb_ndim = 8193 (from {file})) must fit in arch.puzzle_emb_len = 16"
            ],
        ),
        (
            "arch:\n  no_ACT_continue: false\n",
            ["arch.no_ACT_continue: expected only true, got false (boolean)"],
        ),
        (
            "arch:\n  mlp_t: false\n",
            [
                "arch.mlp_t = false (from {file}) selects attention, but arch.pos_encodings = 'none' (from {base})",
                "set arch.pos_encodings beside arch.mlp_t",
            ],
        ),
    ],
)
def test_impossible_values_are_rejected_naming_file_and_key(tmp_path, text, fragments):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_config(path)
    for fragment in fragments:
        assert fragment.format(file=path, base=BASE_CONFIG) in str(err.value)
    assert str(path) in str(err.value)


def test_attention_takes_the_position_encoding_its_own_layer_sets(tmp_path):
    """Turning MLP-T off needs the encoding said beside it; `none` stays possible on purpose."""
    assert (
        load_config(write(tmp_path, "arch:\n  mlp_t: false\n  pos_encodings: rope\n"))["arch"][
            "pos_encodings"
        ]
        == "rope"
    )
    none = load_config(overrides=["arch.mlp_t=false", "arch.pos_encodings=none"])
    assert none["arch"]["pos_encodings"] == "none"
    # A resolved config has no base to inherit from: it is taken as written.
    resolved = write(tmp_path, json.dumps(none), "config.json")
    assert load_config(resolved, base=None) == none


def test_curriculum_bounds_are_not_checked_while_disabled():
    config = load_config(overrides=["arch.L_cycles=1"])
    assert config["arch"]["L_cycles"] == 1 and config["schedules"]["curriculum"]["start_L_cycles"] == 2


def test_yaml_errors_name_the_file(tmp_path):
    duplicate = write(tmp_path, "optim:\n  lr: 1.0e-4\n  lr: 3.0e-4\n", "dup.yaml")
    with pytest.raises(
        UserError, match=r"(?s)dup\.yaml: not valid YAML: duplicate key 'lr'.*dup\.yaml\", line 3"
    ):
        load_config(duplicate)
    broken = write(tmp_path, "optim: [\n", "broken.yaml")
    with pytest.raises(UserError, match=r"broken\.yaml: not valid YAML"):
        load_config(broken)
    with pytest.raises(UserError, match=r"top level, got \[1, 2\] \(list\)"):
        load_config(write(tmp_path, "[1, 2]\n"))
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(UserError, match=r"config\.json: not valid JSON"):
        load_config(write(tmp_path, "{,}", "config.json"), base=None)


def test_missing_base_points_to_the_resolved_config(tmp_path):
    with pytest.raises(UserError, match=r"base config .*absent.yaml not found.*base=None"):
        load_config(base=tmp_path / "absent.yaml")


# ---------------------------------------------------------------------------------------------------- --set


@pytest.mark.parametrize(
    "item, value",
    [
        ("optim.lr=1e-4", 1e-4),
        ("optim.lr=3E-5", 3e-5),
        ("optim.ema=true", True),
        ("train.eval_subset=null", None),
        ("a.b=[1, 2]", [1, 2]),
        ("arch.pos_encodings=rope", "rope"),
    ],
)
def test_parse_set_reads_yaml_scalars(item, value):
    parsed = parse_set(item)
    first, second = item.split("=")[0].split(".")
    assert parsed == {first: {second: value}}


def test_set_overrides_apply_after_the_experiment_file(tmp_path):
    path = write(tmp_path, "optim:\n  lr: 3.0e-4\n  optimizer: adamw\n")
    config = load_config(path, ["optim.lr=1e-3", "train.eval_subset=null", "optim.lr=2e-3"])
    assert config["optim"] == {**load_config(path)["optim"], "lr": 2e-3}
    assert config["train"]["eval_subset"] is None


@pytest.mark.parametrize(
    "item, fragment",
    [
        ("optim.lrr=1", "--set optim.lrr=1: unknown key 'optim.lrr' (did you mean 'optim.lr'?)"),
        ("optimizer=lion", "--set optimizer=lion: unknown key 'optimizer'"),
        ("optim.lr", "--set 'optim.lr': expected KEY.PATH=VALUE"),
        ("optim..lr=1", "expected KEY.PATH=VALUE"),
        ("optim.lr=abc", "--set optim.lr=abc: optim.lr: expected a number > 0, got 'abc'"),
        (
            "arch.num_heads=7",
            "arch.hidden_size = 512 (from {base}) must be divisible by arch.num_heads = 7 (from --set",
        ),
    ],
)
def test_bad_set_overrides_are_rejected(item, fragment):
    with pytest.raises(UserError) as err:
        load_config(overrides=[item])
    assert fragment.format(base=BASE_CONFIG) in str(err.value)


# ------------------------------------------------------------------------------------- resolved config, hash


def test_resolved_config_round_trips_without_base(tmp_path, experiment_configs):
    config = experiment_configs["exp06_f"]
    path = write(tmp_path, dump_config(config), "config.json")
    assert load_config(path, base=None) == config
    assert dump_config(load_config(path, base=None)) == path.read_text()


def test_incomplete_resolved_config_is_rejected(tmp_path, base_config):
    config = copy.deepcopy(base_config)
    del config["arch"]["loss"]
    del config["schedules"]["halt_exploration"]
    path = write(tmp_path, json.dumps(config), "config.json")
    with pytest.raises(UserError) as err:
        load_config(path, base=None)
    assert str(err.value).startswith(
        f"{path}: not a resolved config (missing 'arch.loss', 'schedules.halt_exploration'); "
    )
    with pytest.raises(UserError, match="no config given"):
        load_config(base=None)


def test_hash_ignores_key_order_and_int_vs_float_but_not_values(tmp_path, base_config):
    def reversed_order(node):
        return {k: reversed_order(v) for k, v in reversed(node.items())} if isinstance(node, dict) else node

    digest = config_hash(base_config)
    assert len(digest) == 12 and set(digest) <= set("0123456789abcdef")
    assert config_hash(reversed_order(base_config)) == digest
    assert config_hash(load_config(write(tmp_path, "optim:\n  weight_decay: 1\n"))) == digest
    assert config_hash(load_config(overrides=["optim.lr=1.00001e-4"])) != digest
    assert config_hash(load_config(overrides=["train.seed=1"])) != digest


# ------------------------------------------------------------------------------------------------ ids, docs


def test_experiment_ids_reject_unsafe_file_names(tmp_path):
    for name in ("good_1.yaml", "Bad.yaml", "a-b.yaml", "x.yml", "run me.yaml"):
        (tmp_path / name).write_text("{}\n")
    with pytest.raises(UserError) as err:
        experiment_ids(tmp_path)
    assert "Bad.yaml, a-b.yaml, run me.yaml, x.yml" in str(err.value)
    (tmp_path / "good_2.yaml").write_text("{}\n")
    for name in ("Bad.yaml", "a-b.yaml", "x.yml", "run me.yaml"):
        (tmp_path / name).unlink()
    assert experiment_ids(tmp_path) == ["good_1", "good_2"]


def test_experiment_path_checks_id_and_existence():
    assert experiment_path("exp01a") == CONFIG_DIR / "experiments" / "exp01a.yaml"
    with pytest.raises(UserError, match="invalid experiment id '../base'"):
        experiment_path("../base")
    with pytest.raises(UserError, match=r"unknown experiment 'exp01g'.*did you mean exp01f"):
        experiment_path("exp01g")


def test_configuration_reference_matches_the_generated_reference():
    readme = CONFIG_DOCS_PATH.read_text()
    assert readme == config_docs_markdown(), (
        "docs/configuration.md is stale: run .venv/bin/python -m trm.study.config_docs"
    )
    for key in config_keys():
        assert f"`{key}`" in readme


# ------------------------------------------------------------------------------------------------ trm config


def test_cli_prints_the_resolved_config_and_its_hash(capsys, experiment_configs):
    from trm.cli import main

    assert main(["config", "exp06_e"]) == 0
    assert json.loads(capsys.readouterr().out) == experiment_configs["exp06_e"]
    assert main(["config", "exp06_e", "--set", "train.seed=3", "--hash"]) == 0
    seeded = copy.deepcopy(experiment_configs["exp06_e"])
    seeded["train"]["seed"] = 3
    assert capsys.readouterr().out == config_hash(seeded) + "\n"
    assert main(["config", "--list"]) == 0
    assert capsys.readouterr().out.split() == experiment_ids()


def test_cli_writes_output_and_reads_it_back_as_resolved(tmp_path, capsys, experiment_configs):
    from trm.cli import main

    out = tmp_path / "run" / "config.json"
    assert main(["config", "exp09e", "--output", str(out)]) == 0
    assert main(["config", str(out), "--resolved", "--hash"]) == 0
    assert capsys.readouterr().out == config_hash(experiment_configs["exp09e"]) + "\n"


def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    from trm.cli import main

    out = tmp_path / "config.json"
    assert main(["config", "exp01a", "--set", "arch.num_heads=5", "--output", str(out)]) == 2
    assert "trm config: error: arch.hidden_size = 256" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert main(["config", "exp99"]) == 2
    assert "unknown experiment 'exp99'" in capsys.readouterr().err

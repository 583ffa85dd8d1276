"""The experiment files of config/experiments and their groups (config/groups.yaml): every file resolves and
reads alike in plain YAML, each group's members differ from its baseline only in what the group varies."""

from __future__ import annotations

import copy
import math
import shutil
from pathlib import Path

import pytest
import yaml

from trm.config import BASE_CONFIG, CONFIG_DIR, config_hash, experiment_ids, experiment_path, validate_config
from trm.errors import UserError
from trm.study.groups import GROUPS_PATH, load_groups, load_references, varies_errors
from trm.study.plan import plan_study

# The ten (train_puzzles, num_aug) datasets of the study.
DATASETS = {
    (1000, 1000),
    (100, 1000),
    (250, 1000),
    (500, 1000),
    (2000, 1000),
    (5000, 1000),
    (1000, 10),
    (1000, 100),
    (1000, 500),
    (1000, 2000),
}


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) else value
    return out


# ------------------------------------------------------------------------------------------ experiment files


def test_all_67_experiments_validate_and_plain_yaml_reads_them_alike(experiment_configs):
    assert len(experiment_configs) == 68  # the 67 of the study and the paper-recipe reference
    plain_base = yaml.safe_load(BASE_CONFIG.read_text())
    for exp_id, config in experiment_configs.items():
        # Snakemake and other readers use plain PyYAML (YAML 1.1): they must see the same numbers, not strings.
        plain = yaml.safe_load(experiment_path(exp_id).read_text())
        assert isinstance(plain, dict), exp_id
        assert validate_config(deep_merge(plain_base, plain)) == config, exp_id


def test_every_experiment_file_names_its_group_in_a_comment():
    references = {ref["id"] for ref in load_references()}
    for exp_id in set(experiment_ids()) - references:
        first = experiment_path(exp_id).read_text().splitlines()[0]
        assert first.startswith(f"# {exp_id.split('_')[0].rstrip('abcdef')}"), (exp_id, first)


def test_exp06_scales_lr_with_sqrt_batch_and_micro_batches_stay_small(experiment_configs, base_config):
    for s in "abcdef":
        config = experiment_configs[f"exp06_{s}"]
        batch = config["train"]["global_batch_size"]
        expected_lr = base_config["optim"]["lr"] * math.sqrt(
            batch / base_config["train"]["global_batch_size"]
        )
        assert config["optim"]["lr"] == pytest.approx(expected_lr, rel=1e-7)
        assert config["optim"]["puzzle_emb_lr"] == config["optim"]["lr"]
        assert batch // config["train"]["micro_batches"] <= 12288
    assert [experiment_configs[f"exp06_{s}"]["train"]["global_batch_size"] for s in "ef"] == [24576, 49152]


def test_exp09_trains_five_different_optimizer_settings(experiment_configs):
    settings = [
        (c["optim"]["optimizer"], c["optim"]["beta1"], c["optim"]["beta2"])
        for c in (experiment_configs[f"exp09{s}"] for s in "abcde")
    ]
    assert settings == [
        ("adam_atan2", 0.9, 0.95),
        ("adamw", 0.9, 0.95),
        ("adamw", 0.9, 0.99),
        ("adamw", 0.9, 0.999),
        ("lion", 0.9, 0.99),
    ]


# ------------------------------------------------------------------------------------------------------ groups


def test_groups_cover_every_experiment_once_with_ten_datasets(experiment_configs):
    groups = load_groups()
    members = [m for g in groups for m in g["members"]]
    assert len(groups) == 14
    assert len(members) == len(set(members)) == 67
    references = [ref["id"] for ref in load_references()]
    assert references == ["ref_paper"] and set(members) | set(references) == set(experiment_configs)
    # The reference is the paper's recipe: the baseline but for its batch of 768.
    paper = {
        **experiment_configs["ref_paper"],
        "train": {**experiment_configs["ref_paper"]["train"], "global_batch_size": 6144},
    }
    assert config_hash(paper) == config_hash(experiment_configs[load_groups()[0]["baseline"]])
    assert experiment_configs["ref_paper"]["train"]["global_batch_size"] == 768
    datasets = {(c["data"]["train_puzzles"], c["data"]["num_aug"]) for c in experiment_configs.values()}
    assert datasets == DATASETS


def test_members_differ_from_their_baseline_only_in_the_varied_keys(experiment_configs, base_config):
    for group in load_groups():
        baseline = experiment_configs[group["baseline"]]
        assert config_hash(baseline) == config_hash(base_config), group["id"]
        hashes = {config_hash(experiment_configs[m]) for m in group["members"]}
        assert len(hashes) == len(group["members"]), f"{group['id']}: two members resolve to the same config"
    # The plan's check (trm.study.groups.varies_errors) holds for the 67 experiments, with no exception declared.
    assert (
        varies_errors(load_groups(), experiment_configs, base_config, GROUPS_PATH, CONFIG_DIR / "experiments")
        == []
    )
    assert not any("exceptions" in group for group in load_groups())


def test_load_groups_rejects_a_member_in_two_groups(tmp_path):
    text = (CONFIG_DIR / "groups.yaml").read_text()
    doubled = text.replace(
        "members: [exp07a, exp07b, exp07c]", "members: [exp07a, exp07b, exp07c, exp07d]", 1
    )
    doubled = doubled.replace("members: [exp08a,", "members: [exp07a, exp08a,", 1)
    (tmp_path / "groups.yaml").write_text(doubled)
    with pytest.raises(UserError) as err:
        load_groups(tmp_path / "groups.yaml")
    message = str(err.value)
    assert "'exp07a' already belongs to group 'exp07'" in message
    assert "'exp07d' has no file exp07d.yaml" in message
    assert "does not start with the group id" in message


def test_the_plan_refuses_a_member_changing_a_key_its_group_does_not_vary(tmp_path):
    """An exp01 member that also changes the batch size would put two differences on one plot axis: the plan
    names the file, the key and the fix; a declared exception (with its reason) lets it through."""
    config_dir = Path(shutil.copytree(CONFIG_DIR, tmp_path / "config"))
    member = config_dir / "experiments" / "exp01b.yaml"
    member.write_text(member.read_text() + "train:\n  global_batch_size: 3072\n")
    where = {"experiments_dir": config_dir / "experiments", "groups_path": config_dir / "groups.yaml"}
    with pytest.raises(UserError) as err:
        plan_study("smoke", ["exp01a"], **where)
    assert str(err.value) == (
        f"{member}: train.global_batch_size = 3072 (baseline exp01c: 6144), but group 'exp01' varies only "
        f"arch.hidden_size, arch.num_heads ({where['groups_path']}): change only those, or declare the key under "
        "the group's exceptions with a reason"
    )
    groups = where["groups_path"]
    exception = (
        "    exceptions:\n      - member: exp01b\n        keys: [train.global_batch_size]\n"
        "        reason: half the batch fits the wider model's memory\n"
    )
    text = groups.read_text()
    groups.write_text(text.replace("    baseline: exp01c\n", "    baseline: exp01c\n" + exception, 1))
    assert [e.id for e in plan_study("smoke", ["exp01b"], **where)] == ["exp01b"]
    # An exception must say why, and name a member and known keys.
    groups.write_text(
        text.replace(
            "    baseline: exp01c\n",
            "    baseline: exp01c\n"
            + exception.replace("half the batch fits the wider model's memory", "''").replace(
                "exp01b", "exp02a_01"
            ),
            1,
        )
    )
    with pytest.raises(UserError) as err:
        load_groups(groups, where["experiments_dir"])
    assert "group 'exp01': exceptions[0]: 'exp02a_01' is not a member of the group" in str(err.value)
    assert "group 'exp01': exceptions[0]: reason must say, in text, why" in str(err.value)


def test_a_baseline_is_the_base_config_as_it_is(tmp_path):
    config_dir = Path(shutil.copytree(CONFIG_DIR, tmp_path / "config"))
    baseline = config_dir / "experiments" / "exp07b.yaml"
    baseline.write_text("optim:\n  weight_decay: 0.5\n")
    with pytest.raises(
        UserError, match=r"exp07b.yaml: the baseline of group 'exp07' changes optim.weight_decay;"
    ):
        plan_study(
            "paper", "all", experiments_dir=config_dir / "experiments", groups_path=config_dir / "groups.yaml"
        )

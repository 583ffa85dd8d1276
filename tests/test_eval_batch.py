"""`train.eval_batch_size`, the rows of an evaluation batch: a key added after runs were trained without it, which
renames none of them (trm/config/load.py ADDED_KEYS). That the trainer and `trm
evaluate` evaluate in its batches: tests/test_evaluate.py."""

from __future__ import annotations

import copy

import pytest

from trm.config import (
    ADDED_KEYS,
    config_hash,
    dump_config,
    eval_batch_size,
    experiment_ids,
    experiment_path,
    load_config,
)
from trm.errors import UserError
from trm.study.plan import config_at_scale
from trm.study.scale import SCALES


def without_key(config: dict) -> dict:
    config = copy.deepcopy(config)
    del config["train"]["eval_batch_size"]
    return config


def test_null_renames_no_run_at_any_scale_and_a_value_is_a_new_run():
    assert ADDED_KEYS["train.eval_batch_size"] is None
    for exp_id in experiment_ids():
        paper = load_config(experiment_path(exp_id))
        for scale in SCALES:
            config = config_at_scale(paper, scale, exp_id)
            assert config["train"]["eval_batch_size"] is None, (exp_id, scale)
            assert config_hash(config) == config_hash(without_key(config)), (exp_id, scale)
    base = load_config()
    assert config_hash(load_config(overrides=["train.eval_batch_size=256"])) != config_hash(base)


def test_a_config_written_before_the_key_existed_reads_as_null_with_its_old_hash(tmp_path):
    config = load_config(experiment_path("exp01c"))
    old = tmp_path / "config.json"
    old.write_text(dump_config(without_key(config)))
    read = load_config(old, base=None)
    assert read == config and config_hash(read) == config_hash(config)


def test_null_is_the_training_batch_and_every_device_gets_as_many_rows():
    train = {"global_batch_size": 32, "eval_batch_size": None}
    assert eval_batch_size(train, 1) == 32 and eval_batch_size(train, 4) == 32
    assert eval_batch_size({**train, "eval_batch_size": 256}, 1) == 256
    assert eval_batch_size({**train, "eval_batch_size": 10}, 4) == 12  # rounded up to whole rows per device
    assert eval_batch_size({"global_batch_size": 8}, 1) == 8  # a config read before the key existed


@pytest.mark.parametrize("value", ["0", "lots", "2.5"])
def test_a_bad_value_is_one_line_naming_the_key(value):
    with pytest.raises(UserError) as err:
        load_config(overrides=[f"train.eval_batch_size={value}"])
    assert "\n" not in str(err.value) and "train.eval_batch_size" in str(err.value)

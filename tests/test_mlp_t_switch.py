"""The switch of the fused MLP-T kernel, `arch.mlp_t_kernel` (trm/model/mlp_t_path.py): which path each job's train
step takes, what the plan and `trm compile-check` say of it, and a key added after runs were trained without it
that renames none of them (trm/config/load.py ADDED_KEYS)."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from workflow_support import TPU_PROFILE, add_references, copy_workflow, study

from trm.cli import main
from trm.config import (
    ADDED_KEYS,
    config_hash,
    dump_config,
    experiment_ids,
    experiment_path,
    load_config,
)
from trm.errors import UserError
from trm.launch.accelerators import step_config
from trm.model.mlp_t_path import path_name, uses_kernel
from trm.study.plan import config_at_scale
from trm.study.scale import SCALES


def without_kernel_key(config: dict) -> dict:
    """The config as the code before the key resolved it: without arch.mlp_t_kernel (nor train.eval_batch_size,
    added later, where it is null: tests/test_eval_batch.py)."""
    config = copy.deepcopy(config)
    del config["arch"]["mlp_t_kernel"]
    if config["train"].get("eval_batch_size", 0) is None:
        del config["train"]["eval_batch_size"]
    return config


def old_hash(config: dict) -> str:
    """The hash the code before the key gave a config: sha256 of its compact, key-sorted JSON, as it was."""
    text = json.dumps(without_kernel_key(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def test_the_key_renames_no_run_and_no_compiled_step_at_any_scale_and_other_values_are_new_runs():
    assert ADDED_KEYS["arch.mlp_t_kernel"] == "auto"
    for exp_id in experiment_ids():
        paper = load_config(experiment_path(exp_id))
        assert paper["arch"]["mlp_t_kernel"] == "auto", exp_id
        for scale in SCALES:
            config = config_at_scale(paper, scale, exp_id)
            assert config_hash(config) == old_hash(config), (exp_id, scale)
            assert step_config(config) == step_config(without_kernel_key(config)), (exp_id, scale)
    # The kernel adds float32 sums in another order: a run with another setting is another run.
    base = load_config()
    hashes = {config_hash(load_config(overrides=[f"arch.mlp_t_kernel={v}"])) for v in ("fused", "plain")}
    assert len(hashes | {config_hash(base)}) == 3
    assert step_config(load_config(overrides=["arch.mlp_t_kernel=plain"])) != step_config(base)


def test_a_config_written_before_the_key_existed_reads_as_auto_with_its_old_hash(tmp_path):
    config = load_config(experiment_path("exp01c"))
    old = tmp_path / "config.json"
    old.write_text(dump_config(without_kernel_key(config)))
    read = load_config(old, base=None)
    assert read == config and config_hash(read) == old_hash(config) == config_hash(config)


def test_a_bad_setting_is_one_line_naming_the_key_and_the_choices(tmp_path, capsys):
    with pytest.raises(UserError) as err:
        load_config(overrides=["arch.mlp_t_kernel=fast"])
    message = str(err.value)
    assert "\n" not in message and "arch.mlp_t_kernel" in message and "'fast'" in message
    assert all(choice in message for choice in ("auto", "fused", "plain")), message
    assert main(["config", "--set", "arch.mlp_t_kernel=yes"]) == 2
    assert "arch.mlp_t_kernel" in capsys.readouterr().err


def test_each_setting_chooses_the_path_on_each_platform_and_fused_demands_the_kernel():
    def config(*sets: str) -> dict:
        return load_config(experiment_path("exp01c"), list(sets))

    # exp01c on a v4-64: 6144 rows over 32 chips, 192 per chip, width 512: whole (8, 128) blocks.
    assert uses_kernel(config(), "tpu", 32) and uses_kernel(config("arch.mlp_t_kernel=fused"), "tpu", 32)
    assert not uses_kernel(config("arch.mlp_t_kernel=plain"), "tpu", 32)
    assert not uses_kernel(config(), "cpu", 1) and not uses_kernel(config(), "gpu", 8)
    assert not uses_kernel(config("arch.forward_dtype=float16"), "tpu", 32)  # Mosaic fails on float16
    assert not uses_kernel(config(), "tpu", 6144 // 4)  # 4 rows per device: not a whole block
    assert path_name(config("arch.mlp_t=false", "arch.pos_encodings=rope"), "tpu", 32) is None
    for sets, platform, devices, why in (
        ((), "cpu", 1, "the kernel runs on TPU only, not on cpu"),
        (("arch.forward_dtype=float16",), "tpu", 32, "arch.forward_dtype = float16"),
        (("train.micro_batches=48",), "tpu", 32, "a device's 4 rows per micro-batch"),
    ):
        with pytest.raises(UserError) as err:
            uses_kernel(config("arch.mlp_t_kernel=fused", *sets), platform, devices)
        assert why in str(err.value) and "set arch.mlp_t_kernel=auto" in str(err.value), str(err.value)


@pytest.mark.slow  # 2.7 s: four studies planned
def test_the_plan_says_which_path_each_job_takes_and_refuses_an_impossible_fused(tmp_path):
    bucket = {"storage": "gs://trm-bucket/study", "experiments": ["exp01c", "ref_paper"]}
    tpu = study(tmp_path / "tpu", bucket, profile=TPU_PROFILE).costs
    assert tpu.message("exp01c").splitlines()[-1] == "    MLP-T:      fused kernel (arch.mlp_t_kernel auto)"
    local = study(tmp_path / "local", {"experiments": ["exp06_a"]}).costs
    assert local.message("exp06_a").splitlines()[-1] == "    MLP-T:      plain (arch.mlp_t_kernel auto)"
    root = copy_workflow(tmp_path / "workflow")
    add_references(root, {"fused_ref": {"arch": {"mlp_t_kernel": "fused"}}})
    planned = study(
        tmp_path / "fused_tpu", {**bucket, "experiments": ["fused_ref"]}, profile=TPU_PROFILE, root=root
    )
    assert (
        planned.costs.message("fused_ref").splitlines()[-1].endswith("fused kernel (arch.mlp_t_kernel fused)")
    )
    with pytest.raises(UserError) as err:  # the local backend's CPU
        study(tmp_path / "fused_cpu", {"experiments": ["fused_ref"]}, root=root)
    assert str(err.value) == (
        f"{root}/config/experiments/fused_ref.yaml at the smoke scale: arch.mlp_t_kernel = fused, but the fused "
        "MLP-T kernel cannot run this step: the kernel runs on TPU only, not on cpu; set arch.mlp_t_kernel=auto "
        "(the kernel where it applies) or plain"
    )


def test_compile_check_stops_an_impossible_fused_before_compiling(capsys):
    assert main(["compile-check", "exp07c", "--set", "arch.mlp_t_kernel=fused", "--accelerator", "v4-8"]) == 2
    err = capsys.readouterr().err
    assert (
        "arch.forward_dtype = float16 (the kernel takes bfloat16 or float32)" in err
        and "compiling" not in err
    )

"""The fused MLP-T kernel checked on a run's device before its first step (trm/train/kernel_check.py), here on the
CPU in Pallas' TPU interpreter, as if the run were on a TPU: it passes with the real kernel in both dtypes it
takes, and a broken kernel stops the run with one line naming the error, the tolerance and the setting that turns
the kernel off, recorded in the run dir."""

from __future__ import annotations

import json
import re

import jax.numpy as jnp
import pytest
from model_configs import model_config
from tiny_run import tiny_config

from trm.errors import UserError
from trm.model import mlp_t_kernel
from trm.train import kernel_check

pytestmark = pytest.mark.slow  # 5 to 15 s each: the kernel in Pallas' TPU interpreter

# The tiny run with a width and batch whose per-device activations split into the kernel's whole blocks.
KERNEL_SHAPES = {"arch.hidden_size": 128, "train.global_batch_size": 8}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_real_kernel_passes_within_the_tolerance_of_its_dtype(dtype):
    result = kernel_check.compare(model_config(hidden_size=128, forward_dtype=dtype), interpret=True)
    assert result["dtype"] == dtype and result["shape"] == [97, 8, 128]
    assert result["tolerance"] == kernel_check.TOLERANCE[dtype]
    assert 0 < max(result["relative_errors"].values()) <= result["tolerance"] / 2, result


def test_the_trainer_checks_the_kernel_it_uses_and_records_the_result(easy_data, tmp_path, monkeypatch):
    from trm.train.trainer import Trainer

    config = tiny_config({**KERNEL_SHAPES, "train.epochs": 1, "train.eval_interval": 1})
    run = tmp_path / "run"
    Trainer(config, easy_data, str(run), str(tmp_path / "cache"), log_every=1, use_wandb=False)
    assert not (run / "kernel_check.json").exists()  # a CPU run does not use the kernel: nothing checked
    fused = tiny_config({**KERNEL_SHAPES, "arch.mlp_t_kernel": "fused"})
    with pytest.raises(
        UserError, match=r"^arch.mlp_t_kernel = fused, but .*: the kernel runs on TPU only, not on cpu"
    ):
        Trainer(fused, easy_data, str(tmp_path / "fused"), str(tmp_path / "cache"), 1, False)
    monkeypatch.setattr(kernel_check, "INTERPRET", True)
    trainer = Trainer(config, easy_data, str(run), str(tmp_path / "cache"), log_every=1, use_wandb=False)
    record = json.loads((run / "kernel_check.json").read_text())
    assert record == trainer.kernel_check and record["passed"] and record["hosts_worst_ratio"][0] < 0.5
    assert record["interpret"] and record["dtype"] == "float32" and record["shape"] == [97, 8, 128]
    plain = tiny_config({**KERNEL_SHAPES, "arch.mlp_t_kernel": "plain"})
    assert (
        Trainer(plain, easy_data, str(tmp_path / "plain"), str(tmp_path / "cache"), 1, False).kernel_check
        is None
    )


def test_a_broken_kernel_stops_the_run_naming_the_error_tolerance_and_setting(
    easy_data, tmp_path, monkeypatch
):
    from trm.train.trainer import Trainer

    real = mlp_t_kernel.swiglu_along_leading_axis

    def off_by_a_bit(x, w_gate_up, w_down, interpret=False):  # e.g. a matmul at lower precision on the chip
        return (real(x, w_gate_up, w_down, interpret).astype(jnp.float32) * 1.01).astype(x.dtype)

    monkeypatch.setattr(kernel_check, "INTERPRET", True)
    monkeypatch.setattr(mlp_t_kernel, "swiglu_along_leading_axis", off_by_a_bit)
    config = tiny_config({**KERNEL_SHAPES, "train.epochs": 1, "train.eval_interval": 1})
    run = tmp_path / "run"
    with pytest.raises(UserError) as err:
        Trainer(config, easy_data, str(run), str(tmp_path / "cache"), log_every=1, use_wandb=False)
    message = str(err.value)
    assert "\n" not in message, message
    assert re.fullmatch(
        r"the fused MLP-T kernel disagrees with the plain formulation on this cpu: (y|dx|dw_gate_up|dw_down) "
        r"differs by 0\.01 of its scale, over the float32 tolerance 7\.63e-06 \(shape \[97, 8, 128\]\); "
        r"train with arch\.mlp_t_kernel=plain \(the plain formulation\) and report it",
        message,
    ), message
    record = json.loads((run / "kernel_check.json").read_text())
    assert not record["passed"] and min(record["relative_errors"].values()) > 0.009

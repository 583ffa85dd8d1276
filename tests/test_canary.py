"""`trm canary` (trm/study/canary.py) on this machine's CPU: the go page and its record, a no-go (exit 1) for each
failure it checks (a kernel that disagrees with the plain formulation, logits that differ from the CPU's, a loss that is not finite, a host whose
parameters differ, a checkpoint that does not restore to the parameters written), and the measured step time that
a go leaves where the plan prices training from it."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_run import TINY, set_flags
from workflow_support import study

from trm.cli import main
from trm.config import dump_config, training_steps
from trm.launch.accelerators import step_hash
from trm.model import mlp_t_kernel
from trm.run import distributed
from trm.study.canary import Check, on_every_host
from trm.train import checkpoint, first_logits, kernel_check, step

pytestmark = pytest.mark.slow  # 10 to 20 s each: a tiny model's 30 steps and a checkpoint

FLAGS = set_flags({**TINY, "optim.lr": 1e-3})


def canary(easy_dataset, out, *extra: str) -> int:
    return main(["canary", "--data", str(easy_dataset), "--out", str(out), *FLAGS, *extra])


def test_a_healthy_machine_gets_go_and_every_figure(easy_dataset, tmp_path, capsys):
    assert canary(easy_dataset, tmp_path / "out") == 0
    lines = capsys.readouterr().out.splitlines()[-7:]
    assert lines[0] == "canary on 1 cpu devices (1 hosts): GO"
    names = [line.split(":")[0].split()[-1] for line in lines[1:]]
    assert names == ["kernel", "logits", "loss", "replicas", "checkpoint", "time"]
    assert all(line.startswith("  ok ") for line in lines[1:]), lines
    assert "not used by this step (the plain formulation)" in lines[1]
    assert (
        "step 1 on this cpu against its CPU, 8 rows: differ by 0 of their scale, tolerance 0.00781"
        in lines[2]
    )
    record = json.loads((tmp_path / "out" / "canary.json").read_text())
    assert record["go"] and len(record["losses"]) == 30 and record["lr_warmup_steps"] == 5
    assert record["step_s"] == np.median(record["step_seconds"][1:]) > 0
    assert json.loads(record["step_key"])["devices"] == 1
    assert f"{record['step_s'] * 1e3:.4g} ms per step" in lines[6]


def test_a_kernel_that_disagrees_is_no_go(easy_dataset, tmp_path, capsys, monkeypatch):
    real = mlp_t_kernel.swiglu_along_leading_axis

    def off_by_a_bit(x, w_gate_up, w_down, interpret=False):
        return (real(x, w_gate_up, w_down, interpret).astype(jnp.float32) * 1.01).astype(x.dtype)

    monkeypatch.setattr(kernel_check, "INTERPRET", True)  # as if on a TPU: the kernel in its interpreter
    monkeypatch.setattr(mlp_t_kernel, "swiglu_along_leading_axis", off_by_a_bit)
    assert canary(easy_dataset, tmp_path / "out", "--set=arch.hidden_size=128") == 1
    lines = capsys.readouterr().out.splitlines()[-7:]
    assert lines[0] == "canary on 1 cpu devices (1 hosts): NO-GO (kernel)"
    assert (
        lines[1].startswith("  FAIL kernel:     ")
        and "of its scale, tolerance 7.63e-06 (float32)" in lines[1]
    )
    assert lines[1].endswith("off: arch.mlp_t_kernel=plain")
    assert not json.loads((tmp_path / "out" / "canary.json").read_text())["kernel"]["passed"]


def test_a_bad_loss_a_host_that_differs_and_a_bad_restore_are_each_no_go(
    easy_dataset, tmp_path, capsys, monkeypatch
):
    call, restore = step.TrainStep.__call__, checkpoint.Checkpointer.restore
    real_logits, devices = first_logits.logits_on, []

    def nan_loss(self, *args, **kwargs):
        state, metrics = call(self, *args, **kwargs)
        return state, {**metrics, "lm_loss": jnp.nan}

    def restore_perturbed(self, at, like):
        state, record = restore(self, at, like)
        return state._replace(params=jax.tree.map(lambda p: p + 1, state.params)), record

    def two_hosts(value):  # a second host whose parameters differ from host 0's (and whose checks agree)
        return [value, "0" * 64] if len(value) == 64 else [value, value]

    def device_off(model, device, weights, rows):  # the device's logits (computed first) 1.5 times the CPU's
        logits = real_logits(model, device, weights, rows)
        devices.append(device)
        return logits * 1.5 if len(devices) == 1 else logits

    monkeypatch.setattr(step.TrainStep, "__call__", nan_loss)
    monkeypatch.setattr(checkpoint.Checkpointer, "restore", restore_perturbed)
    monkeypatch.setattr(distributed, "gather_strings", two_hosts)
    monkeypatch.setattr(first_logits, "logits_on", device_off)
    assert canary(easy_dataset, tmp_path / "out", "--results", str(tmp_path / "results")) == 1
    assert not (tmp_path / "results").exists()  # a no-go prices nothing
    lines = capsys.readouterr().out.splitlines()[-7:]
    assert lines[0] == "canary on 1 cpu devices (1 hosts): NO-GO (logits, loss, replicas, checkpoint)"
    assert lines[2].startswith("  FAIL logits:") and "differ by 0.5 of their scale" in lines[2]
    assert lines[3].startswith("  FAIL loss:") and lines[3].endswith("30 not finite")
    assert lines[4].startswith("  FAIL replicas:") and lines[4].endswith("hosts 1 differ from host 0")
    assert lines[5].startswith("  FAIL checkpoint:") and lines[5].endswith("parameters DIFFER")
    assert not json.loads((tmp_path / "out" / "canary.json").read_text())["go"]


def test_a_go_writes_its_step_time_where_the_plan_prices_training_from_it(easy_dataset, tmp_path, capsys):
    planned = study(tmp_path, {"experiments": ["exp06_a"], "replicates": {"smoke": {"baseline": 1}}})
    config = planned.plan["exp06_a"].config
    before = planned.costs.hours["exp06_a"]["training"]
    (tmp_path / "exp06_a.json").write_text(dump_config(config))
    args = ["canary", "--data", str(easy_dataset), "--out", str(tmp_path / "out"), "--steps", "10"]
    assert (
        main([*args, "--config", str(tmp_path / "exp06_a.json"), "--results", str(tmp_path / "results")]) == 0
    )
    record = json.loads((tmp_path / "out" / "canary.json").read_text())
    assert record["measured_step_file"] == f"{tmp_path}/results/measured/{step_hash(config)}-1.json"
    costs = study(tmp_path, {"experiments": ["exp06_a"], "replicates": {"smoke": {"baseline": 1}}}).costs
    training = costs.hours["exp06_a"]["training"]
    assert training == pytest.approx(training_steps(config) * record["step_s"] / 3600) and training != before
    assert costs.message("exp06_a").splitlines()[0] == (
        "train exp06_a: estimated on the job's 1 devices, training at the step time trm canary measured "
        f"({record['measured_step_file']}), the rest from its FLOPs and batch at an assumed 10% of peak"
    )
    assert f"  canary:     training of 1 runs at the step times measured in {tmp_path}/results/measured/" in (
        costs.plan_text().splitlines()
    )


def test_a_check_that_passed_here_and_failed_on_another_host_fails_the_page(monkeypatch):
    monkeypatch.setattr(
        distributed, "gather_strings", lambda outcomes: [outcomes, "100"]
    )  # host 1's outcomes
    checks = [Check("kernel", True, "k"), Check("loss", True, "l"), Check("replicas", False, "r")]
    assert on_every_host(checks) == [
        checks[0],
        Check("loss", False, "l; FAILED on host 1 (its figures: that host's output)"),
        checks[2],  # failed here already: its own figures say why
    ]

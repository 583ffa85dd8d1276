"""`trm` names the JAX platform on a machine without a TPU, so libtpu (installed for compile-check) is never
probed there: no `E0000 ... INVALID_ARGUMENT` lines, no seconds spent looking for TPU workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trm import platform
from trm.errors import UserError
from trm.launch import local


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    folder = tmp_path / "dev"
    folder.mkdir()
    return folder


def test_no_tpu_means_cpu_and_the_users_choice_and_a_tpu_vm_are_left_alone(dev: Path):
    environ: dict[str, str] = {}
    assert platform.choose_platform(environ, dev) == "cpu" and environ == {"JAX_PLATFORMS": "cpu"}
    environ = {"JAX_PLATFORMS": "tpu"}
    assert platform.choose_platform(environ, dev) is None and environ == {"JAX_PLATFORMS": "tpu"}
    (dev / "accel0").touch()  # a v4 TPU VM's chip
    environ = {}
    assert platform.choose_platform(environ, dev) is None and environ == {}
    (dev / "accel0").unlink()
    (dev / "vfio").mkdir()
    (dev / "vfio" / "0").touch()  # a v5e/v6e TPU VM's chip
    assert platform.choose_platform(environ, dev) is None and environ == {}


def test_a_gpu_with_the_cuda_plugin_comes_first(dev: Path, monkeypatch: pytest.MonkeyPatch):
    (dev / "nvidiactl").touch()
    installed = {"libtpu", "jax_plugins.xla_cuda13"}
    monkeypatch.setattr(platform, "_installed", lambda module: module in installed)
    environ: dict[str, str] = {}
    assert platform.choose_platform(environ, dev) == "cuda,cpu"
    installed.discard("jax_plugins.xla_cuda13")  # a GPU but no CUDA build of jax: the CPU
    environ = {}
    assert platform.choose_platform(environ, dev) == "cpu"
    installed.discard("libtpu")  # no libtpu, nothing to avoid: JAX's own search
    environ = {}
    assert platform.choose_platform(environ, dev) is None and environ == {}


def test_a_trm_command_starts_jax_without_libtpu_noise_here():
    """This machine has no TPU and the test environment has libtpu: a command that starts JAX prints nothing."""
    assert not platform.tpu_attached(), "this test describes a machine without a TPU"
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    probe = "from trm.platform import choose_platform; choose_platform(); import jax; print(jax.devices()[0].platform)"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cpu"
    assert "E0000" not in done.stderr and "TPU" not in done.stderr, done.stderr


# ------------------------------------------------------------------ launch.platform for the local launcher


def _gpu_machine(dev: Path, monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:
    """`dev` as a machine with `gpus` NVIDIA GPUs and JAX's CUDA plugin installed."""
    for name in ("nvidiactl", "nvidia-uvm", *(f"nvidia{i}" for i in range(gpus))):
        (dev / name).touch()
    monkeypatch.setattr(platform, "_installed", lambda module: module == "jax_plugins.xla_cuda12")


def test_launch_platform_cpu_gpu_and_auto(dev: Path, monkeypatch: pytest.MonkeyPatch):
    assert platform.local_platform("cpu", dev) == "cpu"
    assert platform.local_platform("auto", dev) == "cpu"  # no GPU here: the CPU
    with pytest.raises(UserError, match=r"launch.platform is gpu, but .*pip install -e '.\[cuda\]'"):
        platform.local_platform("gpu", dev)
    with pytest.raises(UserError, match="launch.platform 'tpu': expected one of cpu, gpu, auto"):
        platform.local_platform("tpu", dev)
    _gpu_machine(dev, monkeypatch, gpus=2)
    assert platform.local_platform("auto", dev) == platform.local_platform("gpu", dev) == "gpu"
    assert platform.local_platform("cpu", dev) == "cpu"  # the user's choice stands
    assert platform.visible_gpus({}, dev) == ["0", "1"]  # not nvidiactl or nvidia-uvm
    assert platform.visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5"}, dev) == ["3", "5"]


def test_each_local_host_gets_its_own_gpus(dev: Path, monkeypatch: pytest.MonkeyPatch):
    _gpu_machine(dev, monkeypatch, gpus=4)
    gpus = local.host_gpus("gpu", hosts=2, devices_per_host=2, environ={}, dev=dev)
    assert gpus == ["0", "1", "2", "3"]
    base = {"JAX_NUM_CPU_DEVICES": "8", "PATH": "/bin"}
    hosts = [local.host_environment(base, 2, 2, index, 1234, gpus) for index in range(2)]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in hosts] == ["0,1", "2,3"]
    assert all(env["JAX_PLATFORMS"] == "cuda" and "JAX_NUM_CPU_DEVICES" not in env for env in hosts)
    with pytest.raises(UserError, match=r"needs 3 hosts x 2 GPUs, and this machine shows 4 \(0, 1, 2, 3\)"):
        local.host_gpus("auto", hosts=3, devices_per_host=2, environ={}, dev=dev)
    assert local.host_gpus("cpu", hosts=3, devices_per_host=2, environ={}, dev=dev) is None
    cpu = local.host_environment(base, 1, 2, 0, 1234, None)
    assert cpu["JAX_PLATFORMS"] == "cpu" and cpu["JAX_NUM_CPU_DEVICES"] == "2"

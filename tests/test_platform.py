"""`trm` names the JAX platform on a machine without a TPU, so libtpu (installed for compile-check) is never
probed there: no `E0000 ... INVALID_ARGUMENT` lines, no seconds spent looking for TPU workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trm import platform


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

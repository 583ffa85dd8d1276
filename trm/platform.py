"""Which JAX platform a `trm` command uses when the user has not chosen one (JAX_PLATFORMS unset).

With libtpu installed (the `[tpu]` extra, which `make test` installs for compile-check) and no TPU attached,
JAX's default platform search first initialises libtpu, which prints `E0000 ... INVALID_ARGUMENT` lines and
spends seconds looking for TPU workers. So on a machine with no TPU we name the platform ourselves: the GPU
with the CPU beside it where an NVIDIA GPU and JAX's CUDA plugin are both there, else the CPU. A TPU VM (its
chips appear as /dev/accel* on v4, /dev/vfio/N on later generations) and any JAX_PLATFORMS the user set are
left alone.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import MutableMapping
from pathlib import Path

ENV = "JAX_PLATFORMS"


def tpu_attached(dev: Path = Path("/dev")) -> bool:
    return any(dev.glob("accel[0-9]*")) or any((dev / "vfio").glob("[0-9]*"))


def gpu_usable(dev: Path = Path("/dev")) -> bool:
    """An NVIDIA device and a JAX CUDA plugin (jax[cuda12] or jax[cuda13]) to drive it."""
    plugins = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")
    return (dev / "nvidiactl").exists() and any(_installed(name) for name in plugins)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package (jax_plugins) is absent
        return False


def choose_platform(environ: MutableMapping[str, str] = os.environ, dev: Path = Path("/dev")) -> str | None:
    """Set JAX_PLATFORMS where JAX's own search would trip over libtpu; returns what it set (None: nothing)."""
    if environ.get(ENV) or tpu_attached(dev) or not _installed("libtpu"):
        return None
    environ[ENV] = "cuda,cpu" if gpu_usable(dev) else "cpu"
    return environ[ENV]

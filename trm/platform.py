"""Which JAX platform a `trm` command uses when the user has not chosen one (JAX_PLATFORMS unset).

With libtpu installed (the `[tpu]` extra, which `make test` installs for compile-check) and no TPU attached,
JAX's default platform search first initialises libtpu, which prints `E0000 ... INVALID_ARGUMENT` lines and
spends seconds looking for TPU workers. So on a machine with no TPU we name the platform ourselves: the GPU
with the CPU beside it where an NVIDIA GPU and JAX's CUDA plugin are both there, else the CPU. A TPU VM (its
chips appear as /dev/accel* on v4, /dev/vfio/N on later generations) and any JAX_PLATFORMS the user set are
left alone.

The local launcher's hosts get their platform from the workflow setting `launch.platform` (`local_platform`):
"cpu" (the default: laptops, CI, bit-reproducible tests), "gpu" (the machine's NVIDIA GPUs, `devices_per_host`
of them per host, through the `[cuda]` extra), or "auto" (the GPUs where they are usable, else the CPU).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import MutableMapping
from pathlib import Path

from trm.errors import UserError

ENV = "JAX_PLATFORMS"
LOCAL_PLATFORMS = ("cpu", "gpu", "auto")  # the values of the workflow setting launch.platform
NO_GPU = (
    "launch.platform is gpu, but this machine has no NVIDIA GPU that JAX can drive (it needs /dev/nvidiactl and "
    "JAX's CUDA plugin: pip install -e '.[cuda]'); use launch.platform: cpu or auto"
)


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


def local_platform(setting: str, dev: Path = Path("/dev")) -> str:
    """ "cpu" or "gpu": what the local launcher's hosts run on for the setting `launch.platform`."""
    if setting not in LOCAL_PLATFORMS:
        raise UserError(f"launch.platform {setting!r}: expected one of {', '.join(LOCAL_PLATFORMS)}")
    if setting == "auto":
        return "gpu" if gpu_usable(dev) else "cpu"
    if setting == "gpu" and not gpu_usable(dev):
        raise UserError(NO_GPU)
    return setting


def visible_gpus(environ: MutableMapping[str, str] = os.environ, dev: Path = Path("/dev")) -> list[str]:
    """The GPUs this process may give its hosts: CUDA_VISIBLE_DEVICES's entries when set, else /dev/nvidiaN."""
    chosen = environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is not None:
        return [entry.strip() for entry in chosen.split(",") if entry.strip()]
    numbers = (path.name.removeprefix("nvidia") for path in dev.glob("nvidia[0-9]*"))
    return [str(n) for n in sorted(int(n) for n in numbers if n.isdigit())]

"""Which formulation a train step's MLP-T runs: the fused Pallas kernel (trm/model/mlp_t_kernel.py) or the plain
one, decided from the run's config, its devices and their platform by the setting `arch.mlp_t_kernel`.

JAX-free: the plan and `trm compile-check` say which path each job takes, and the trainer checks a `fused` setting
before it builds anything. The model applies the same rule where it is traced (trm/model/layers.py).
"""

from __future__ import annotations

from trm.errors import UserError

SETTING = "arch.mlp_t_kernel"
AUTO, FUSED, PLAIN = "auto", "fused", "plain"
# A grid step's block of x: all S rows, ROWS of the B axis and COLUMNS of the D axis. A TPU holds an array
# in (8, 128) tiles over its last two axes, so these are the smallest aligned blocks; larger ones multiply
# the unrolled kernel code (and its compile time) without reading fewer bytes.
ROWS, COLUMNS = 8, 128
# What the kernel compiles for on a v4: Mosaic (libtpu 0.0.42.1) fails on a float16 kernel ("Invalid vector
# type for load"), so a float16 forward (exp07c) keeps the plain formulation.
DTYPES = ("bfloat16", "float32")


def fits(rows: int, width: int) -> bool:
    """Whether a device's [S, rows, width] activations split into whole blocks."""
    return rows % ROWS == 0 and width % COLUMNS == 0


def rows_per_device(config: dict, devices: int) -> int:
    """The batch rows one device's MLP-T sees in the train step: one micro-batch's share."""
    train = config["train"]
    return train["global_batch_size"] // (train["micro_batches"] * devices)


def kernel_problem(config: dict, platform: str, devices: int) -> str | None:
    """Why the fused kernel cannot run `config`'s train step on `devices` devices of `platform` ("tpu", "cpu",
    "gpu"); None when it can."""
    arch = config["arch"]
    if not arch["mlp_t"]:
        return "the model has no MLP-T (arch.mlp_t = false)"
    if platform != "tpu":
        return f"the kernel runs on TPU only, not on {platform}"
    if arch["forward_dtype"] not in DTYPES:
        return f"arch.forward_dtype = {arch['forward_dtype']} (the kernel takes {' or '.join(DTYPES)})"
    rows = rows_per_device(config, devices)
    if not fits(rows, arch["hidden_size"]):
        return (
            f"a device's {rows} rows per micro-batch and arch.hidden_size = {arch['hidden_size']} must be "
            f"multiples of {ROWS} and {COLUMNS}"
        )
    return None


def uses_kernel(config: dict, platform: str, devices: int) -> bool:
    """Whether `config`'s train step runs the fused kernel on `devices` devices of `platform`. UserError for
    `fused` where it cannot: that setting demands the kernel."""
    setting = config["arch"]["mlp_t_kernel"]
    if setting == PLAIN:
        return False
    problem = kernel_problem(config, platform, devices)
    if problem is not None and setting == FUSED:
        raise UserError(
            f"{SETTING} = fused, but the fused MLP-T kernel cannot run this step: {problem}; "
            f"set {SETTING}=auto (the kernel where it applies) or plain"
        )
    return problem is None


def path_name(config: dict, platform: str, devices: int) -> str | None:
    """The MLP-T path in a few words for a plan's line: "fused kernel" or "plain" (None without MLP-T); UserError
    as `uses_kernel`."""
    if not config["arch"]["mlp_t"]:
        return None
    return "fused kernel" if uses_kernel(config, platform, devices) else "plain"

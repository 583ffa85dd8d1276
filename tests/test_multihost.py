"""Multi-host data parallelism proven with CPU processes as hosts (2 processes x 2 devices, 1 x 4).

Every subprocess is bounded by a timeout and killed in `finally`; hosts get short heartbeat timeouts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from tiny_run import TINY, set_flags, tiny_config

from trm.config import BASE_CONFIG
from trm.launch.local import free_port, host_environment
from trm.run import distributed
from trm.run.timing import last_record

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
# 48 train groups x 2 epochs / 8 = 12 steps per evaluation interval, 24 steps in all; exploration on.
# Two supervision steps per puzzle: 16 would unroll the untrained recurrence so deeply that float rounding
# differences between device layouts (the order of the gradient sum) grow to 1e-3 in the loss.
RUN = {
    **TINY,
    "arch.halt_max_steps": 2,
    "train.eval_steps": 2,
    "train.epochs": 4,
    "train.eval_interval": 2,
    "train.checkpoint_every_steps": 4,
}


def _train_args(data: str, run_dir: Path, cache: Path, extra: dict) -> list[str]:
    """`trm train`'s arguments: the run's, then (from --cache-dir on) the trainer's other options."""
    return [
        "--config",
        str(BASE_CONFIG),
        *set_flags({**RUN, **extra}),
        "--data",
        data,
        "--run-dir",
        str(run_dir),
        "--cache-dir",
        str(cache),
        "--log-every",
        "4",
    ]


def _launch(
    hosts: int, devices: int, train_args: list[str], timeout: float = 150
) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "trm.cli",
        "launch",
        "--hosts",
        str(hosts),
        "--devices-per-host",
        str(devices),
    ]
    # The run's arguments are the launcher's; the trainer's other options follow --.
    options = train_args.index("--cache-dir")
    return subprocess.run(
        [*cmd, *train_args[:options], "--", *train_args[options:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _start_hosts(
    train_args: list[list[str]], devices: int, env: dict[str, str] | None = None
) -> list[subprocess.Popen]:
    """One `trm train` per element of `train_args`, as hosts of one job (without the launcher), with `env` over
    this process's environment."""
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, "-m", "trm.cli", "train", *args],
            cwd=REPO,
            env=host_environment({**os.environ, **(env or {})}, len(train_args), devices, index, port),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index, args in enumerate(train_args)
    ]


def _final(run_dir: Path | str) -> dict:
    """The run's final.json, in a local folder or in storage."""
    from trm import storage

    return json.loads(storage.read_text(f"{run_dir}/final.json"))


def _latest_checkpoint(run_dir: Path) -> int:
    return max((int(p.name) for p in (run_dir / "ckpt").glob("*") if p.name.isdigit()), default=-1)


@pytest.fixture(scope="module")
def two_by_two(easy_dataset, gcs_emulator, tmp_path_factory) -> str:
    """An uninterrupted run on 2 hosts x 2 devices, the reference of the tests below; with its dataset, config,
    checkpoints, metrics and per-host logs all on (emulated) GCS, as on a pod, and its run dir named by its config
    hash (`{config_hash}`). Returns the run dir's URL."""
    from trm import storage
    from trm.cli import main as trm

    tmp, bucket = tmp_path_factory.mktemp("two-by-two"), f"gs://two-by-two-{os.getpid()}-{time.time_ns()}"
    storage.filesystem(bucket)[0].mkdir(bucket.removeprefix("gs://"))
    assert trm(["stage", str(easy_dataset), f"{bucket}/data"]) == 0
    args = _train_args(f"{bucket}/data", Path("unused"), tmp / "cache", {})
    args[args.index("--run-dir") + 1] = f"{bucket}/runs/easy-{{config_hash}}"
    done = _launch(2, 2, args)
    assert done.returncode == 0, done.stdout[-4000:]
    (marker,) = [name for name in storage.list_files(f"{bucket}/runs") if name.endswith("_SUCCESS")]
    return f"{bucket}/runs/{marker.removesuffix('/_SUCCESS')}"


def test_two_hosts_train_exactly_like_one_host_with_the_same_devices(easy_data, tmp_path):
    """2 hosts x 1 device and 1 host x 2 devices end with bit-identical parameters, EMA and metrics.

    Bit-identical by construction, on any CPU: each device runs the same compiled program on the same rows (each
    host's XLA thread pool is as wide as one process's, distributed.size_cpu_thread_pool), and every cross-device
    sum has two terms, which floating-point addition adds the same way in either order. (With
    more devices the all-reduce's summation order depends on the layout, and the untrained recurrence amplifies
    a last-bit difference about x19 per supervision step, so 2 x 2 against 1 x 4 is not comparable bit for bit.)
    """
    from trm.data.format import load_split
    from trm.data.verify import fetch_dataset
    from trm.train.batches import TrainBatches

    runs = {}
    # The final evaluation samples too (trm/train/final_evaluation.py): each host feeds its rows of K = 3
    # trajectories per puzzle, and every host gathers every row's answer.
    sampling = ["--test-time-steps", "2,3", "--test-time-trajectories", "3", "--test-time-noise", "0.5"]
    for hosts, devices in ((2, 1), (1, 2)):
        runs[hosts] = tmp_path / f"{hosts}x{devices}"
        args = _train_args(easy_data, runs[hosts], tmp_path / "cache", {})
        done = _launch(hosts, devices, [*sampling, *args])
        assert done.returncode == 0, done.stdout[-4000:]
        assert "[host 0]" in done.stdout
    multi, single = _final(runs[2]), _final(runs[1])

    # The hosts' rows of every global batch, put together, are the single process's batch.
    config = tiny_config(RUN)
    split = load_split(fetch_dataset(easy_data, tmp_path / "cache"), "train")
    tc = config["train"]
    whole = TrainBatches(split, tc["global_batch_size"], tc["eval_interval"], tc["seed"])
    hosts = [
        TrainBatches(split, tc["global_batch_size"], tc["eval_interval"], tc["seed"], i, 2) for i in (0, 1)
    ]
    for step in range(single["steps"]):
        parts = [h.batch(step).as_dict() for h in hosts]
        for key, value in whole.batch(step).as_dict().items():
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), value)

    assert (multi["processes"], multi["devices"]) == (2, 2)
    assert (single["processes"], single["devices"]) == (1, 2)
    assert multi["steps"] == single["steps"] == 24
    assert set(multi["hosts_params_sha256"]) == {single["params_sha256"]}
    assert set(multi["hosts_ema_sha256"]) == {single["ema_sha256"]}
    assert multi["test"] == single["test"]
    records = [(runs[n] / "metrics.jsonl").read_text().splitlines() for n in (2, 1)]
    strip = [[{k: v for k, v in json.loads(r).items() if not _timing(k)} for r in rs] for rs in records]
    assert strip[0] == strip[1]
    sampled = [json.loads((runs[n] / "sampled.json").read_text()) for n in (2, 1)]
    assert sampled[0]["results"] == sampled[1]["results"] and len(sampled[0]["results"]) == 2


def _timing(key: str) -> bool:
    """Record fields that measure time or throughput, which differ between any two runs."""
    return any(word in key for word in ("time", "per_s", "seconds", "wall", "elapsed"))


def test_two_hosts_with_two_devices_each_hold_identical_state(two_by_two):
    from trm import storage

    final = _final(two_by_two)
    assert two_by_two.endswith(f"/easy-{final['config_hash']}")
    assert (final["processes"], final["devices"], final["steps"]) == (2, 4, 24)
    assert len(set(final["hosts_params_sha256"])) == 1  # both hosts hold identical parameters
    assert len(set(final["hosts_ema_sha256"])) == 1
    assert storage.list_files(f"{two_by_two}/logs") == ["host-0.log", "host-1.log"]
    assert "host 1 of 2" in storage.read_text(f"{two_by_two}/logs/host-1.log")


def test_hosts_with_different_configs_fail_naming_the_host(easy_data, tmp_path):
    run = tmp_path / "run"
    args = _train_args(easy_data, run, tmp_path / "cache", {})
    procs = _start_hosts([args, [*args, "--set=train.seed=7"]], devices=1)
    try:
        outputs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [2, 2], outputs
    for err in outputs:
        assert "hosts disagree on config hash and code version" in err and "host 1 has config" in err
    assert not (run / "config.json").exists()


def _wait_for_checkpoint(run: Path, procs: list[subprocess.Popen], after: int) -> None:
    deadline = time.time() + 120
    while _latest_checkpoint(run) <= after:
        assert all(p.poll() is None for p in procs), [p.stderr.read()[-3000:] for p in procs]
        assert time.time() < deadline, "no new checkpoint within 120 s"
        time.sleep(0.05)


def test_preemption_and_a_dead_host_then_resume(easy_data, two_by_two, tmp_path):
    run = tmp_path / "run"
    args = _train_args(easy_data, run, tmp_path / "cache", {})

    # SIGTERM to one host: both save at one agreed step and exit 42.
    procs = _start_hosts([args, args], devices=2)
    try:
        _wait_for_checkpoint(run, procs, after=0)
        procs[1].send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=90)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [42, 42], outputs
    stopped = _latest_checkpoint(run)
    assert 0 < stopped < 24 and not (run / "_SUCCESS").exists()

    # SIGKILL one host after the resumed run's next checkpoint: the other exits non-zero within 30 s. It gives
    # its silent peer up after 5 s without a heartbeat, not the local launcher's 10 s, and the test waits that.
    procs = _start_hosts([args, args], devices=2, env={distributed.ENV_HEARTBEAT_TIMEOUT: "5"})
    try:
        _wait_for_checkpoint(run, procs, after=stopped)
        procs[1].kill()
        killed_at = time.time()
        procs[0].communicate(timeout=60)
        waited = time.time() - killed_at
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0 and waited < 30, (procs[0].returncode, waited)
    assert not (run / "_SUCCESS").exists()

    # A relaunch resumes from the latest checkpoint and ends exactly like the uninterrupted run.
    done = _launch(2, 2, args)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "resuming from step" in done.stdout
    assert _final(run)["params_sha256"] == _final(two_by_two)["params_sha256"]
    assert _final(run)["test"] == _final(two_by_two)["test"]
    assert "host 1" in (run / "logs" / "host-1.log").read_text()
    # Every host read every program from the compilation cache that the hosts of `two_by_two` wrote, host 1
    # included (distributed.cache_from_every_process): neither compiled one again.
    for host in (0, 1):
        phases = last_record((run / "logs" / f"host-{host}.log").read_text())["phases"].values()
        assert sum(p["cache_misses"] for p in phases) == 0 and sum(p["cache_hits"] for p in phases) > 0, host


# Runs in a fresh process with 4 CPU devices: a train step's gradients and its compiled HLO.
STEP_PROBE = textwrap.dedent(
    r"""
    import json, re, sys
    import jax, numpy as np
    from trm.config import BASE_CONFIG, load_config
    from trm.data.format import load_split
    from trm.data.verify import fetch_dataset
    from trm.model.config import ModelConfig
    from trm.train.batches import TrainBatches
    from trm.train.step import ModelTemplate, TrainStep, init_state

    data, cache, sets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    split = load_split(fetch_dataset(data, cache), "train")
    out = {}
    for name, (extra, probes) in sets.items():
        config = load_config(BASE_CONFIG, [f"{k}={v}" for k, v in extra.items()], base=None)
        model = ModelTemplate(ModelConfig.from_dict(config["arch"], split.metadata), seed=0)
        step = TrainStep(model, config, total_steps=10)
        state = init_state(model, config, 16)
        batch = TrainBatches(split, 16, 1, seed=0).batch(0).as_dict()
        out[name] = {"param_leaves": len(jax.tree.leaves(state.params))}
        if "grads" in probes:
            carry, metrics, grads = step.gradients(state, batch, 0.0, (2, 2))
            out[name]["grads"] = [np.asarray(g).tolist() for g in jax.tree.leaves(grads)]
            out[name]["carry"] = [np.asarray(c).tolist() for c in jax.tree.leaves(carry)]
            out[name]["metrics"] = {k: float(v) for k, v in metrics.items()}
        if "hlo" in probes:
            # The program "grads" ran, which holds the step's collectives (the update that follows adds none;
            # tests/test_tpu_compile.py counts the whole step's for TPU slices): read back, not compiled again.
            hlo = step.lower_gradients(state, batch, 0.0, (2, 2)).compile().as_text()
            out[name]["all_reduces"] = len(re.findall(r"\ball-reduce(?:-start)?\(", hlo))
    print(json.dumps(out))
    """
)


def test_gradient_accumulation_and_one_fused_all_reduce(easy_data, tmp_path):
    base = {**TINY, "train.global_batch_size": 16}
    # Two compilations on 4 devices (each costs seconds on 2 cores): accumulation in 2 parts against the whole
    # batch; the collective count of both (tests/test_tpu_compile.py checks the whole step's for a TPU v4-64 too).
    sets = {
        "whole": (base, ["grads", "hlo"]),
        "two_parts": ({**base, "train.micro_batches": 2}, ["grads", "hlo"]),
    }
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}
    done = subprocess.run(
        [sys.executable, "-c", STEP_PROBE, easy_data, str(tmp_path / "cache"), json.dumps(sets)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.splitlines()[-1])
    whole = out["whole"]
    for name in ("two_parts",):
        for g, ref in zip(out[name]["grads"], whole["grads"], strict=True):
            ref = np.asarray(ref)
            np.testing.assert_allclose(
                np.asarray(g), ref, rtol=1e-4, atol=1e-6 * max(np.abs(ref).max(), 1e-3)
            )
        for c, ref in zip(out[name]["carry"], whole["carry"], strict=True):
            np.testing.assert_allclose(np.asarray(c), np.asarray(ref), rtol=1e-5, atol=1e-5)
        assert out[name]["metrics"] == pytest.approx(whole["metrics"], rel=1e-5, abs=1e-6)

    # Gradients of all parameters (many leaves), the metric sums and the touched puzzle rows travel in one
    # combined all-reduce per step, however many micro-batches: accumulation sums the parts on each device
    # before the one all-reduce.
    counts = {name: (probe["param_leaves"], probe.get("all_reduces")) for name, probe in out.items()}
    assert whole["param_leaves"] >= 8, counts  # the tiny model has 8 parameter leaves
    assert whole["all_reduces"] == out["two_parts"]["all_reduces"] == 1, counts


def test_batch_not_divisible_by_devices_is_rejected_before_compiling(easy_data, tmp_path):
    done = _launch(1, 3, _train_args(easy_data, tmp_path / "run", tmp_path / "cache", {}), timeout=90)
    assert done.returncode == 2
    assert (
        "train.global_batch_size=8 must be divisible by train.micro_batches (1) x the number of devices (3)"
        in done.stderr  # refused by the launcher, before any host starts
    )
    assert not (tmp_path / "run").exists()

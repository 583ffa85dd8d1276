"""`trm canary`: a few minutes on this machine's devices before a study commits hours to them: go or no-go.

    trm canary --data DATA --out DIR [--config FILE --set KEY=VALUE] [--steps 30]

Runs the baseline (or the given config) where the study will run it, and checks, each on one line of its page:

  kernel       the fused MLP-T kernel against the plain formulation on this device (trm/train/kernel_check.py),
               where the train step uses it
  logits       the initial weights' first-step logits on this device against this host's CPU, same batch
               (trm/train/first_logits.py)
  loss         --steps real train steps: every loss finite, and the mean of the last 5 below the first 5's
  replicas     every host holds bit-identical parameters after them (their digests)
  checkpoint   the state written to DIR/ckpt, restored, and its parameters bit-identical to those written
  step time    the median step (after the first, which compiles), per step shape (trm/study/measured.py step_key)

It prints the page and exits 0 (go) or 1 (no-go); DIR/canary.json holds every figure, and DIR holds the markers
a trainer leaves in its run dir (status.json with a heartbeat, "failed" on a no-go; _SUCCESS on a go), which the
tpu-vm launcher of a workflow's canary job watches. With --results (the
workflow's results folder), a go also writes the step time where the plan reads it: RESULTS/measured/, one file
per step program and device count, from which `snakemake -n` prices those runs' training ("measured"). Run it on every host of a
job as `trm train` runs (the same --coordinator and --process-id options).

    trm canary --report DIR [--results RESULTS]

On the controller, after the hosts of a workflow's canary job (`snakemake canary`; trm/study/canary_job.py) ran it
with --out DIR: prints the page of DIR/canary.json and exits 0 (go) or 1 (no-go, or no page: the hosts did not
finish); a go writes its step time into RESULTS/measured/, for the config the hosts ran (DIR/config.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import threading
import time
from typing import NamedTuple

from trm import storage
from trm.config import add_config_arguments, resolve_config_arguments
from trm.errors import UserError, number
from trm.run import distributed, layout
from trm.run import state as runstate
from trm.study.measured import measured_step_path, step_key

FIRST_LAST = 5  # steps averaged at each end of the loss curve


class Check(NamedTuple):
    name: str
    passed: bool
    figures: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, required=False)
    parser.add_argument(
        "--data", help="the puzzles to train on: a staged dataset URL or a built dataset folder (required)"
    )
    parser.add_argument("--out", metavar="DIR", help="folder for the checkpoint and canary.json (required)")
    parser.add_argument(
        "--report",
        metavar="DIR",
        help="instead of running: the page of the canary whose hosts wrote DIR (--out); see above",
    )
    parser.add_argument(
        "--steps",
        type=number(int, minimum=2 * FIRST_LAST),
        default=30,
        help="train steps to run (default %(default)s)",
    )
    parser.add_argument(
        "--results",
        metavar="DIR",
        help="the workflow's results folder (config/config.yaml `results`): write the measured step time there "
        "(DIR/measured/), where the plan prices training from it",
    )
    parser.add_argument("--cache-dir", default=None, help="local cache for a staged dataset's copy")
    distributed.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    if args.report:
        if given := [f"--{k}" for k in ("data", "out", "config") if getattr(args, k) is not None]:
            raise UserError(
                f"{', '.join(given)}: --report reads what the canary's hosts wrote, and runs nothing"
            )
        return report(args.report, args.results)
    if missing := [f"--{k}" for k in ("data", "out") if getattr(args, k) is None]:
        raise UserError(f"no {', '.join(missing)}: trm canary --data DATA --out DIR (or --report DIR)")
    distributed.initialize(distributed.options_from_args(args))  # before anything touches a device
    import jax

    config = resolve_config_arguments(args)
    writer = jax.process_index() == 0
    with _Heartbeat(args.out, writer):
        checks, record = run_canary(config, args.data, args.out, args.steps, args.cache_dir)
    go = all(c.passed for c in checks)
    text = page(checks, record)
    if writer:
        if args.results and go:  # only a step that ran right prices the study
            record["measured_step_file"] = write_measured(args.results, config, record)
        document = {**record, "go": go, "checks": [c._asdict() for c in checks]}
        storage.write_text(layout.path(args.out, layout.CANARY), json.dumps(document, indent=1) + "\n")
        if go:  # the markers a trainer leaves, which the tpu-vm launcher watches
            runstate.write_status(args.out, {"state": "finished"})
            storage.write_text(layout.path(args.out, layout.SUCCESS), "")
        else:
            runstate.write_status(args.out, {"state": "failed", "error": text.splitlines()[0]})
    print(text)
    return 0 if go else 1


class _Heartbeat:
    """status.json in the canary's folder as a trainer keeps it (trm/run/state.py): "running", refreshed every
    HEARTBEAT_S while the checks run, "failed" with the error if they raise. The tpu-vm launcher watches it (a
    workflow's canary job); written by process 0 only."""

    def __init__(self, out: str, writer: bool) -> None:
        self.out, self.writer, self.stop = out, writer, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            runstate.write_status(self.out, {"state": "running"})
            if self.stop.wait(runstate.HEARTBEAT_S):
                return

    def __enter__(self) -> _Heartbeat:
        if self.writer:
            self.thread.start()
        return self

    def __exit__(self, kind, error, _traceback) -> None:
        self.stop.set()
        if self.writer:
            self.thread.join()
            if error is not None:
                runstate.write_status(self.out, {"state": "failed", "error": str(error) or kind.__name__})


def write_measured(results: str, config: dict, record: dict) -> str:
    """Write the step time of a go's `record` where the plan reads it (RESULTS/measured/); returns the file."""
    measured = {k: record[k] for k in ("step_s", "step_key", "devices", "device_kind", "platform")}
    path = measured_step_path(results, config, record["devices"])
    storage.write_text(path, json.dumps(measured, indent=1) + "\n")
    return path


def report(out: str, results: str | None) -> int:
    """The page of the canary whose hosts wrote `out`, and on a go its step time written under `results`: 0 go,
    1 no-go (see the module docstring)."""
    path = layout.path(out, layout.CANARY)
    if not storage.exists(path):
        raise UserError(
            f"no canary page {path}: the canary's hosts did not finish (their output: the job's log)"
        )
    document = storage.read_json(path, "canary page not found", "run the canary again")
    checks = [Check(**check) for check in document["checks"]]
    print(page(checks, document))
    if document["go"] and results:
        config = layout.read_config(layout.path(out, layout.CONFIG))
        print(f"measured step time written to {write_measured(results, config, document)}")
    return 0 if document["go"] else 1


def page(checks: list[Check], record: dict) -> str:
    """The go / no-go page: a verdict line, then each check with its figures."""
    go = all(c.passed for c in checks)
    failed = [c.name for c in checks if not c.passed]
    lines = [
        f"canary on {record['devices']} {record['device_kind']} devices ({record['hosts']} hosts): "
        + ("GO" if go else f"NO-GO ({', '.join(failed)})")
    ]
    lines += [f"  {'ok ' if c.passed else 'FAIL'} {c.name + ':':<12}{c.figures}" for c in checks]
    return "\n".join(lines)


def run_canary(
    config: dict, data: str, out: str, steps: int, cache_dir: str | None
) -> tuple[list[Check], dict]:
    """Every check of the canary on this process's devices, and the record of its figures."""
    import jax

    from trm.config import batch_split_problem, config_hash
    from trm.model.config import ModelConfig
    from trm.train import kernel_check
    from trm.train.evaluate_checkpoint import load_eval_split

    # The run's own warm-up would keep the learning rate near 0 for all the canary's steps (2000 at the
    # baseline): a third of them instead, so that the loss can fall. The step's program does not change.
    config = copy.deepcopy(config)
    warmup = config["optim"]["lr_warmup_steps"] = min(config["optim"]["lr_warmup_steps"], steps // 3)
    mesh = distributed.data_mesh()
    if problem := batch_split_problem(config["train"], mesh.size):
        raise UserError(problem)
    # Every host runs the same config. The first collective also sets up the hosts' CPU collectives (gloo) while
    # they are in step: set up at the first train step instead, it fails after 30 s when one host compiles slower.
    distributed.check_hosts_agree("the canary's config", config_hash(config))
    split = load_eval_split(data, "train", cache_dir or os.path.join(out, "cache"))
    cfg = ModelConfig.from_dict(config["arch"], split.metadata)
    device = jax.local_devices()[0]
    record = {
        "devices": mesh.size,
        "hosts": jax.process_count(),
        "platform": device.platform,
        "device_kind": device.device_kind,
        "step_key": step_key(config, mesh.size),
        "lr_warmup_steps": warmup,
    }
    checks = []
    try:
        result = kernel_check.check(config, cfg, mesh.size)
    except UserError as err:  # a `fused` that cannot run here
        result, checks = None, [Check("kernel", False, str(err))]
    if result is not None:
        record["kernel"] = result
        worst = result["worst"]
        checks.append(
            Check(
                "kernel",
                result["passed"],
                f"{worst} differs by {result['relative_errors'][worst]:.3g} of its scale, tolerance "
                f"{result['tolerance']:.3g} ({result['dtype']}); off: arch.mlp_t_kernel=plain",
            )
        )
    elif not checks:
        checks.append(
            Check("kernel", True, "not used by this step (the plain formulation): nothing to check")
        )
    checks += _train_and_restore(config, cfg, split, out, steps, record, mesh)
    return on_every_host(checks), record


def on_every_host(checks: list[Check]) -> list[Check]:
    """`checks` as every host found them: a check passes only where it passed on all hosts; one that passed here
    and failed on another host names it (its figures are in that host's output). A collective: every host must
    call it."""
    outcomes = distributed.gather_strings("".join("1" if c.passed else "0" for c in checks))
    merged = []
    for i, check in enumerate(checks):
        failed = [h for h, outcome in enumerate(outcomes) if outcome[i] == "0"]
        if check.passed and failed:
            where = f"; FAILED on host {', '.join(map(str, failed))} (its figures: that host's output)"
            check = Check(check.name, False, check.figures + where)
        merged.append(check)
    return merged


def _logits_check(model, batch: dict, record: dict) -> Check:
    """The initial weights' first-step logits on this device against its CPU's (trm/train/first_logits.py)."""
    from trm.train import first_logits

    try:
        result = record["logits"] = first_logits.compare_logits(model, batch)
    except RuntimeError as err:  # no CPU backend beside the accelerator
        return Check("logits", False, f"not compared: {str(err).splitlines()[0]}")
    return Check(
        "logits",
        result["passed"],
        f"step 1 on this {result['device']} against its CPU, {result['rows']} rows: differ by "
        f"{result['relative_error']:.3g} of their scale, tolerance {result['tolerance']:.3g} ({result['dtype']})",
    )


def _train_and_restore(config, cfg, split, out: str, steps: int, record: dict, mesh) -> list[Check]:
    """`steps` train steps, then the replicas' digests and a checkpoint written, restored and compared."""
    import jax

    from trm.train.batches import TrainBatches
    from trm.train.checkpoint import Checkpointer
    from trm.train.schedule import cycles_at, halt_exploration_at
    from trm.train.step import ModelTemplate, TrainStep, init_state

    train = config["train"]
    batch = train["global_batch_size"]
    model = ModelTemplate(cfg, seed=train["seed"])
    state = init_state(model, config, batch, mesh)
    step = TrainStep(model, config, steps, mesh)
    batches = TrainBatches(
        split, batch, train["eval_interval"], train["seed"], jax.process_index(), jax.process_count()
    )
    checks = [_logits_check(model, batches.batch(0).as_dict(), record)]
    losses, seconds = [], []
    for i in range(steps):
        started = time.perf_counter()
        cycles = cycles_at(batches.epoch_at(i), config)
        exploration = halt_exploration_at(i, steps, config)
        state, metrics = step(state, batches.batch(i).as_dict(), exploration, cycles, update=i + 1)
        losses.append(float(metrics["lm_loss"]) / batch)  # waits for the step
        seconds.append(time.perf_counter() - started)
    first = statistics.fmean(losses[:FIRST_LAST])
    last = statistics.fmean(losses[-FIRST_LAST:])
    step_s = statistics.median(seconds[1:])
    record.update(losses=losses, step_seconds=seconds, step_s=step_s, first_step_s=seconds[0])
    finite = all(math.isfinite(x) for x in losses)
    checks += [
        Check(
            "loss",
            finite and last < first,
            f"{steps} steps (warm-up {config['optim']['lr_warmup_steps']}), mean of the first {FIRST_LAST} "
            f"{first:.4g}, of the last {FIRST_LAST} {last:.4g}"
            + ("" if finite else f"; {sum(not math.isfinite(x) for x in losses)} not finite"),
        )
    ]
    digests = distributed.gather_strings(distributed.params_digest(state.params))
    differ = [i for i, d in enumerate(digests) if d != digests[0]]
    record["hosts_params_sha256"] = digests
    checks.append(
        Check(
            "replicas",
            not differ,
            f"{len(digests)} hosts, parameters sha256 {digests[0][:12]}"
            + (f"; hosts {', '.join(map(str, differ))} differ from host 0" if differ else ", all equal"),
        )
    )
    checkpoints = Checkpointer(layout.path(out, layout.CHECKPOINTS), keep=1, every_steps=steps)
    started = time.perf_counter()
    checkpoints.save(steps, state, {"canary": True})
    checkpoints.wait()
    restored, _ = checkpoints.restore(steps, init_state(model, config, batch, mesh))
    same = distributed.params_digest(restored.params) == distributed.params_digest(state.params)
    checks.append(
        Check(
            "checkpoint",
            same,
            f"step {steps} written to {layout.path(out, layout.CHECKPOINTS)} and restored in "
            f"{time.perf_counter() - started:.2f} s: parameters {'identical' if same else 'DIFFER'}",
        )
    )
    checks.append(
        Check(
            "step time",
            True,
            f"{step_s * 1e3:.4g} ms per step (median after the first, which took {seconds[0]:.3g} s with its "
            f"compilation), batch {batch} on {mesh.size} devices",
        )
    )
    return checks

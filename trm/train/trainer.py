"""Train a TRM on a staged dataset, resuming exactly from the latest checkpoint in the run dir.

    trm train --config config/experiments/exp01a.yaml --data file:///.../datasets/p1000-a1000 --run-dir DIR

The run dir (a local path, file:// or gs:// URL) receives config.json (the resolved config), metrics.jsonl
(train and eval records, one JSON object per line), ckpt/ (orbax checkpoints of the whole training state),
final.json (final evaluation on the full test split, the best evaluation of the run, parameter digests), status.json (state, progress and a
heartbeat, read by `trm status` and the TPU launcher; see trm/train/runstate.py) and _SUCCESS (written last).

Running the same command again after a kill or preemption continues from the latest checkpoint and ends with
the same parameters as an uninterrupted run. SIGTERM/SIGINT save a checkpoint and exit with code 42.
Exit codes: 0 finished, 2 bad input, 42 stopped early (resumable).

Multi-host (one process per host, see `trm launch` and trm/launch/distributed.py): every process runs this
same command with the same config. Process 0 writes config.json, metrics.jsonl, final.json and _SUCCESS; every
process verifies it holds the same config and code as the others, trains on its own rows of each global batch,
writes logs/host-{i}.log and takes part in every checkpoint. SIGTERM to any host (a preemption notice) makes all
hosts save at one agreed step and exit 42. Any other failure ends the process at once with a non-zero code, and
the other hosts follow within a heartbeat timeout. `--run-dir` may contain `{config_hash}`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import jax
import numpy as np

from trm import storage
from trm.analysis.run_metrics import best_evaluation
from trm.config import BASE_CONFIG, config_hash, dump_config, load_config
from trm.data.format import load_split
from trm.data.verify import fetch_dataset
from trm.errors import UserError
from trm.launch import distributed
from trm.model.config import ModelConfig
from trm.train.checkpoint import Checkpointer
from trm.train.data import TrainBatches, eval_batches
from trm.train.hostlog import HostLog
from trm.train.optim import dense_lr_schedule
from trm.train.runstate import TrainerStatus, mark_setup_failed
from trm.train.schedule import cycles_at, halt_exploration_at
from trm.train.step import EvalStep, Model, TrainState, TrainStep, check_train_config, init_state

EXIT_PREEMPTED = 42
DEFAULT_CACHE = os.environ.get("TRM_CACHE_DIR", str(Path.home() / ".cache" / "trm" / "datasets"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        help="experiment YAML (overrides of config/base.yaml) or a "
        "resolved config.json (complete; no base needed)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set train.epochs=10 (repeatable)",
    )
    parser.add_argument("--data", required=True, help="URL of the staged dataset (gs://, file:// or a path)")
    parser.add_argument(
        "--run-dir",
        required=True,
        help="URL of the run directory (created if missing); {config_hash} is replaced by the config's hash",
    )
    parser.add_argument(
        "--cache-dir",
        default=DEFAULT_CACHE,
        help="local cache for the dataset copy (default: %(default)s, or $TRM_CACHE_DIR)",
    )
    parser.add_argument("--log-every", type=int, default=50, help="train metrics every N steps (default 50)")
    parser.add_argument(
        "--wandb",
        action="store_true",
        help="also log to Weights & Biases (needs the wandb package; WANDB_MODE=offline works)",
    )
    distributed.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    options = distributed.options_from_args(args)
    distributed.initialize(options)  # before anything touches a device
    host_log = HostLog()
    try:
        if options.mode == "off":
            return _train(args, host_log)
        return _train_as_host(args, host_log)
    finally:
        host_log.close()


def _train(args: argparse.Namespace, host_log: HostLog) -> int:
    config = load_config(args.config, args.set, base=None if args.config.endswith(".json") else BASE_CONFIG)
    if args.log_every < 1:
        raise UserError(f"--log-every {args.log_every}: must be >= 1")
    run_dir = args.run_dir.replace("{config_hash}", config_hash(config))
    try:
        trainer = Trainer(config, args.data, run_dir, args.cache_dir, args.log_every, args.wandb, host_log)
    except BaseException as err:
        # A setup failure (no dataset, bad data, storage unreachable) still ends the run with a reason.
        mark_setup_failed(run_dir, config, f"{type(err).__name__}: {err}", writer=jax.process_index() == 0)
        raise
    return trainer.run()


def _train_as_host(args: argparse.Namespace, host_log: HostLog) -> int:
    """One process of a multi-host job: `_train`, but a failure ends the process at once.

    os._exit skips Python's cleanup: a normal exit would wait in JAX's shutdown barrier for hosts that may be
    blocked in a collective. The other hosts then fail on the lost heartbeat. Success and preemption exit
    normally, all hosts together.
    """
    try:
        return _train(args, host_log)
    except UserError as err:
        print(f"trm train: error: {err}", file=sys.stderr)
        code = err.exit_code
    except BaseException:
        traceback.print_exc()
        code = 1
    print(f"host {jax.process_index()} exits with code {code}", file=sys.stderr)
    host_log.close()
    os._exit(code)


def params_digest(tree: Any) -> str:
    """sha256 over the bytes of every leaf in a fixed order: equal digests mean bit-identical parameters.

    Hashes this process's own copy of replicated arrays, so hosts can compare their copies.
    """
    digest = hashlib.sha256()
    for path, leaf in sorted(
        jax.tree_util.tree_leaves_with_path(tree), key=lambda kv: jax.tree_util.keystr(kv[0])
    ):
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.ascontiguousarray(distributed.local_copy(leaf)).tobytes())
    return digest.hexdigest()


class MetricsLog:
    """metrics.jsonl in the run dir, rewritten whole at each flush (GCS objects cannot be appended to).

    Only the writer (process 0) reads or writes the file; on other hosts the log is inert.
    """

    def __init__(self, url: str, resume_step: int, writer: bool = True) -> None:
        self.url = url
        self.writer = writer
        self.records: list[dict] = []
        if writer and storage.exists(url):
            # Drop records written after the checkpoint we resume from: they will be written again.
            for line in storage.read_text(url).splitlines():
                if line.strip() and json.loads(line)["step"] <= resume_step:
                    self.records.append(json.loads(line))

    def add(self, record: dict) -> None:
        self.records.append(record)

    def flush(self) -> None:
        if self.writer:
            storage.write_text(self.url, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.records))


def halt_step_moments(sums: dict[str, float], count: float) -> dict[str, float | None]:
    """Mean and variance of the supervision steps at which the counted rows halted, from metric sums (the
    variance is None for sums saved by a version without `steps_sq`, in a resumed run's first window)."""
    mean = sums["steps"] / count
    variance = max(sums["steps_sq"] / count - mean * mean, 0.0) if "steps_sq" in sums else None
    return {"steps": mean, "steps_variance": variance}


class MetricWindow:
    """Metric sums of the steps since the last train record.

    Kept as device arrays (no host sync per step) and saved in each checkpoint's record, so a run resumed
    mid-window logs exactly the records an uninterrupted run logs.
    """

    def __init__(self, steps: int = 0, sums: dict[str, float] | None = None) -> None:
        self.steps = steps
        self._parts: list[dict] = [sums] if sums else []

    @classmethod
    def from_record(cls, record: dict) -> MetricWindow:
        saved = record.get("metric_window") or {"steps": 0, "sums": None}
        return cls(saved["steps"], saved["sums"])

    def add(self, metrics: dict) -> None:
        self._parts.append(metrics)
        self.steps += 1

    def clear(self) -> None:
        self._parts, self.steps = [], 0

    def sums(self) -> dict[str, float]:
        return {
            k: float(sum(np.asarray(part[k], np.float64) for part in self._parts)) for k in self._parts[0]
        }

    def to_record(self) -> dict:
        return {"steps": self.steps, "sums": self.sums() if self._parts else None}


class Trainer:
    def __init__(
        self,
        config: dict,
        data_url: str,
        run_dir: str,
        cache_dir: str,
        log_every: int,
        use_wandb: bool,
        host_log: HostLog | None = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.log_every = log_every
        self.train_cfg = config["train"]
        self.host_log = host_log
        self.process_index, self.process_count = jax.process_index(), jax.process_count()
        self.is_writer = self.process_index == 0
        self.mesh = distributed.data_mesh()
        tc = self.train_cfg
        check_train_config(tc, self.mesh.size)
        self._check_run_dir()
        if host_log is not None:
            host_log.attach(storage.join(run_dir, "logs", f"host-{self.process_index}.log"))
        print(
            f"host {self.process_index} of {self.process_count}: {jax.local_device_count()} of "
            f"{jax.device_count()} devices, config {config_hash(config)}, code {distributed.code_version()}",
            file=sys.stderr,
        )

        dataset_dir = fetch_dataset(data_url, cache_dir)  # every host reads its own local copy
        self.train_split = load_split(dataset_dir, "train")
        self.test_split = load_split(dataset_dir, "test")
        self.model_cfg = ModelConfig.from_dict(config["arch"], self.train_split.metadata)
        _check_compatible(self.train_split.metadata, self.test_split.metadata)

        self.batches = TrainBatches(
            self.train_split,
            tc["global_batch_size"],
            tc["eval_interval"],
            tc["seed"],
            self.process_index,
            self.process_count,
        )
        self.total_steps = (tc["epochs"] // tc["eval_interval"]) * self.batches.batches_per_iter
        self.lr = dense_lr_schedule(config["optim"], self.total_steps)
        self.model = Model(self.model_cfg, seed=tc["seed"])
        self.train_step = TrainStep(self.model, config, self.total_steps, self.mesh)
        self.eval_step = EvalStep(self.model, tc["eval_steps"], self.mesh)
        self.checkpoints = Checkpointer(
            storage.join(run_dir, "ckpt"),
            keep=tc["keep_checkpoints"],
            every_steps=tc["checkpoint_every_steps"],
        )
        self.wandb = _start_wandb(config, run_dir) if use_wandb and self.is_writer else None
        self._stop_signal: int | None = None
        self.status = TrainerStatus(
            run_dir,
            self.is_writer,
            config_hash=config_hash(config),
            total_steps=self.total_steps,
            total_epochs=self.batches.epoch_at(self.total_steps),
            global_batch_size=tc["global_batch_size"],
            hosts=self.process_count,
            devices=jax.device_count(),
            slice=os.environ.get("TRM_SLICE") or None,
        )

    def _check_run_dir(self) -> None:
        """A run dir belongs to one config, and every host must train that same config with the same code.

        Every host reads config.json (not just process 0: there is no shared filesystem on a pod), and each
        check is agreed by a collective, so all hosts fail together with the same message.
        """
        own = config_hash(self.config)
        distributed.check_hosts_agree(
            "config hash and code version", f"config {own}, code {distributed.code_version()}"
        )
        url = storage.join(self.run_dir, "config.json")
        existing = _config_hash_at(url)
        distributed.check_hosts_agree(f"the config hash found in {url}", str(existing))
        if existing is not None and existing != own:
            raise UserError(
                f"{url} holds config {existing}, not this run's {own}: use a new --run-dir for a different config"
            )
        if existing is None and self.is_writer:
            storage.write_text(url, dump_config(self.config))
        if self.process_count > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("config.json written")
            distributed.check_hosts_agree(f"the config hash read back from {url}", str(_config_hash_at(url)))

    def run(self) -> int:
        """Train to the end (0) or until a stop signal (EXIT_PREEMPTED); status.json says which, or "failed"."""
        try:
            return self._run()
        except BaseException as err:
            # Only what process 0 sees: a host killed outright leaves "running" behind, and its stale heartbeat
            # shows the run as lost.
            try:
                self.status.write("failed", error=f"{type(err).__name__}: {err}"[:2000])
            except Exception as marker_err:  # storage may be what failed: keep the original error
                print(f"could not write status.json: {marker_err}", file=sys.stderr)
            raise

    def _run(self) -> int:
        state = init_state(
            self.model, self.config, self.total_steps, self.train_cfg["global_batch_size"], self.mesh
        )
        start = self.checkpoints.latest_step()
        window = MetricWindow()
        if start is not None:
            state, record = self.checkpoints.restore(start, state)
            window = MetricWindow.from_record(record)
            print(f"resuming from step {start} of {self.total_steps}", file=sys.stderr)
        start = start or 0
        self.status.write("running", step=start, epoch=self.batches.epoch_at(start))
        metrics_log = MetricsLog(storage.join(self.run_dir, "metrics.jsonl"), start, writer=self.is_writer)
        self._install_signal_handlers()
        started = time.time()
        state = self._train(state, start, metrics_log, window)
        if self._stop_signal is not None:
            step = int(state.step)
            self._save(state, step, started, window)
            self.checkpoints.wait()
            metrics_log.flush()
            self.status.write("preempted", step=step, epoch=self.batches.epoch_at(step))
            print(f"stopped by signal {self._stop_signal} at step {step}; checkpoint saved", file=sys.stderr)
            return EXIT_PREEMPTED
        final = self._evaluate(state, limit=None)
        metrics_log.add(
            {
                "kind": "eval",
                "split": "test",
                "subset": None,
                "step": self.total_steps,
                "epoch": self.batches.epoch_at(self.total_steps),
                **final,
            }
        )
        metrics_log.flush()
        self._save(state, self.total_steps, started, window)
        self.checkpoints.wait()
        # Every host's own copy of the parameters, so a test (or a user) can see that all replicas agree.
        host_params = distributed.gather_strings(params_digest(state.params))
        host_ema = distributed.gather_strings(params_digest(state.ema)) if state.ema is not None else None
        summary = {
            "config_hash": config_hash(self.config),
            "code_version": distributed.code_version(),
            "processes": self.process_count,
            "devices": jax.device_count(),
            "steps": self.total_steps,
            "epochs": self.batches.epoch_at(self.total_steps),
            "test": final,
            "best_test": best_evaluation(metrics_log.records),  # the record kept across resumes (writer)
            "params_sha256": host_params[0],
            "ema_sha256": host_ema[0] if host_ema else None,
            "hosts_params_sha256": host_params,
            "hosts_ema_sha256": host_ema,
            "compilations": self.train_step.compilations,
        }
        if self.process_count > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("checkpoints committed")
        if self.is_writer:
            storage.write_text(
                storage.join(self.run_dir, "final.json"), json.dumps(summary, indent=2, sort_keys=True)
            )
            self.status.write(
                "finished",
                step=self.total_steps,
                epoch=summary["epochs"],
                eval_exact_accuracy=final["exact_accuracy"],
                eval_step=self.total_steps,
            )
            storage.write_text(storage.join(self.run_dir, "_SUCCESS"), "")
        if self.wandb:
            self.wandb.log({f"final/{k}": v for k, v in final.items()}, step=self.total_steps)
            self.wandb.finish()
        print(json.dumps({"final_test": final}), file=sys.stderr)
        return 0

    def _train(
        self, state: TrainState, start: int, metrics_log: MetricsLog, window: MetricWindow
    ) -> TrainState:
        """Train from step `start`; `window` holds the metrics of steps since the last train record."""
        from tqdm import tqdm

        tc = self.train_cfg
        window_start = time.time()
        progress = tqdm(
            total=self.total_steps,
            initial=start,
            desc="train",
            unit="step",
            disable=None if self.is_writer else True,
        )
        for step in range(start, self.total_steps):
            cycles = cycles_at(self.batches.epoch_at(step), self.config)
            exploration = halt_exploration_at(step, self.total_steps, self.config)
            state, metrics = self.train_step(state, self.batches.batch(step).as_dict(), exploration, cycles)
            window.add(metrics)
            done = step + 1
            progress.update(1)
            if done % self.log_every == 0 or done == self.total_steps:
                record = self._train_record(done, window, time.time() - window_start, cycles, exploration)
                metrics_log.add(record)
                if self.wandb:
                    self.wandb.log({f"train/{k}": v for k, v in record.items()}, step=done)
                window.clear()
                window_start = time.time()
                # Recorded now, written with the next checkpoint or heartbeat: a GCS write per record would slow
                # fast steps.
                self.status.record(examples_per_s=record["examples_per_s"])
            end_of_interval = done % self.batches.batches_per_iter == 0 and done < self.total_steps
            if end_of_interval:
                evaluation = self._evaluate(state, limit=tc["eval_subset"])
                metrics_log.add(
                    {
                        "kind": "eval",
                        "split": "test",
                        "subset": tc["eval_subset"],
                        "step": done,
                        "epoch": self.batches.epoch_at(done),
                        **evaluation,
                    }
                )
                progress.write(f"step {done}: eval exact_accuracy {evaluation['exact_accuracy']:.4f}")
                self.status.record(eval_exact_accuracy=evaluation["exact_accuracy"], eval_step=done)
            if end_of_interval or (self.checkpoints.due(done) and done < self.total_steps):
                metrics_log.flush()
                self._save(state, done, window_start, window)
                self.status.write("running", step=done, epoch=self.batches.epoch_at(done))
            self.status.heartbeat(step=done, epoch=self.batches.epoch_at(done))
            if self.host_log is not None:
                self.host_log.maybe_flush()
            if self._stop_requested(done):
                break
        progress.close()
        return state

    def _train_record(self, step: int, window: MetricWindow, seconds: float, cycles, exploration) -> dict:
        sums = window.sums()
        examples = window.steps * self.train_cfg["global_batch_size"]
        count = max(sums["count"], 1.0)
        return {
            "kind": "train",
            "step": step,
            "epoch": self.batches.epoch_at(step),
            "lr": float(self.lr(step)),
            "examples_per_s": examples / max(seconds, 1e-9),
            "lm_loss": sums["lm_loss"] / examples,
            "q_halt_loss": sums["q_halt_loss"] / examples,
            "count": sums["count"],
            **{k: sums[k] / count for k in ("accuracy", "exact_accuracy", "q_halt_accuracy")},
            **halt_step_moments(sums, count),
            "H_cycles": cycles[0],
            "L_cycles": cycles[1],
            "halt_exploration_prob": float(exploration),
        }

    def _evaluate(self, state: TrainState, limit: int | None) -> dict:
        """Metrics of the final supervision step, averaged over the real (unpadded) test puzzles."""
        sums: dict[str, float] = {}
        batches = eval_batches(
            self.test_split,
            self.train_cfg["global_batch_size"],
            limit,
            self.process_index,
            self.process_count,
        )
        for batch in batches:
            for k, v in self.eval_step(state, batch.as_dict()).items():
                sums[k] = sums.get(k, 0.0) + float(v)
        count = max(sums.pop("count"), 1.0)
        moments = halt_step_moments(sums, count)
        means = {k: v / count for k, v in sums.items() if k not in ("steps", "steps_sq")}
        return {"count": count, **means, **moments}

    def _save(self, state: TrainState, step: int, started: float, window: MetricWindow) -> None:
        record = {
            "config_hash": config_hash(self.config),
            "epoch": self.batches.epoch_at(step),
            "wall_seconds": time.time() - started,
            "metric_window": window.to_record(),
        }
        self.checkpoints.save(step, state, record)

    def _install_signal_handlers(self) -> None:
        """One process: SIGTERM/SIGINT set a flag checked after each step. Several: JAX's preemption service
        catches SIGTERM on any host and `_stop_requested` makes all hosts stop after the same step."""
        if self.process_count > 1:
            return

        def stop(signum, _frame):
            self._stop_signal = signum

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)

    def _stop_requested(self, done: int) -> bool:
        # Without the preemption service (JAX_ENABLE_PREEMPTION_SERVICE=false) SIGTERM simply kills a host.
        if self.process_count > 1 and jax.config.jax_enable_preemption_service:
            from jax.experimental import multihost_utils

            if multihost_utils.reached_preemption_sync_point(done):
                self._stop_signal = signal.SIGTERM
        return self._stop_signal is not None


def _config_hash_at(url: str) -> str | None:
    """Hash of the config stored at `url`, None when there is none."""
    if not storage.exists(url):
        return None
    return config_hash(json.loads(storage.read_text(url)))


def _check_compatible(train_meta: dict, test_meta: dict) -> None:
    for key in ("vocab_size", "seq_len", "num_puzzle_identifiers", "pad_id", "ignore_label_id"):
        if train_meta.get(key) != test_meta.get(key):
            raise UserError(
                f"dataset splits disagree on {key}: train {train_meta.get(key)} vs test {test_meta.get(key)}"
            )


def _start_wandb(config: dict, run_dir: str):
    try:
        import wandb
    except ImportError as err:
        raise UserError("--wandb needs the wandb package: pip install wandb") from err
    run_id = f"trm-{config_hash(config)}"
    return wandb.init(
        project="trm-study", id=run_id, name=run_id, resume="allow", config=config, notes=f"run dir {run_dir}"
    )

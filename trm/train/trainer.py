"""One run's training loop: resume, train, evaluate, checkpoint, write the markers (see trm/train/train_command.py)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import jax

from trm import config as run_config
from trm import storage
from trm.errors import UserError
from trm.model.config import ModelConfig
from trm.run import distributed, layout
from trm.run.state import EXIT_PREEMPTED, TrainerStatus
from trm.run.timing import Timings
from trm.train.batches import TrainBatches
from trm.train.checkpoint import Checkpointer
from trm.train.ema import eval_params
from trm.train.evaluator import Evaluator, evaluate
from trm.train.final_evaluation import run_final_evaluation
from trm.train.hostlog import HostLog
from trm.train.kernel_check import check_run
from trm.train.records import MetricsLog, MetricWindow, best_evaluation, row_means
from trm.train.run_data import check_resumed_data, load_run_data
from trm.train.sampling import Sampling
from trm.train.schedule import cycles_at, halt_exploration_at
from trm.train.step import ModelTemplate, TrainState, TrainStep, check_train_config, init_state


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
        test_time_steps: tuple[int, ...] = (),
        timings: Timings | None = None,
        test_time_subset: int | None = None,
        config_hash: str | None = None,
        sampling: Sampling | None = None,
    ) -> None:
        self.timings = timings or Timings()
        self.config = config
        self.config_hash = config_hash or run_config.config_hash(config)  # a job's, from --config-hash
        self.data_url = data_url
        self.test_time_steps, self.test_time_subset = test_time_steps, test_time_subset
        self.sampling = sampling  # the final evaluation's sampled recursion, if any
        self.run_dir = run_dir
        self.log_every = log_every
        self.train_cfg = tc = config["train"]
        self.host_log = host_log
        self.process_index, self.process_count = jax.process_index(), jax.process_count()
        self.is_writer = self.process_index == 0
        self.mesh = distributed.data_mesh()
        check_train_config(tc, self.mesh.size)
        self._check_run_dir()
        if host_log is not None:
            host_log.attach(layout.host_log(run_dir, self.process_index))
        print(
            f"host {self.process_index} of {self.process_count}: {jax.local_device_count()} of "
            f"{jax.device_count()} devices, config {self.config_hash}, code {distributed.code_version()}",
            file=sys.stderr,
        )

        with self.timings.phase("data"):
            self.train_split, self.test_split = load_run_data(
                config, data_url, run_dir, cache_dir, self.is_writer
            )
        self.model_cfg = ModelConfig.from_dict(config["arch"], self.train_split.metadata)

        self.batches = TrainBatches(
            self.train_split,
            tc["global_batch_size"],
            tc["eval_interval"],
            tc["seed"],
            self.process_index,
            self.process_count,
        )
        self.total_steps = run_config.training_steps(config, self.batches.num_groups)
        self.model = ModelTemplate(self.model_cfg, seed=tc["seed"])
        self.kernel_check = check_run(config, self.model_cfg, self.mesh.size, run_dir, self.is_writer)
        self.train_step = TrainStep(self.model, config, self.total_steps, self.mesh)
        self.evaluator = Evaluator(self.model, (tc["eval_steps"],), self.mesh)
        self.checkpoints = Checkpointer(
            layout.path(run_dir, layout.CHECKPOINTS),
            keep=tc["keep_checkpoints"],
            every_steps=tc["checkpoint_every_steps"],
        )
        self.wandb = _start_wandb(config, self.config_hash, run_dir) if use_wandb and self.is_writer else None
        self._stop_signal: int | None = None
        self.status = TrainerStatus(
            run_dir,
            self.is_writer,
            attempt_start=self.timings.created,  # the command's start: its set-up is the run's time too
            config_hash=self.config_hash,
            total_steps=self.total_steps,
            total_epochs=self.batches.epoch_at(self.total_steps),
            global_batch_size=tc["global_batch_size"],
            hosts=self.process_count,
            devices=jax.device_count(),
            slice=os.environ.get("TRM_SLICE") or None,
        )

    def _check_run_dir(self) -> None:
        """A run dir belongs to one config and one dataset (refused before its log is written), and every host must
        train that same config with the same code.

        Every host reads config.json (not just process 0: there is no shared filesystem on a pod), and each
        check is agreed by a collective, so all hosts fail together with the same message.
        """
        own = f"config {self.config_hash}, code {distributed.code_version()}"
        distributed.check_hosts_agree("config hash and code version", own)
        url = layout.path(self.run_dir, layout.CONFIG)
        distributed.check_hosts_agree(
            f"the config hash found in {url}", str(layout.stored_config_hash(self.run_dir))
        )
        check_resumed_data(self.run_dir, self.data_url)
        layout.claim(self.run_dir, self.config, self.config_hash, write=self.is_writer)
        if self.process_count > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("config.json written")
            distributed.check_hosts_agree(
                f"the config hash read back from {url}", str(layout.stored_config_hash(self.run_dir))
            )

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
        with self.timings.phase("init"):
            state = init_state(self.model, self.config, self.train_cfg["global_batch_size"], self.mesh)
        start = self.checkpoints.latest_step()
        window = MetricWindow()
        if start is not None:
            with self.timings.phase("checkpoint"):
                state, record = self.checkpoints.restore(start, state)
            window = MetricWindow.from_record(record)
            print(f"resuming from step {start} of {self.total_steps}", file=sys.stderr)
        start = start or 0
        self.status.write("running", step=start, epoch=self.batches.epoch_at(start))
        metrics_log = MetricsLog(layout.path(self.run_dir, layout.METRICS), start, writer=self.is_writer)
        self._install_signal_handlers()
        started = time.time()
        state = self._train(state, start, metrics_log, window)
        if self._stop_signal is None:
            # Saved before the final evaluation: a job stopped during it resumes there, not in training.
            self._save(state, self.total_steps, started, window)
            with self.timings.phase("checkpoint"):
                self.checkpoints.wait()
            with self.timings.phase("evaluate"):
                final = self._final_evaluation(state)
        if self._stop_signal is not None:
            step = int(state.step)
            self._save(state, step, started, window)
            self.checkpoints.wait()
            metrics_log.flush()
            self.status.write("preempted", step=step, epoch=self.batches.epoch_at(step))
            print(f"stopped by signal {self._stop_signal} at step {step}; checkpoint saved", file=sys.stderr)
            return EXIT_PREEMPTED
        final_record = {"kind": "eval", "split": "test", "subset": None, "step": self.total_steps}
        if not any(r.items() >= final_record.items() for r in metrics_log.records):  # not resumed after it
            metrics_log.add({**final_record, "epoch": self.batches.epoch_at(self.total_steps), **final})
        metrics_log.flush()
        # Every host's own copy of the parameters, so a test (or a user) can see that all replicas agree.
        host_params = distributed.gather_strings(distributed.params_digest(state.params))
        host_ema = (
            distributed.gather_strings(distributed.params_digest(state.ema))
            if state.ema is not None
            else None
        )
        summary = {
            "config_hash": self.config_hash,
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
            "wall_time_s": self.status.elapsed(),  # over all attempts (the writer's status): the run's cost
        }
        if self.process_count > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("checkpoints committed")
        if self.is_writer:
            storage.write_text(
                layout.path(self.run_dir, layout.FINAL), json.dumps(summary, indent=2, sort_keys=True)
            )
            self.status.write(
                "finished",
                step=self.total_steps,
                epoch=summary["epochs"],
                eval_exact_accuracy=final["exact_accuracy"],
                eval_step=self.total_steps,
            )
            storage.write_text(layout.path(self.run_dir, layout.SUCCESS), "")
        if self.wandb:
            self.wandb.log({f"final/{k}": v for k, v in final.items()}, step=self.total_steps)
            self.wandb.finish()
        print(json.dumps({"final_test": final}), file=sys.stderr)
        print(json.dumps({"timings": self.timings.record()}), file=sys.stderr)
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
            done = step + 1
            with self.timings.phase("train"):
                state, metrics = self.train_step(
                    state, self.batches.batch(step).as_dict(), exploration, cycles, update=done
                )
                window.add(metrics)
                if done % self.log_every == 0 or done % self.batches.batches_per_iter == 0:
                    # Steps run asynchronously; what follows (a record, an evaluation) waits for them anyway:
                    # the wait is training time.
                    jax.block_until_ready(state)
            progress.update(1)
            if done % self.log_every == 0 or done == self.total_steps:
                record = self._train_record(done, window, time.time() - window_start, cycles, exploration)
                metrics_log.add(record)
                if self.wandb:
                    self.wandb.log({f"train/{k}": v for k, v in record.items() if v is not None}, step=done)
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
        return {
            "kind": "train",
            "step": step,
            "epoch": self.batches.epoch_at(step),
            "lr": self.train_step.lr(step),
            "examples_per_s": examples / max(seconds, 1e-9),
            "lm_loss": sums["lm_loss"] / examples,
            "q_halt_loss": sums["q_halt_loss"] / examples,
            "count": sums["count"],
            **row_means(sums),
            "H_cycles": cycles[0],
            "L_cycles": cycles[1],
            "halt_exploration_prob": float(exploration),
        }

    def _evaluate(self, state: TrainState, limit: int) -> dict:
        """The figures after train.eval_steps supervision steps (EMA weights when kept) on the first `limit` test
        puzzles (all when None), in batches of train.eval_batch_size: the same evaluation as `trm evaluate`."""
        with self.timings.phase("evaluate"):
            (record,) = evaluate(
                self.evaluator,
                self._eval_weights(state),
                self.test_split,
                run_config.eval_batch_size(self.train_cfg, self.mesh.size),
                limit,
            )
        return record

    def _final_evaluation(self, state: TrainState) -> dict | None:
        """test_time.json, sampled.json (trm/train/final_evaluation.py): the headline's figures; None if stopped."""
        self.status.write("running", step=self.total_steps, epoch=self.batches.epoch_at(self.total_steps))
        return run_final_evaluation(
            self.evaluator,
            self._eval_weights(state),
            self.test_split,
            run_dir=self.run_dir,
            counts=self.test_time_steps,
            headline=self.train_cfg["eval_steps"],
            subset=self.test_time_subset,
            sampling=self.sampling,
            batch_size=run_config.eval_batch_size(self.train_cfg, self.mesh.size),
            summary={
                "checkpoint": self.run_dir,
                "checkpoint_step": self.total_steps,
                "weights": "ema" if state.ema is not None else "params",
                "data": self.data_url,
            },
            writer=self.is_writer,
            stop=lambda batches: self._stop_requested(self.total_steps + batches),
            heartbeat=lambda: self.status.heartbeat(step=self.total_steps),
        )

    def _eval_weights(self, state: TrainState) -> tuple:
        return self.evaluator.put_weights(
            eval_params(state.params, state.ema), state.puzzle_emb, state.buffers
        )

    def _save(self, state: TrainState, step: int, started: float, window: MetricWindow) -> None:
        record = {
            "config_hash": self.config_hash,
            "epoch": self.batches.epoch_at(step),
            "wall_seconds": time.time() - started,
            "metric_window": window.to_record(),
        }
        with self.timings.phase("checkpoint"):
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


WANDB_MISSING = (
    "--wandb needs the wandb package: pip install -e '.[wandb]' (or pip install 'trm-study[wandb]')"
)


def _start_wandb(config: dict, digest: str, run_dir: str):
    try:
        import wandb
    except ImportError as err:
        raise UserError(WANDB_MISSING) from err
    run_id = f"trm-{digest}"
    return wandb.init(
        project="trm-study", id=run_id, name=run_id, resume="allow", config=config, notes=f"run dir {run_dir}"
    )

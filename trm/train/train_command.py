"""Train a TRM on a staged dataset, resuming exactly from the latest checkpoint in the run dir.

    trm train --config config/experiments/exp01a.yaml --data file:///.../datasets/p1000-a1000 --run-dir DIR

The run dir (a local path, file:// or gs:// URL) receives config.json (the resolved config), metrics.jsonl
(train and eval records, one JSON object per line), ckpt/ (orbax checkpoints of the whole training state),
test_time.json (the final evaluation: the whole test split scored after train.eval_steps, and after each
--test-time-steps count on the whole split in the same pass or, with --test-time-subset N, on a fixed subset of
N test puzzles; see trm/train/test_time.py), final.json (the final evaluation at
train.eval_steps, the best evaluation of the run, parameter digests), status.json (state, progress and a
heartbeat, read by `trm status` and the TPU launcher; see trm/run/state.py) and _SUCCESS (written last).

Running the same command again after a kill or preemption continues from the latest checkpoint and ends with
the same parameters as an uninterrupted run; one stopped during the final evaluation continues it after its last
saved batch. SIGTERM/SIGINT save a checkpoint (or the evaluation's progress) and exit with code 42; a trainer
started by `trm launch` (local backend) also gets SIGTERM when its launcher dies (trm/run/lifetime.py).
Exit codes: 0 finished, 2 bad input, 42 stopped early (resumable).

Multi-host (one process per host, see `trm launch` and trm/run/distributed.py): every process runs this
same command with the same config. Process 0 writes config.json, metrics.jsonl, test_time.json, final.json and
_SUCCESS; every process verifies it holds the same config and code as the others, trains and evaluates its own
rows of each global batch, writes logs/host-{i}.log and takes part in every checkpoint. SIGTERM to any host (a
preemption notice) makes all hosts save at one agreed step (or evaluation batch) and exit 42. Any other failure ends the process at once with a non-zero code, and
the other hosts follow within a heartbeat timeout. `--run-dir` may contain `{config_hash}`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import traceback

from trm.data.verify import DATASET_CACHE
from trm.errors import UserError, number, system_refusal
from trm.run import distributed, spec
from trm.run.layout import RunDirRefused
from trm.run.lifetime import die_with_launcher
from trm.run.state import mark_setup_failed
from trm.run.timing import Timings
from trm.train.hostlog import HostLog
from trm.train.records import parse_steps
from trm.train.sampling import DEFAULT_SIGMA, Sampling


def add_run_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """What a job file holds of these arguments (trm/launch/job.py): the run (trm/run/spec.py) and its final
    evaluation's test-time steps, subset and sampling; `trm launch` takes the same ones by hand."""
    spec.add_arguments(parser, required)
    parser.add_argument(
        "--test-time-steps",
        default="",
        help="comma-separated supervision step counts at which the final evaluation also scores the test split, "
        "in the same pass as train.eval_steps (test_time.json; the workflow's test_time_steps)",
    )
    parser.add_argument(
        "--test-time-subset",
        type=number(int, minimum=1),
        default=None,
        metavar="N",
        help="score the --test-time-steps counts on a fixed subset of N test puzzles, the same for every run, "
        "and train.eval_steps on the whole split (default: every count on the whole split; the workflow's "
        "test_time_subset)",
    )
    parser.add_argument(
        "--test-time-trajectories",
        default="",
        metavar="K,...",
        help="then score the same counts and puzzles with K noisy trajectories per puzzle, for each K "
        "(sampled.json; trm/train/sampled.py; the workflow's test_time_trajectories); default: none",
    )
    parser.add_argument(
        "--test-time-noise",
        type=number(float, minimum=0),
        default=None,
        metavar="SIGMA",
        help="the sd of the Gaussian noise added to z_L before every supervision step of a trajectory "
        f"(default {DEFAULT_SIGMA}; the workflow's test_time_noise)",
    )


def final_evaluation(args: argparse.Namespace) -> tuple[tuple[int, ...], int | None, Sampling | None]:
    """The test-time step counts, subset and sampling (None without --test-time-trajectories) of parsed
    `add_run_arguments` arguments; a UserError for a bad one."""
    steps = parse_steps(args.test_time_steps, "--test-time-steps") if args.test_time_steps else ()
    trajectories = args.test_time_trajectories
    if not trajectories:
        return steps, args.test_time_subset, None
    counts = parse_steps(trajectories, "--test-time-trajectories")
    sigma = DEFAULT_SIGMA if args.test_time_noise is None else args.test_time_noise
    return steps, args.test_time_subset, Sampling(counts, sigma)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument(
        "--cache-dir",
        default=DATASET_CACHE,
        help="local cache for the dataset copy (default: %(default)s, or $TRM_CACHE_DIR)",
    )
    parser.add_argument(
        "--log-every",
        type=number(int, minimum=1),
        default=50,
        help="train metrics every N steps (default 50)",
    )
    parser.add_argument(
        "--wandb",
        action="store_true",
        help="also log to Weights & Biases (needs the wandb package; WANDB_MODE=offline works)",
    )
    distributed.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    # JAX and the trainer are imported here, not at the top, so that `trm train --help` stays fast.
    timings = Timings()  # first: the time before it is the process's start and imports
    if args.wandb and importlib.util.find_spec("wandb") is None:  # say so now, not after the set-up
        from trm.train.trainer import WANDB_MISSING

        raise UserError(WANDB_MISSING)
    die_with_launcher()  # a launcher's host: SIGTERM (save and stop) when the launcher dies
    options = distributed.options_from_args(args)
    with timings.phase("setup"):
        distributed.initialize(options)  # before anything touches a device
    host_log = HostLog()
    try:
        if options.mode == "off":
            return _train(args, host_log, timings)
        return _train_as_host(args, host_log, timings)
    finally:
        host_log.close()


def _train(args: argparse.Namespace, host_log: HostLog, timings: Timings) -> int:
    with timings.phase("setup"):  # JAX's import, the devices, the model and its optimizer
        import jax

        from trm.train.trainer import Trainer

    run = spec.resolve(args)
    test_time_steps, test_time_subset, sampling = final_evaluation(args)
    try:
        with timings.phase("setup"):
            trainer = Trainer(
                run.config,
                run.data,
                run.run_dir,
                args.cache_dir,
                args.log_every,
                args.wandb,
                host_log,
                test_time_steps,
                timings,
                test_time_subset=test_time_subset,
                config_hash=run.config_hash,
                sampling=sampling,
            )
    except RunDirRefused:
        raise  # another config's or dataset's run dir: nothing is written there
    except BaseException as err:
        # A setup failure (no dataset, bad data, storage unreachable) still ends the run with a reason.
        mark_setup_failed(
            run.run_dir, run.config, f"{type(err).__name__}: {err}", writer=jax.process_index() == 0
        )
        raise
    return trainer.run()


def _train_as_host(args: argparse.Namespace, host_log: HostLog, timings: Timings) -> int:
    """One process of a multi-host job: `_train`, but a failure ends the process at once.

    os._exit skips Python's cleanup: a normal exit would wait in JAX's shutdown barrier for hosts that may be
    blocked in a collective. The other hosts then fail on the lost heartbeat. Success and preemption exit
    normally, all hosts together.
    """
    try:
        return _train(args, host_log, timings)
    except UserError as err:
        print(f"trm train: error: {err}", file=sys.stderr)
        code = err.exit_code
    except BaseException as err:
        refusal = (
            system_refusal(err) if isinstance(err, OSError) else None
        )  # a full disk: one line, as in trm
        if refusal is None:
            traceback.print_exc()
            code = 1
        else:
            print(f"trm train: error: {refusal}", file=sys.stderr)
            code = UserError.exit_code
    import jax

    print(f"host {jax.process_index()} exits with code {code}", file=sys.stderr)
    host_log.close()
    os._exit(code)

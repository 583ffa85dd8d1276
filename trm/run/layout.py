"""The layout of a run directory: the one module that names its files.

A run dir is a local path, file:// or gs:// URL; the study names it by its config hash (STORAGE/SCALE/runs/HASH).

  config.json       the resolved config, canonical JSON; written first, it ties the dir to that config
  data.json         the staged dataset the run trains on: its URL and manifest hash; written before the first
                    step, it ties the dir to that dataset's content (a resume on another one is refused)
  ckpt/             orbax checkpoints of the whole training state (trm/train/checkpoint.py)
  metrics.jsonl     train and eval records, one JSON object per line (trm/train/records.py)
  logs/host-I.log   the output of host I
  status.json       the trainer's state, progress and heartbeat (trm/run/state.py)
  launch.json       the launcher's state (trm/run/state.py)
  lease.json        which launcher trains the run now (trm/run/lease.py); lease.lock beside it on local paths
  test_time.json    the final evaluation at every test-time step count (`trm evaluate --out`'s JSON, and which
                    rows each count was scored on)
  test_time.progress.json   its sums so far, also saved at its end: to continue it (trm/train/test_time.py)
  sampled.json      the final evaluation's sampled recursion: K trajectories per puzzle (trm/train/final_evaluation.py)
  sampled.progress.json     its sums so far, as test_time.progress.json
  final.json        the final evaluation and the run's summary
  kernel_check.json the fused MLP-T kernel against the plain formulation on the run's device, before its first
                    step (trm/train/kernel_check.py); only where the train step uses the kernel
  provenance.json   where imported weights came from (`trm import-torch`)
  canary.json       in a canary's folder (a workflow's canary job: its "run dir"), the page of `trm canary` with
                    every figure (trm/study/canary.py)
  _SUCCESS          written last: the run finished

`trm summarize` reads config.json, metrics.jsonl, test_time.json and final.json of a finished run.
"""

from __future__ import annotations

import json

from trm import storage
from trm.config import config_hash, dump_config, validate_config
from trm.errors import UserError

CONFIG = "config.json"
DATA = "data.json"
CHECKPOINTS = "ckpt"
METRICS = "metrics.jsonl"
LOGS = "logs"
STATUS = "status.json"
LAUNCH = "launch.json"
LEASE = "lease.json"
LEASE_LOCK = "lease.lock"
TEST_TIME = "test_time.json"
TEST_TIME_PROGRESS = "test_time.progress.json"
SAMPLED = "sampled.json"
SAMPLED_PROGRESS = "sampled.progress.json"
FINAL = "final.json"
KERNEL_CHECK = "kernel_check.json"
PROVENANCE = "provenance.json"
CANARY = "canary.json"
SUCCESS = "_SUCCESS"

# What to do about a damaged file that only training makes: config.json (which ties the checkpoints to their
# config) and metrics.jsonl (the training's figures).
RETRAIN = "restore it from a copy, or delete the run dir and train the run again"


class RunDirRefused(UserError):
    """A run dir that belongs to another config or dataset: refused, and nothing is written there."""


def path(run_dir: str, name: str) -> str:
    """The URL of file `name` (one of the names above) in `run_dir`."""
    return storage.join(run_dir, name)


def host_log(run_dir: str, process_index: int) -> str:
    return storage.join(run_dir, LOGS, f"host-{process_index}.log")


def finished(run_dir: str) -> bool:
    return storage.exists(path(run_dir, SUCCESS))


def read_config(url: str) -> dict:
    """The resolved config at `url` (a config.json), validated; UserError naming the file when it is not one."""
    config = storage.read_json(url, "config file not found", RETRAIN)
    return validate_config(config, source=url)


def stored_config_hash(run_dir: str) -> str | None:
    """The hash of the config in `run_dir`'s config.json; None when there is none."""
    url = path(run_dir, CONFIG)
    if not storage.exists(url):
        return None
    config = storage.read_json(url, "missing", RETRAIN)
    if not isinstance(config, dict):
        raise storage.DamagedFile(f"{url}: not a config (a JSON object); {RETRAIN}")
    return config_hash(config)


def claim(run_dir: str, config: dict, own: str, write: bool = True) -> None:
    """Tie `run_dir` to `config`, whose hash is `own`: write its config.json (when `write` and there is none yet),
    and refuse a run dir that holds another config, since its checkpoints belong to that one."""
    stored = stored_config_hash(run_dir)
    if stored is not None and stored != own:
        raise RunDirRefused(
            f"{path(run_dir, CONFIG)} holds config {stored}, not this run's {own}: "
            "use a new --run-dir for a different config"
        )
    if stored is None and write:
        storage.write_text(path(run_dir, CONFIG), dump_config(config))


def bound_data(run_dir: str) -> dict | None:
    """The dataset `run_dir` trains on ({"url", "manifest_sha256"}, its data.json); None before it is bound."""
    url = path(run_dir, DATA)
    if not storage.exists(url):
        return None
    record = storage.read_json(url, "missing", "restore it, or delete it to bind the run to the next --data")
    if not isinstance(record, dict) or not isinstance(record.get("manifest_sha256"), str):
        raise UserError(
            f"{url}: not a data record (expected an object with manifest_sha256): it names the dataset this run "
            "trains on; restore it, or delete it to bind the run to the next --data"
        )
    return record


def bind_data(run_dir: str, url: str, manifest_hash: str, write: bool = True) -> None:
    """Tie `run_dir` to the dataset staged at `url`, whose manifest hash is `manifest_hash`: write its data.json
    (when `write` and there is none yet), and refuse a run dir bound to another dataset, whose checkpoints and
    records that one made. The same content staged at another URL is the same dataset."""
    bound = bound_data(run_dir)
    if bound is None:
        if write:
            record = {"url": url, "manifest_sha256": manifest_hash}
            storage.write_text(path(run_dir, DATA), json.dumps(record, indent=1, sort_keys=True) + "\n")
    elif bound["manifest_sha256"] != manifest_hash:
        raise RunDirRefused(
            f"{path(run_dir, DATA)}: this run trains on the dataset {bound['manifest_sha256'][:16]} staged at "
            f"{bound.get('url')}, not on {manifest_hash[:16]} at --data {url}: resume it on its own dataset, or "
            "use a new --run-dir"
        )

"""Show every run in storage: its state, progress, latest accuracy, speed and time to finish.

    trm status                                  the workflow's storage (config/config.yaml `storage`)
    trm status --storage gs://BUCKET/trm        a bucket (the trainer and launcher write the markers there)
    trm status --watch                          refresh every 30 s until Ctrl-C
    trm status --experiment exp01a              one experiment: its run dir at the study's scale, and its state
    trm status --profile tpu-v4-64              storage and scale from a profile's study file (as snakemake)

Run dirs are found below the storage root (ROOT/<scale>/runs/<hash>/, ROOT/runs/<hash>/ or ROOT itself). Each
run's state comes from the markers its trainer and launcher write (trm/run/state.py), never from a guess:

  queued      the launcher waits for a TPU slice          running    the trainer's heartbeat is fresh
  starting    the launcher is starting the workers        lost       "running", but no heartbeat for --stale-after s
  preempted   stopped with a checkpoint; resumes on relaunch
  finished    _SUCCESS written                            failed / cancelled   with the reason

Under the table, when a run stopped early: where its hosts' logs are (every attempt in one file, the latest
last).

Defaults, as the workflow reads them: config/config.yaml, with `--profile`'s study file (its `configfile`, e.g.
profiles/tpu-v4-64/study.yaml) over it, give the storage, the scale and the stale limit
(launch.tpu.stale_after_seconds); `--storage`, `--scale` and `--stale-after` win. `--experiment ID` resolves the experiment
as the plan does (trm/study/plan.py) at that scale, so its run dir is STORAGE/<scale>/runs/<hash>.

Experiments are named by matching each run's config hash with the study plan at the run's scale (experiments with
equal configs share a run; a replicate, the run of an experiment's seed k, is EXP~sK: the `replicates` setting);
other runs show their directory name. ETA = steps left / recent steps per second.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from trm import storage
from trm.checkout import checkout_path
from trm.config import experiment_path, merged
from trm.errors import UserError, number
from trm.run import layout
from trm.run.state import RunState, read_run
from trm.study.scale import SCALES

RUN_MARKERS = (layout.CONFIG, layout.STATUS, layout.LAUNCH)
STOPPED = ("preempted", "failed", "lost", "cancelled")  # states whose reason is in the run's host logs
NOT_RUN_DIRS = {layout.CHECKPOINTS, layout.LOGS, "datasets", "code"}  # folders the search never descends into


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage",
        help="storage root URL (gs://, file:// or a path); default: `storage` in config/config.yaml",
    )
    parser.add_argument(
        "--profile",
        help="a Snakemake profile (a folder, or a name under profiles/): its study file gives the default "
        "storage and scale, as for `snakemake --profile`",
    )
    parser.add_argument(
        "--experiment", metavar="ID", help="show one experiment of the study: its run dir and state"
    )
    parser.add_argument(
        "--scale", choices=SCALES, help="the scale of --experiment; default: `scale` of the study settings"
    )
    parser.add_argument(
        "--watch",
        nargs="?",
        const=30.0,
        type=number(float, above=0),
        metavar="SECONDS",
        help="refresh the table every SECONDS (default 30) until Ctrl-C",
    )
    parser.add_argument(
        "--stale-after",
        type=number(float, above=0),
        metavar="SECONDS",
        help="a running trainer whose heartbeat is older than this is shown as lost (default: "
        "launch.tpu.stale_after_seconds of the study settings, --profile's if given)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per run instead of a table"
    )


def find_run_dirs(root: str, depth: int = 3) -> list[str]:
    """URLs of the run dirs at or below `root` (a folder holding a run marker), at most `depth` levels down."""
    if any(storage.exists(storage.join(root, marker)) for marker in RUN_MARKERS):
        return [root]
    if depth == 0:
        return []
    found = []
    for name in sorted(set(storage.list_dirs(root)) - NOT_RUN_DIRS):
        found += find_run_dirs(storage.join(root, name), depth - 1)
    return found


def _scale_of(run_dir: str) -> str | None:
    """The scale in a run dir's URL (…/<scale>/runs/<hash>), if it follows the workflow's layout."""
    parts = run_dir.rstrip("/").split("/")
    return parts[-3] if len(parts) >= 3 and parts[-2] == "runs" and parts[-3] in SCALES else None


def experiments_by_hash(scale: str, seeds: int = 1) -> dict[str, list[str]]:
    """config hash -> the study's run ids with that config at `scale`: each experiment's, and its replicates'
    (EXP~sK) up to `seeds` seeds."""
    from trm.study.plan import plan_study, replicate_of

    names: dict[str, list[str]] = {}
    for exp in plan_study(scale, "all", "all", source="trm status"):
        for run in [exp, *(replicate_of(exp, k) for k in range(1, seeds))]:
            names.setdefault(run.hash, []).append(run.id)
    return names


def most_seeds(replicates: dict, scale: str) -> int:
    """The most seeds any experiment trains at `scale` under a `replicates` setting (config/config.yaml)."""
    setting = replicates.get(scale, {})
    counts = [setting.get("seeds", 1), setting.get("baseline", 1)]
    return max(
        counts + list(setting.get("groups", {}).values()) + list(setting.get("experiments", {}).values())
    )


@dataclass
class Row:
    experiment: str
    state: str
    step: str
    epoch: str
    accuracy: str
    speed: str
    elapsed: str
    eta: str
    slice: str
    detail: str


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def eta_seconds(run: RunState) -> float | None:
    """Seconds to the last step at the latest measured speed; None when finished, failed or speed unknown."""
    status = run.status
    if run.state not in ("running", "starting", "queued", "preempted", "lost"):
        return None
    speed, batch = status.get("examples_per_s"), status.get("global_batch_size")
    if not speed or not batch or "total_steps" not in status:
        return None
    return (status["total_steps"] - status.get("step", 0)) / (speed / batch)


def row(run: RunState, experiment: str) -> Row:
    s = run.status
    total_steps, total_epochs = s.get("total_steps"), s.get("total_epochs")
    step = f"{s.get('step', 0)}/{total_steps}" if total_steps else "-"
    epoch = f"{s.get('epoch', 0)}/{total_epochs}" if total_epochs else "-"
    accuracy = f"{s['eval_exact_accuracy']:.4f}" if s.get("eval_exact_accuracy") is not None else "-"
    speed = f"{s['examples_per_s']:.1f} ex/s" if s.get("examples_per_s") else "-"
    eta = eta_seconds(run)
    return Row(
        experiment,
        run.state,
        step,
        epoch,
        accuracy,
        speed,
        _duration(s.get("elapsed_s")),
        _duration(eta) if eta is not None else "-",
        run.slice_name or "-",
        run.detail,
    )


def format_table(rows: list[Row]) -> str:
    """Aligned columns, one line per run, its detail (why lost, failed, queued) in brackets at the end."""
    headers = (
        "experiment",
        "state",
        "step",
        "epoch",
        "eval exact acc",
        "throughput",
        "elapsed",
        "ETA",
        "slice",
    )
    table = [headers] + [
        (r.experiment, r.state, r.step, r.epoch, r.accuracy, r.speed, r.elapsed, r.eta, r.slice) for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
    details = [""] + [f"  ({r.detail})" if r.detail else "" for r in rows]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() + detail
        for line, detail in zip(table, details, strict=True)
    )


def collect(root: str, stale_after_s: float, replicates: dict | None = None) -> list[tuple[str, RunState]]:
    """(experiment names, state) of every run below `root`, sorted by name; replicates (the workflow's setting)
    names the seeds' runs EXP~sK."""
    plans: dict[str, dict[str, list[str]]] = {}
    runs = []
    for run_dir in find_run_dirs(root):
        run = read_run(run_dir, stale_after_s=stale_after_s)
        scale = _scale_of(run_dir)
        name = run_dir.rstrip("/").rsplit("/", 1)[-1]
        if scale is not None:
            if scale not in plans:
                plans[scale] = experiments_by_hash(scale, most_seeds(replicates or {}, scale))
            ids = plans[scale].get(run.status.get("config_hash") or name)
            if ids:
                name = ids[0] if len(ids) == 1 else f"{ids[0]} (+{len(ids) - 1} same config)"
        runs.append((name, run))
    return sorted(runs, key=lambda item: item[0])


def _read_settings(path: Path) -> dict:
    try:
        settings = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise UserError(f"{path}: study settings not readable: {err}") from None
    if not isinstance(settings, dict):
        raise UserError(f"{path}: expected a mapping of study settings")
    return settings


def study_settings(profile: str | None) -> dict:
    """The workflow's settings: config/config.yaml, then the study file(s) of `profile` (its `configfile`)."""
    settings = _read_settings(Path(checkout_path("config/config.yaml")))
    if profile is None:
        return settings
    folder = Path(profile)
    if not folder.is_dir():
        folder = Path(checkout_path(f"profiles/{profile}"))
    if not (folder / "config.yaml").is_file():
        raise UserError(
            f"--profile {profile}: no profile folder with a config.yaml (a path, or a name in profiles/)"
        )
    files = _read_settings(folder / "config.yaml").get("configfile") or []
    for name in [files] if isinstance(files, str) else files:
        settings = merged(settings, _read_settings(folder / name))
    return settings


def _stale_after(settings: dict, profile: str | None) -> float:
    """launch.tpu.stale_after_seconds of the study settings: seconds > 0."""
    value = settings.get("launch", {}).get("tpu", {}).get("stale_after_seconds")
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        where = f"the study file of profile {profile}" if profile else "config/config.yaml"
        raise UserError(
            f"launch.tpu.stale_after_seconds {value!r} in {where}: expected a number of seconds > 0 "
            "(or pass --stale-after)"
        )
    return float(value)


def _setting(settings: dict, key: str, profile: str | None) -> str:
    if not settings.get(key):
        where = f"the study file of profile {profile}" if profile else "config/config.yaml"
        raise UserError(f"no --{key} given and no `{key}` setting in {where}")
    return str(settings[key])


def experiment_run_dir(exp_id: str, storage_root: str, scale: str) -> str:
    """The run dir of a study experiment at `scale`, resolved as the plan resolves it."""
    from trm.study.plan import plan_study, run_dir_of

    experiment_path(exp_id)  # an unknown id: named with the closest ones
    (exp,) = plan_study(scale, [exp_id], "all", source=f"--experiment {exp_id}")
    return run_dir_of(storage_root, scale, exp.hash)


def experiment_status(exp_id: str, run_dir: str, stale_after_s: float, as_json: bool) -> str:
    if not any(storage.exists(storage.join(run_dir, marker)) for marker in RUN_MARKERS):
        if as_json:
            return json.dumps({"experiment": exp_id, "run_dir": run_dir, "state": "not started"})
        return f"{exp_id}: not started (no run dir at {run_dir})"
    run = read_run(run_dir, stale_after_s=stale_after_s)
    if as_json:
        return _json_line(exp_id, run)
    return f"{format_table([row(run, exp_id)])}\n\nrun dir: {run_dir}"


def _json_line(name: str, run: RunState) -> str:
    return json.dumps(
        {
            "experiment": name,
            "run_dir": run.run_dir,
            "state": run.state,
            "detail": run.detail,
            "eta_s": eta_seconds(run),
            **{k: v for k, v in run.status.items() if k != "state"},
        },
        sort_keys=True,
    )


def render(root: str, stale_after_s: float, as_json: bool, replicates: dict | None = None) -> str:
    runs = collect(root, stale_after_s, replicates)
    if as_json:
        return "\n".join(_json_line(name, run) for name, run in runs)
    if not runs:
        return f"no runs under {root} yet" if storage.exists(root) else f"{root} does not exist (yet)"
    counts: dict[str, int] = {}
    for _, run in runs:
        counts[run.state] = counts.get(run.state, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    table = format_table([row(run, name) for name, run in runs])
    text = f"{table}\n\n{len(runs)} runs under {root}: {summary} ({stamp})"
    if any(run.state in STOPPED for _, run in runs):
        text += f"\nwhy a run stopped: RUN_DIR/{layout.LOGS}/host-<i>.log (every attempt, latest last)"
    return text


def main(args: argparse.Namespace) -> int:
    settings = study_settings(args.profile)
    root = storage.check_url(
        args.storage or _setting(settings, "storage", args.profile),
        "--storage" if args.storage else "storage",
    )
    if args.stale_after is None:
        args.stale_after = _stale_after(settings, args.profile)
    if args.scale and not args.experiment:
        raise UserError(f"--scale {args.scale}: goes with --experiment (the table shows every scale's runs)")
    if args.experiment:
        scale = args.scale or _setting(settings, "scale", args.profile)
        run_dir = experiment_run_dir(args.experiment, root, scale)

        def show() -> str:
            return experiment_status(args.experiment, run_dir, args.stale_after, args.json)
    else:
        if args.watch is None and not storage.exists(root):  # a typo must not look like an empty study
            raise UserError(
                f"{'--storage' if args.storage else 'storage'} {root}: no such folder; the study's runs are under "
                "its `storage` setting (config/config.yaml, or your profile's study file: --profile)"
            )

        def show() -> str:
            return render(root, args.stale_after, args.json, settings.get("replicates"))

    if args.watch is None:
        print(show())
        return 0
    try:
        while True:
            text = show()
            if sys.stdout.isatty():
                sys.stdout.write("\033[2J\033[H")  # clear the screen
            print(text, flush=True)
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0

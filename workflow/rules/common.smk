# Parse-time setup: validate the settings, plan the selected experiments at the chosen scale, and print the
# planned cost. Every job is known here (no checkpoints), so a dry run shows the whole study.
#
# Shell commands: settings are shared files (profiles, study files), so none may become shell code. Every
# placeholder in a rule's shell command is quoted with `:q` (a list: each item quoted), and params hold plain
# values or argument lists, never pre-joined command text (tests/test_workflow_quoting.py checks both).
import csv
import functools
import os
import sys

import yaml

from snakemake.exceptions import WorkflowError

from trm.config import dump_config, experiment_ids, experiment_path, load_config
from trm.errors import UserError
from trm.launch import slice_ledger, tpu_options
from trm.launch.accelerators import step_hash
from trm.launch.local import one_thread_per_job
from trm.storage import GCS_SCHEMES, check_url, write_text
from trm.storage import join as url_join
from trm.study import interrupts
from trm.study.estimate import (
    CostCache,
    accelerator_hours,
    compiled_run_hours,
    compiled_step_seconds,
    describe_evaluation,
    evaluation_flops,
    evaluation_passes,
    training_flops,
)
from trm.study.groups import REFERENCE_GROUP
from trm.study.plan import check_batches, parse_dataset_name, plan_study_cached, run_dir_of
from trm.study.scale import SMOKE_POOL, TEST_PUZZLES
from trm.study.settings import check_settings, load_schema


def _setting_source(dotted):
    """Where the workflow setting `dotted` gets its value: --config, the last --configfile (a profile's study
    file) that sets it, or config/config.yaml. Error messages name it."""
    keys = dotted.split(".")

    def holds(tree):
        for key in keys:
            if not isinstance(tree, dict) or key not in tree:
                return False
            tree = tree[key]
        return True

    if holds(dict(workflow.config_settings.config)):
        return "--config"
    for path in reversed(list(workflow.config_settings.configfiles)):
        with open(path) as stream:
            if holds(yaml.safe_load(stream)):
                return os.path.relpath(path)
    return "config/config.yaml"


# One readable line for a bad setting (unknown key, wrong type), naming where it was set; nested `--config`
# values (`--config 'launch={hosts: 2}'`, which Snakemake reads as strings) are converted to the schema's types.
try:
    check_settings(config, load_schema(workflow.source_path("../schemas/config.schema.yaml")), _setting_source)
except UserError as err:
    raise WorkflowError(str(err)) from None


def _check_argument(value, key):
    """A setting that becomes a command-line argument: one line, and not read as an option."""
    if any(ord(char) < 32 for char in value):
        raise UserError(f"{key} {value!r} contains a control character (a newline?)")
    if value.startswith("-"):
        raise UserError(f"{key} {value!r} starts with '-', which commands read as an option: write ./{value}")


def _check_results(value, key):
    _check_argument(value, key)
    if "{" in value or "}" in value:
        raise UserError(f"{key} {value!r}: {{ and }} are Snakemake wildcards in output paths")


def _check_gcs(url, key):
    """The tpu-vm backend's storage: the hosts share no files, so only gs:// (an empty code_url: STORAGE/code)."""
    if url and check_url(url, key).partition("://")[0] not in GCS_SCHEMES:
        raise UserError(f"{key} {url!r}: the tpu-vm backend needs a gs:// URL (TPU hosts share no files)")


# Storage URLs and folders reach commands and TPU hosts: check them where a dry run sees them.
_LOCATIONS = [
    ("storage", check_url),
    ("results", _check_results),
    ("source", _check_argument),
    ("launch.tpu.lock_dir", _check_argument),
]
if config["launch"]["backend"] == "tpu-vm":
    _LOCATIONS += [("storage", _check_gcs), ("launch.tpu.code_url", _check_gcs)]
for _key, _check in _LOCATIONS:
    _value = config
    for _part in _key.split("."):
        _value = _value[_part]
    try:
        _check(_value, _key)
    except UserError as err:
        raise WorkflowError(f"{_setting_source(_key)}: {err}") from None

# The tpu-vm launcher's own checks of its settings (names gcloud accepts, timeouts), at dry-run time.
_TPU = {**config["launch"]["tpu"], "code_url": config["launch"]["tpu"]["code_url"] or url_join(config["storage"], "code")}
if config["launch"]["backend"] == "tpu-vm":
    try:
        tpu_options.check(_TPU)
    except UserError as err:
        raise WorkflowError(f"{_setting_source('launch.tpu')}: {err}") from None

# Commands run with the `trm` of the environment running Snakemake, so an unactivated venv works
# (`.venv/bin/snakemake`). Named by its folder, not by the interpreter's name: `python` and `python3` of one
# venv must give the same command, or Snakemake sees changed params and reruns everything.
TRM = os.path.join(os.path.dirname(sys.executable), "trm")

def _report_selection():
    """`snakemake --report` reports the DAG of the selection it is given. After a run of a selection
    (`--config experiments=[exp01a]`), a plain `snakemake --report FILE` would ask for every experiment's outputs
    (hundreds of "Missing metadata" warnings, then a missing plot). So a report given no selection of its own
    covers the runs of the last table, the selection that was run; None when it has one, or no table exists."""
    reporting = any(arg == "--report" or arg.startswith("--report=") for arg in sys.argv[1:])
    chosen = {_setting_source(key) for key in ("experiments", "groups")} != {"config/config.yaml"}
    table = os.path.join(config["results"], config["scale"], "table.csv")
    if not reporting or chosen or not os.path.isfile(table):
        return None
    with open(table, newline="") as stream:
        ids = [row["id"] for row in csv.DictReader(stream) if row.get("id")]
    print(f"report: the runs of {table} ({', '.join(ids)}); --config experiments=[...] reports others", file=sys.stderr)
    return ids or None


_reported = _report_selection()
if _reported:
    config["experiments"], config["groups"] = _reported, "all"

try:
    PLAN = {
        exp.id: exp
        for exp in plan_study_cached(
            os.path.join(config["results"], ".cache", f"plan-{config['scale']}.json"),
            config["scale"],
            config["experiments"],
            config["groups"],
            experiments_dir="config/experiments",
            groups_path="config/groups.yaml",
            source="workflow config",
        )
    }
except UserError as err:
    raise WorkflowError(str(err)) from None

def job_launch(exp_id):
    """An experiment's job shape and TPU pool: launch.*, with its launch.per_experiment entry (if any) over it."""
    own = config["launch"]["per_experiment"].get(exp_id, {})
    return {
        "hosts": own.get("hosts", config["launch"]["hosts"]),
        "devices_per_host": own.get("devices_per_host", config["launch"]["devices_per_host"]),
        "tpu": {**_TPU, **own.get("tpu", {})},
    }


def job_devices(exp_id):
    launch = job_launch(exp_id)
    return launch["hosts"] * launch["devices_per_host"]


DEVICES = job_devices(None)  # of every job without its own launch.per_experiment entry
_unknown = sorted(set(config["launch"]["per_experiment"]) - set(experiment_ids("config/experiments")))
if _unknown:
    raise WorkflowError(f"{_setting_source('launch.per_experiment')}: launch.per_experiment: no experiment {', '.join(_unknown)}")
try:
    for _exp_id in config["launch"]["per_experiment"] if config["launch"]["backend"] == "tpu-vm" else []:
        tpu_options.check(job_launch(_exp_id)["tpu"])
    for _devices in sorted({job_devices(exp_id) for exp_id in PLAN}):
        check_batches(
            [exp for exp in PLAN.values() if job_devices(exp.id) == _devices],
            _devices,
            f"{_devices} devices (launch.hosts x launch.devices_per_host, or the experiment's launch.per_experiment) "
            f"from {_setting_source('launch.hosts')}, scale {config['scale']}",
        )
except UserError as err:
    raise WorkflowError(f"{_setting_source('launch')}: {err}") from None

RESULTS = os.path.join(config["results"], config["scale"])
STORAGE = url_join(config["storage"], config["scale"])
TABLE = os.path.join(RESULTS, "table")
TABLE_FILES = [f"{TABLE}.csv", f"{TABLE}.parquet"]
PLOT_FILES = os.path.join(RESULTS, "plots", "{group}.{ext}")
SELECTED_GROUPS = list(dict.fromkeys(exp.group for exp in PLAN.values() if exp.group != REFERENCE_GROUP))
REFERENCES = [exp.id for exp in PLAN.values() if exp.group == REFERENCE_GROUP]
DATASETS = sorted({exp.dataset for exp in PLAN.values()})
SOFTWARE = "../envs/trm.yaml"  # every rule's conda environment (relative to the rule files)
TEST_TIME_STEPS = ",".join(map(str, config["test_time_steps"][config["scale"]]))
TEST_TIME_SUBSET = config["test_time_subset"][config["scale"]]  # None: the test-time curve on the whole split
# XLA's CPU work on one thread per job, set in Snakemake's environment, which every job inherits (not in the
# commands: a changed command would make Snakemake rerun finished jobs).
one_thread_per_job()
# A persistent XLA cache: the study's many same-shaped configs (every group's baseline) compile once.
JAX_CACHE_ENV = [
    "env",
    f"JAX_COMPILATION_CACHE_DIR={os.path.join(config['results'], '.cache', 'jax')}",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0",
]


wildcard_constraints:
    exp="|".join(PLAN),
    dataset=r"p\d+-a\d+",
    group="|".join(SELECTED_GROUPS),


# Experiments with the same resolved config (every group's baseline) share one run dir: the first trains it, the
# others wait for it and only collect it.
FIRST_WITH_HASH = {}
for _exp in PLAN.values():
    FIRST_WITH_HASH.setdefault(_exp.hash, _exp.id)


def compile_dir(exp_id):
    """`trm compile-check`'s figures of the experiment's accelerator (the compile_check target, compile.smk)."""
    return os.path.join(config["results"], "compile", job_launch(exp_id)["tpu"]["accelerator_type"])


@functools.cache
def compile_steps():
    """Compile result file -> the first selected experiment with that accelerator and paper-scale step (read only
    when compiling)."""
    steps = {}
    for exp_id in PLAN:
        step = step_hash(load_config(experiment_path(exp_id, "config/experiments")))
        steps.setdefault(os.path.join(compile_dir(exp_id), f"{step}.json"), exp_id)
    return steps


def _compiled_seconds(exp):
    """The roofline step times of a run on the TPU slice, when its steps have been compiled for it; else None."""
    if config["launch"]["backend"] != "tpu-vm" or config["scale"] != "paper":
        return None
    return compiled_step_seconds(exp.config, compile_dir(exp.id))


def _estimates():
    """Estimated accelerator-hours of each experiment's training and of its evaluations, and the experiments whose
    figures are compiled: from the roofline times of its compiled steps where there are, else from their FLOPs
    and batch at the assumed utilization (model costs cached by config hash)."""
    cache = CostCache(os.path.join(config["results"], ".cache", "model-costs.json"))
    accel = config["accelerator"]
    test_puzzles = TEST_PUZZLES[config["scale"]]
    steps = config["test_time_steps"][config["scale"]]
    hours, compiled = {}, set()
    for exp in PLAN.values():
        if seconds := _compiled_seconds(exp):
            hours[exp.id] = compiled_run_hours(
                exp.config, seconds, job_devices(exp.id), test_puzzles, steps, TEST_TIME_SUBSET
            )
            compiled.add(exp.id)
            continue
        costs = cache.costs(exp.hash, exp.config)
        flops = {
            "training": training_flops(exp.config, costs),
            "evaluation": evaluation_flops(
                exp.config, costs, test_puzzles, steps, job_devices(exp.id), TEST_TIME_SUBSET
            ),
        }
        hours[exp.id] = {k: accelerator_hours(v, accel["peak_flops"], accel["utilization"]) for k, v in flops.items()}
    cache.save()
    return hours, compiled


ESTIMATED_HOURS, COMPILED = _estimates()
_DEVICE_HOURS = f"{config['accelerator']['name']}-hours"
def _plan_summary():
    """The study's line of the dry run, then its training and evaluation hours."""
    runs = list(FIRST_WITH_HASH.values())
    compiled = sum(first in COMPILED for first in runs)
    # The assumed utilization is a guess, not a calibration (at 10%, smoke runs took 1.5 to 8 times less than
    # estimated), so the line says what the figure is.
    assumed = f"an assumed {config['accelerator']['utilization']:.0%} of peak (a rough bound, not a forecast)"
    roofline = "at their compiled steps' roofline times (a best case; snakemake compile_check)"
    if not compiled:
        source = f"at {assumed}"
    elif compiled == len(runs):
        source = f"every run {roofline}"
    else:
        source = f"{compiled} runs {roofline}, {len(runs) - compiled} at {assumed}"

    references = f" and {len(REFERENCES)} reference" if REFERENCES else ""
    lines = [
        f"TRM study, scale {config['scale']}: {len(PLAN) - len(REFERENCES)} experiments in {len(SELECTED_GROUPS)} "
        f"groups{references}, {len(DATASETS)} datasets, {len(runs)} distinct runs; estimated {source}:"
    ]
    shapes = f"on {DEVICES} devices each" if len({job_devices(e) for e in PLAN}) == 1 else "each on its own devices"
    for part in ("training", "evaluation"):
        hours = sum(ESTIMATED_HOURS[first][part] for first in runs)
        wall = sum(ESTIMATED_HOURS[first][part] / job_devices(first) for first in runs)
        lines.append(f"  {f'{part}:':<12}{hours:.4g} {_DEVICE_HOURS} ({wall:.4g} h of jobs {shapes})")
    return "\n".join(lines)


print(_plan_summary(), file=sys.stderr)


def first_with_same_run(exp_id):
    """The experiment whose job trains and evaluates the run `exp_id` shares (itself when it is the first)."""
    return FIRST_WITH_HASH[PLAN[exp_id].hash]


def dataset_url(dataset):
    return url_join(STORAGE, "datasets", dataset)


def run_url(exp_id):
    return run_dir_of(config["storage"], config["scale"], PLAN[exp_id].run_name)


def config_file(exp_id):
    """The resolved config of an experiment's run, written once at parse time (below): what its job trains."""
    return os.path.join(RESULTS, "configs", f"{PLAN[exp_id].hash}.json")


def _write_configs():
    """Each distinct run's resolved config as a file named by its hash. A file is written only when missing: its
    content follows from its name, so it never changes and never makes Snakemake rerun a job."""
    for exp in PLAN.values():
        if not os.path.exists(config_file(exp.id)):
            write_text(config_file(exp.id), dump_config(exp.config))  # atomic: readers never see half a file


_write_configs()


def train_command(exp):
    """The argv of the one command that trains an experiment; after `--`, `trm train`'s arguments."""
    launch = job_launch(exp.id)
    train_args = ["--config", config_file(exp.id), "--data", dataset_url(exp.dataset), "--run-dir", run_url(exp.id)]
    train_args += ["--test-time-steps", TEST_TIME_STEPS]
    if TEST_TIME_SUBSET is not None:
        train_args += ["--test-time-subset", str(TEST_TIME_SUBSET)]
    launch_args = ["--backend", config["launch"]["backend"], "--hosts", launch["hosts"], "--devices-per-host", launch["devices_per_host"]]
    if config["launch"]["backend"] == "tpu-vm":
        launch_args += tpu_options.flags(launch["tpu"])
    return [*JAX_CACHE_ENV, TRM, "launch", *map(str, launch_args), "--", *train_args]


def preflight_command():
    """`trm preflight` with the study's storage and the pool's place, in the launcher's flags, as an argument list."""
    pool = {key: _TPU[key] for key in ("zone", "project", "slices", "create", "accelerator_type")}
    return [TRM, "preflight", "--storage", config["storage"], *tpu_options.flags(pool)]


def estimate_message(wildcards):
    """The job's estimate, training and evaluation on separate labelled lines (evaluation as the trainer runs it:
    trm/study/estimate.py)."""
    first = first_with_same_run(wildcards.exp)
    if first != wildcards.exp:
        return f"train {wildcards.exp}: same config as {first}, whose run it collects (no training)"
    hours = ESTIMATED_HOURS[wildcards.exp]
    steps = config["test_time_steps"][config["scale"]]
    passes = evaluation_passes(
        PLAN[wildcards.exp].config, TEST_PUZZLES[config["scale"]], steps, job_devices(wildcards.exp), TEST_TIME_SUBSET
    )
    devices = job_devices(wildcards.exp)
    source = (
        "at its compiled steps' roofline times, a best case"
        if wildcards.exp in COMPILED
        else f"from its FLOPs and batch at an assumed {config['accelerator']['utilization']:.0%} of peak"
    )
    return (
        f"train {wildcards.exp}: estimated on the job's {devices} devices, {source}\n"
        f"    training:   {hours['training']:.4g} {_DEVICE_HOURS} ({hours['training'] / devices:.3g} h on them)\n"
        f"    evaluation: {hours['evaluation']:.4g} {_DEVICE_HOURS} ({hours['evaluation'] / devices:.3g} h on them): "
        f"{describe_evaluation(passes, steps)}"
    )


def dataset_source(wildcards):
    """The smoke pool's files (the smoke datasets' input); nothing at the paper scale (a URL or a local path)."""
    return [os.path.join(RESULTS, "pool", f"{split}.csv") for split in ("train", "test")] if config["scale"] == "smoke" else []


def build_flags(wildcards):
    puzzles, num_aug = parse_dataset_name(wildcards.dataset)
    source = os.path.join(RESULTS, "pool") if config["scale"] == "smoke" else config["source"]
    return ["--source", source, "--subsample-size", puzzles, "--num-aug", num_aug, "--seed", config["seed"]]


# ------------------------------------------------------------------ run summaries (`trm summarize`, rule train)


def run_summary(exp_id):
    """The local summary of an experiment's run: the train job's one output, what the table reads of the run."""
    return os.path.join(RESULTS, "runs", f"{exp_id}.json")


def same_run_trained_first(wildcards):
    """Nothing, or the summary of the first experiment sharing this one's run: its job trains the run, after
    which this one's job only summarises it."""
    first = first_with_same_run(wildcards.exp)
    return [] if first == wildcards.exp else [run_summary(first)]

# Parse-time setup: validate the settings, plan the selected experiments at the chosen scale, and print the
# planned cost. Every job is known here (no checkpoints), so a dry run shows the whole study.
#
# Shell commands: settings are shared files (profiles, study files), so none may become shell code. Every
# placeholder in a rule's shell command is quoted with `:q` (a list: each item quoted), and params hold plain
# values or argument lists, never pre-joined command text (tests/test_workflow_quoting.py checks both).
import os
import sys

import yaml

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from trm.config import dump_config
from trm.errors import UserError
from trm.launch import tpu_options
from trm.launch.local import one_thread_per_job
from trm.run import layout
from trm.storage import GCS_SCHEMES, check_url, write_text
from trm.storage import join as url_join
from trm.study.estimate import CostCache, accelerator_hours, run_flops
from trm.study.plan import check_batches, parse_dataset_name, plan_study_cached
from trm.study.scale import SMOKE_POOL, TEST_PUZZLES


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


def _check_keys(settings, schema, where):
    """Name a misspelt setting, its file and the allowed ones (the schema validator only says 'was unexpected')."""
    for key, value in settings.items():
        allowed = schema["properties"]
        if key not in allowed:
            raise WorkflowError(
                f"{_setting_source(where + key)}: unknown key '{where}{key}'; allowed keys: {', '.join(allowed)}"
            )
        if isinstance(value, dict) and "properties" in allowed[key]:
            _check_keys(value, allowed[key], f"{where}{key}.")


with open(workflow.source_path("../schemas/config.schema.yaml")) as _schema_file:
    _check_keys(config, yaml.safe_load(_schema_file), "")
validate(config, "../schemas/config.schema.yaml")


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

DEVICES = config["launch"]["hosts"] * config["launch"]["devices_per_host"]
try:
    check_batches(
        list(PLAN.values()),
        DEVICES,
        f"{DEVICES} devices: launch.hosts {config['launch']['hosts']} x launch.devices_per_host "
        f"{config['launch']['devices_per_host']} from {_setting_source('launch.hosts')}, scale {config['scale']}",
    )
except UserError as err:
    raise WorkflowError(str(err)) from None

RESULTS = os.path.join(config["results"], config["scale"])
STORAGE = url_join(config["storage"], config["scale"])
TABLE = os.path.join(RESULTS, "table")
TABLE_FILES = [f"{TABLE}.csv", f"{TABLE}.parquet"]
PLOT_FILES = os.path.join(RESULTS, "plots", "{group}.{ext}")
SELECTED_GROUPS = list(dict.fromkeys(exp.group for exp in PLAN.values()))
DATASETS = sorted({exp.dataset for exp in PLAN.values()})
SOFTWARE = "../envs/trm.yaml"  # every rule's conda environment (relative to the rule files)
TEST_TIME_STEPS = ",".join(map(str, config["test_time_steps"][config["scale"]]))
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


def _estimates():
    """Estimated accelerator-hours per experiment, from its FLOPs and batch (model costs cached by config hash)."""
    cache = CostCache(os.path.join(config["results"], ".cache", "model-costs.json"))
    accel = config["accelerator"]
    hours = {
        exp.id: accelerator_hours(
            run_flops(exp.config, cache.costs(exp.hash, exp.config), TEST_PUZZLES[config["scale"]]),
            accel["peak_flops"],
            accel["utilization"],
        )
        for exp in PLAN.values()
    }
    cache.save()
    return hours


ESTIMATED_HOURS = _estimates()
_TOTAL_HOURS = sum(ESTIMATED_HOURS[first] for first in FIRST_WITH_HASH.values())
print(
    f"TRM study, scale {config['scale']}: {len(PLAN)} experiments in {len(SELECTED_GROUPS)} groups, "
    f"{len(DATASETS)} datasets, {len(FIRST_WITH_HASH)} distinct runs; estimated "
    f"{_TOTAL_HOURS:.4g} {config['accelerator']['name']}-hours of training and evaluation at "
    f"{config['accelerator']['utilization']:.0%} of peak ({_TOTAL_HOURS / DEVICES:.4g} h on {DEVICES} devices per job)",
    file=sys.stderr,
)


def first_with_same_run(exp_id):
    """The experiment whose job trains and evaluates the run `exp_id` shares (itself when it is the first)."""
    return FIRST_WITH_HASH[PLAN[exp_id].hash]


def same_run_trained_first(wildcards):
    first = first_with_same_run(wildcards.exp)
    return [] if first == wildcards.exp else [os.path.join(RESULTS, "runs", first, layout.FINAL)]


def shared_evaluation(wildcards):
    """The test-time evaluation of the run an experiment shares (made by the first experiment with that run)."""
    return os.path.join(RESULTS, "eval", f"{first_with_same_run(wildcards.exp)}-steps.json")


def dataset_url(dataset):
    return url_join(STORAGE, "datasets", dataset)


def run_url(exp_id):
    return url_join(STORAGE, "runs", PLAN[exp_id].run_name)


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
    launch = config["launch"]
    train_args = ["--config", config_file(exp.id), "--data", dataset_url(exp.dataset), "--run-dir", run_url(exp.id)]
    launch_args = ["--backend", launch["backend"], "--hosts", launch["hosts"], "--devices-per-host", launch["devices_per_host"]]
    if launch["backend"] == "tpu-vm":
        launch_args += tpu_options.flags(_TPU)
    return [*JAX_CACHE_ENV, TRM, "launch", *map(str, launch_args), "--", *train_args]


def preflight_command():
    """`trm preflight` with the study's storage and the pool's place, in the launcher's flags, as an argument list."""
    pool = {key: _TPU[key] for key in ("zone", "project", "slices", "create", "accelerator_type")}
    return [TRM, "preflight", "--storage", config["storage"], *tpu_options.flags(pool)]


def estimate_message(wildcards):
    first = first_with_same_run(wildcards.exp)
    if first != wildcards.exp:
        return f"train {wildcards.exp}: same config as {first}, whose run it collects (no training)"
    hours = ESTIMATED_HOURS[wildcards.exp]
    return (
        f"train {wildcards.exp}: estimated {hours:.4g} {config['accelerator']['name']}-hours "
        f"(from its FLOPs and batch; {hours / DEVICES:.3g} h on the job's {DEVICES} devices)"
    )


def dataset_source(wildcards):
    """The smoke pool's files (the smoke datasets' input); nothing at the paper scale (a URL or a local path)."""
    return [os.path.join(RESULTS, "pool", f"{split}.csv") for split in ("train", "test")] if config["scale"] == "smoke" else []


def build_flags(wildcards):
    puzzles, num_aug = parse_dataset_name(wildcards.dataset)
    source = os.path.join(RESULTS, "pool") if config["scale"] == "smoke" else config["source"]
    return ["--source", source, "--subsample-size", puzzles, "--num-aug", num_aug, "--seed", config["seed"]]

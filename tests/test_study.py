"""The workflow's Study as plain Python (trm/study/study.py, costs.py): checked settings with where each was set,
the plan, shared runs, one job file per run, commands, estimates, the plan's scales and cost model (selections:
tests/test_selection.py; measured estimates: test_local_estimate.py; the Snakemake layer: test_workflow*.py)."""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import re
import subprocess

import pytest
from workflow_support import DEFAULTS, REPO, TPU_PROFILE, refused, study

from trm.config import config_hash
from trm.errors import UserError
from trm.launch.job import read_job
from trm.study.estimate import (
    accelerator_hours,
    evaluation_batch_steps,
    evaluation_flops,
    evaluation_passes,
    model_costs,
    training_flops,
    training_steps,
)
from trm.study.groups import load_groups
from trm.study.plan import dataset_name, plan_study
from trm.study.scale import MINI, SMOKE
from trm.study.settings import check_settings, load_schema, setting_source
from trm.study.study import CLOUD_RULES, TRM, Study

# ------------------------------------------------------------------------------------------------ settings


def test_nan_and_inf_are_refused_by_every_number_setting(tmp_path):
    """.nan passes every bound of the schema and .inf every lower one: no setting means them."""
    assert refused(tmp_path, {"launch": {"tpu": {"poll_seconds": ".nan"}}}) == (  # as --config gives it
        "--config: setting 'launch.tpu.poll_seconds' = .nan is not valid: expected a finite number (every "
        "setting: docs/configuration.md)"
    )
    schema = load_schema(str(REPO / "workflow/schemas/config.schema.yaml"))
    keys = ["launch.tpu.poll_seconds", "launch.tpu.stale_after_seconds", "accelerator.peak_flops"]
    keys += ["accelerator.utilization", "accelerator.price_per_hour"]
    for key, value in itertools.product(keys, (math.nan, math.inf)):
        settings = copy.deepcopy(DEFAULTS)
        parent, _, name = key.rpartition(".")
        functools.reduce(dict.get, parent.split("."), settings)[name] = value
        with pytest.raises(UserError, match=f"setting '{re.escape(key)}' = \\.(nan|inf) is not valid"):
            check_settings(settings, schema, lambda _: "config/config.yaml")


def test_bad_settings_are_one_line_naming_where_they_were_set(tmp_path):
    message = refused(tmp_path, {"scael": "smoke"})
    assert message.startswith("--config: unknown key 'scael'") and "scale" in message and "storage" in message
    message = refused(tmp_path, {"scale": "huge"})
    assert "huge" in message and "smoke" in message and "paper" in message
    message = refused(tmp_path, {"launch": {"hosts": "two"}})
    assert "two" in message and "integer" in message
    typed = study(tmp_path / "typed", {"experiments": ["exp01a"], "launch": {"hosts": "2"}})
    assert typed.job_devices("exp01a") == 2  # --config gives strings
    message = refused(tmp_path, {"test_time_steps": {"smoke": [16, 0]}})
    assert "test_time_steps.smoke[1]" in message and "expected at least 1" in message
    # Ids reach file paths and shell commands.
    message = refused(tmp_path, {"experiments": ["exp01a; rm -rf /"]})
    assert "exp01a; rm -rf /" in message and "^[a-z0-9_]+$" in message
    assert refused(tmp_path, {"results": "out/{x}"}).startswith("--config: results 'out/{x}': { and }")
    assert "starts with '-'" in refused(tmp_path, {"source": "-rf"})
    message = refused(
        tmp_path, {"launch": {"tpu": {"zone": "Bad Zone"}}}, profile=TPU_PROFILE | {"storage": "gs://b-1/s"}
    )
    assert message.startswith("--config: launch.tpu.zone 'Bad Zone'")
    message = refused(tmp_path, {"storage": "results/storage"}, profile=TPU_PROFILE)
    assert message.startswith("--config: storage") and "the tpu-vm backend needs a gs:// URL" in message


def test_unknown_experiment_or_group_lists_the_allowed_ids(tmp_path):
    message = refused(tmp_path, {"experiments": ["exp01z"]})
    assert "exp01z" in message and "did you mean" in message and "exp10e" in message
    message = refused(tmp_path, {"groups": ["exp11"]})
    assert "exp11" in message and "contrib02" in message
    message = refused(tmp_path, {"launch": {"per_experiment": {"ref_papr": {"hosts": 2}}}})
    assert message == "--config: launch.per_experiment: no experiment ref_papr"


def test_a_batch_the_jobs_devices_cannot_split_names_the_settings_that_give_them(tmp_path):
    five = {
        "experiments": ["ref_paper"],
        "launch": {"per_experiment": {"ref_paper": {"devices_per_host": 5}}},
    }
    message = refused(tmp_path, five)
    assert (
        message.startswith("--config: ") and "train.global_batch_size=" in message and "5 devices" in message
    )


def test_setting_source_names_the_command_line_then_the_last_file_that_sets_it(tmp_path):
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("launch: {hosts: 2}\nstorage: gs://a/b\n")
    second.write_text("launch: {tpu: {zone: z}}\n")
    files = [str(first), str(second)]
    assert setting_source("launch.hosts", {"launch": {"hosts": 4}}, files, "d.yaml") == "--config"
    assert setting_source("launch.hosts", {}, files, "d.yaml").endswith("first.yaml")
    assert setting_source("launch.tpu.zone", {}, files, "d.yaml").endswith("second.yaml")
    assert setting_source("launch", {}, files, "d.yaml").endswith("second.yaml")  # the last that sets it
    assert setting_source("seed", {}, files, "d.yaml") == "d.yaml"


# ------------------------------------------------------------------------------------ runs, jobs, commands


def test_same_config_experiments_share_one_run_and_one_job_file(tmp_path):
    experiments = ["exp01a", "exp06_f", "exp01c", "exp05_d"]  # exp01c and exp05_d: two baselines, one run
    planned = study(tmp_path, {"experiments": experiments})
    assert planned.first_with_same_run("exp05_d") == "exp01c" == planned.first_with_same_run("exp01c")
    # The baselines' replicates (replicates.smoke.baseline) are shared seed by seed too.
    assert planned.distinct_runs() == ["exp01a", "exp01c", "exp01c~s1", "exp01c~s2", "exp06_f"]
    assert planned.first_with_same_run("exp05_d~s2") == "exp01c~s2"
    assert planned.trained_first("exp01c") == []
    assert planned.run_summary("exp05_d") == str(tmp_path / "results/smoke/runs/exp05_d.json")
    assert planned.trained_first("exp05_d") == [planned.run_summary("exp01c")]  # summarised after exp01c's
    assert (
        planned.costs.message("exp05_d")
        == "train exp05_d: same config as exp01c, whose run it collects (no training)"
    )
    planned.write_jobs()
    jobs = tmp_path / "results/smoke/jobs"
    assert sorted(p.name for p in jobs.iterdir()) == sorted({f"{e.hash}.json" for e in planned.plan.values()})
    # What the aggregate rule takes as input, to read each run's config: the job files written, once each.
    assert sorted(planned.job_file(e) for e in planned.distinct_runs()) == sorted(
        str(p) for p in jobs.iterdir()
    )
    for exp in planned.plan.values():
        job = read_job(planned.job_file(exp.id))
        assert job.run.config == exp.config and job.run.config_hash == exp.hash == config_hash(exp.config)
        assert job.run.data == str(tmp_path / f"storage/smoke/datasets/{exp.dataset}")
        assert job.run.run_dir == str(tmp_path / f"storage/smoke/runs/{exp.hash}")
        sampling = job.test_time_trajectories, job.test_time_noise
        assert (job.test_time_steps, job.test_time_subset, *sampling) == ((16, 32), 64, (4,), 0.3)
        assert (job.backend, job.hosts, job.devices_per_host) == ("local", 1, 1)
        assert "preflight" not in job.tpu and job.tpu["code_url"] == str(tmp_path / "storage/code")
    # Written once: an unchanged job file keeps its time, so Snakemake reruns nothing for it.
    stamps = {p: p.stat().st_mtime_ns for p in jobs.iterdir()}
    study(tmp_path, {"experiments": experiments}).write_jobs()
    assert {p: p.stat().st_mtime_ns for p in jobs.iterdir()} == stamps


def test_the_train_command_launches_the_job_file_with_the_jax_cache(tmp_path):
    planned = study(tmp_path, {"experiments": ["exp01a"]})
    job = planned.job_file("exp01a")
    assert planned.train_command("exp01a") == [
        "env",
        f"JAX_COMPILATION_CACHE_DIR={tmp_path / 'results/.cache/jax'}",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0",
        TRM,
        "launch",
        "--job",
        job,
    ]
    assert job == str(tmp_path / f"results/smoke/jobs/{planned.plan['exp01a'].hash}.json")
    assert planned.dataset_source() == [
        str(tmp_path / f"results/smoke/pool/{s}.csv") for s in ("train", "test")
    ]
    flags = planned.build_flags("p20-a50")
    assert flags == [
        "--source",
        str(tmp_path / "results/smoke/pool"),
        "--subsample-size",
        20,
        "--num-aug",
        50,
        "--seed",
        0,
    ]


def test_an_experiment_runs_on_its_own_accelerator_and_pool(tmp_path):
    """profiles/tpu-v4-64 runs the paper-recipe reference (batch 768) on a v4-8: its own shape, pool and hours."""
    bucket = {"storage": "gs://trm-bucket/study", "experiments": ["exp01c", "ref_paper"]}
    planned = study(tmp_path, bucket, profile=TPU_PROFILE)
    own, shared = read_job_of(planned, "ref_paper"), read_job_of(planned, "exp01c")
    assert (own.backend, own.hosts, own.devices_per_host) == ("tpu-vm", 1, 4)
    assert own.tpu["slices"] == ["trm-v4-8"] and own.tpu["accelerator_type"] == "v4-8"
    assert (shared.hosts, shared.devices_per_host, shared.tpu["slices"]) == (8, 4, ["trm-v4-64"])
    assert own.tpu["stale_after_seconds"] == shared.tpu["stale_after_seconds"] == 900  # the profile's
    assert own.test_time_subset == shared.test_time_subset == 43008  # test_time_subset.paper
    assert own.tpu["code_url"] == "gs://trm-bucket/study/code" and own.run.run_dir.startswith(
        "gs://trm-bucket/study/paper/runs/"
    )
    hours = planned.costs.hours
    assert hours["ref_paper"]["training"] == pytest.approx(
        hours["exp01c"]["training"], rel=0.01
    )  # same FLOPs
    assert "on the job's 4 devices" in planned.costs.message("ref_paper")
    assert "on the job's 32 devices" in planned.costs.message("exp01c")
    assert "each on its own devices" in planned.costs.plan_text()
    preflight = planned.preflight_command()
    assert preflight[:4] == [TRM, "preflight", "--storage", "gs://trm-bucket/study"]
    assert "--tpu-create" in preflight and preflight[preflight.index("--tpu-slices") + 1] == "trm-v4-64"


def read_job_of(planned: Study, exp_id: str):
    planned.write_jobs()
    return read_job(planned.job_file(exp_id))


# ------------------------------------------------------------------------------------------ estimates


ONE_SEED = {"replicates": {"smoke": {"baseline": 1}}}  # the replicates' own costs: tests/test_replicates.py


def test_plan_summary_and_each_jobs_estimate(tmp_path):
    planned = study(tmp_path, {"groups": ["exp06"], **ONE_SEED})
    costs = planned.costs
    assert sorted(costs.hours) == [*(f"exp06_{x}" for x in "abcdef"), "ref_paper"]
    # Same epochs and data: the same examples and FLOPs whatever the batch (each job gets its own figure).
    training = [costs.hours[f"exp06_{x}"]["training"] for x in "abcdef"]
    assert max(training) == pytest.approx(min(training), rel=0.3)
    # Evaluation computes whole batches, no more rows than the puzzles need: the 256 smoke test puzzles are whole
    # batches of 8 (exp06_a) and one batch of just them, not 256 rows of a batch (exp06_f).
    puzzles = SMOKE.test_puzzles
    assert f"training, {-(-puzzles // 8) * 8} rows x 16 steps at the end" in costs.message("exp06_a")
    assert f"training, {puzzles} rows x 16 steps at the end" in costs.message("exp06_f")
    first, training_line, evaluation_line, mlp_t = costs.message("exp06_a").splitlines()
    assert mlp_t == "    MLP-T:      plain (arch.mlp_t_kernel auto)"  # on this machine's CPU
    assert (
        first
        == "train exp06_a: estimated on the job's 1 devices, from its FLOPs and batch at an assumed 10% of peak"
    )
    assert training_line.startswith(
        f"    training:   {costs.hours['exp06_a']['training']:.4g} CPU core-hours ("
    )
    assert evaluation_line.endswith(  # the curve on the smoke subset, then K = 4 trajectories of its 64 puzzles
        "then 64 rows x 32 steps on the test-time subset (counts 16,32), then 256 rows x 32 steps sampling "
        "trajectories"
    )
    summary = costs.plan_text().splitlines()
    assert summary[0] == (
        "TRM study, scale smoke: 6 experiments in 1 groups and 1 reference, 1 datasets, 7 distinct runs; "
        "estimated at an assumed 10% of peak (a rough bound, not a forecast):"
    )
    for line, part in zip(summary[1:3], ("training", "evaluation"), strict=True):
        total = sum(hours[part] for hours in costs.hours.values())
        assert (
            line == f"  {part + ':':<12}{total:.4g} CPU core-hours ({total:.4g} h of jobs on 1 devices each)"
        )
    cache_file = tmp_path / "results/.cache/model-costs.json"
    assert not cache_file.exists()  # planning writes nothing; a real run's onstart keeps the costs
    costs.save_cache()
    cache = json.loads(cache_file.read_text())
    assert sorted(cache) == sorted({exp.hash for exp in planned.plan.values()})  # model costs kept by hash


def test_a_price_per_device_hour_prices_the_planned_hours(tmp_path):
    planned = study(tmp_path, {"groups": ["exp06"], "accelerator": {"price_per_hour": 2.5}, **ONE_SEED})
    hours = sum(h["training"] + h["evaluation"] for h in planned.costs.hours.values())
    *_, price = planned.costs.plan_text().splitlines()
    assert price.startswith(
        f"  price:      ${hours * 2.5:,.0f} for these {hours:.4g} CPU core-hours at $2.5 each"
    )
    assert "bills while it exists" in price
    message = refused(tmp_path, {"accelerator": {"price_per_hour": -1}})
    assert "accelerator.price_per_hour" in message and "--config" in message


def test_a_step_floor_prices_dispatch_bound_steps_and_leaves_large_ones(tmp_path):
    # The mini baseline's step on a GPU is bound by dispatch (2.7 ms measured on an H200), not by its FLOPs: a
    # floor of s seconds a step prices each training step and each supervision step of an evaluation batch at s.
    settings = {"scale": "mini", "groups": ["exp06"], "replicates": {"mini": {"baseline": 1}}}
    gpu = {"name": "GPU", "peak_flops": 1e15, "utilization": 0.4}
    bare = study(tmp_path / "bare", {**settings, "accelerator": gpu}).costs
    floored = study(tmp_path / "floor", {**settings, "accelerator": {**gpu, "step_floor_s": 0.0027}}).costs
    config = next(e.config for e in plan_study("mini", ["exp06_c"]))
    steps = training_steps(config)
    assert steps == 2000  # 128 epochs x 1000 puzzles / batch 64 (rounded per evaluation interval)
    assert floored.hours["exp06_c"]["training"] == pytest.approx(steps * 0.0027 / 3600)
    assert bare.hours["exp06_c"]["training"] < floored.hours["exp06_c"]["training"] / 10
    # Evaluation: 7 intermediate passes of 512 puzzles (8 batches of 64) to 16 steps, one final pass of the 1,024
    # test puzzles (16 batches) to 64 steps, the largest test-time count.
    batch_steps = evaluation_batch_steps(config, MINI.test_puzzles, (16, 32, 64))
    assert batch_steps == 7 * 8 * 16 + 16 * 64
    # Then the sampled recursion (test_time_trajectories.mini): K = 4 (16 puzzles of 4 rows a batch: 64 batches)
    # and 16 (4 puzzles: 256 batches) to 64 steps.
    sampled = (
        evaluation_batch_steps(config, MINI.test_puzzles, (16, 32, 64), trajectories=(4, 16)) - batch_steps
    )
    assert sampled == (64 + 256) * 64
    assert floored.hours["exp06_c"]["evaluation"] == pytest.approx((batch_steps + sampled) * 0.0027 / 3600)
    assert "at least 2.7 ms a step (accelerator.step_floor_s)" in floored.plan_text().splitlines()[0]
    # A step slower than the floor keeps its FLOPs' time: the paper's baseline at batch 6144.
    paper = next(e.config for e in plan_study("paper", ["exp01c"]))
    flops = training_flops(paper, model_costs(paper))
    assert accelerator_hours(flops, 1e15, 0.4, training_steps(paper), 0.0027) == accelerator_hours(
        flops, 1e15, 0.4
    )
    assert "accelerator.step_floor_s" in refused(tmp_path, {"accelerator": {"step_floor_s": 0}})


def test_estimate_matches_the_spec_flops_of_a_paper_baseline_run():
    baseline = next(e.config for e in plan_study("paper", ["exp01c"]))
    costs = model_costs(baseline)
    assert training_flops(baseline, costs) == pytest.approx(2.136e18, rel=0.01)  # the paper's MLP-T training
    # The evaluations as the trainer runs them: 9 intermediate ones on eval_subset = 8192 puzzles (2 batches of
    # 6144 rows) to eval_steps = 16, and one pass over the whole test split (69 batches) to 128 steps.
    passes = evaluation_passes(baseline, 423_168, (16, 32, 64, 128))
    assert passes == {
        "intermediate": (9, 12_288, 16),
        "final": (1, 69 * 6144, 128),
        "test_time": (0, 0, 0),
        "sampled": (0, 0, 0),
    }
    forward = costs["eval_flops_per_example_step"]
    assert (
        evaluation_flops(baseline, costs, 423_168, (16, 32, 64, 128))
        == (9 * 12_288 * 16 + 69 * 6144 * 128) * forward
    )
    # The test-time pass is ~5.5e16 x 128 forward steps: about 1.4e18 FLOP (issue #17's figure).
    assert 69 * 6144 * 128 * forward == pytest.approx(1.4e18, rel=0.1)


# ------------------------------------------------------------------------------------------ scales


def test_smoke_scale_keeps_what_each_group_varies():
    paper = {e.id: e.config for e in plan_study("paper")}
    smoke = {e.id: e.config for e in plan_study("smoke")}

    def values(configs, group):
        return [tuple(_get(configs[m], key) for key in group["varies"]) for m in group["members"]]

    for group in load_groups():
        paper_values, smoke_values = values(paper, group), values(smoke, group)
        assert len(set(smoke_values)) == len(set(paper_values)) == len(group["members"]), group["id"]
        # The order of the varied values is kept too (ranks of each key across members).
        for k in range(len(group["varies"])):
            paper_k, smoke_k = [v[k] for v in paper_values], [v[k] for v in smoke_values]
            if all(isinstance(v, int | float) and not isinstance(v, bool) for v in paper_k):
                assert sorted(range(len(paper_k)), key=paper_k.__getitem__) == sorted(
                    range(len(smoke_k)), key=smoke_k.__getitem__
                ), (group["id"], group["varies"][k])
    widths = [smoke[f"exp01{x}"]["arch"]["hidden_size"] for x in "abcdef"]
    divisor = SMOKE.rules["arch.hidden_size"][1]
    assert [w * divisor for w in widths] == [paper[f"exp01{x}"]["arch"]["hidden_size"] for x in "abcdef"]


def test_smoke_datasets_map_one_to_one_and_scale_changes_the_hash():
    paper, smoke = plan_study("paper"), plan_study("smoke")
    pairs = {(p.dataset, s.dataset) for p, s in zip(paper, smoke, strict=True)}
    assert len({p for p, _ in pairs}) == len({s for _, s in pairs}) == len(pairs) == 10
    assert dataset_name(paper[0].config) == "p1000-a1000"
    assert all(p.hash != s.hash for p, s in zip(paper, smoke, strict=True))
    baselines = {e.hash for e in smoke if e.id in {g["baseline"] for g in load_groups()}}
    assert len(baselines) == 1  # every group's baseline is the same smoke run config


def _get(config: dict, dotted: str):
    for key in dotted.split("."):
        config = config[key]
    return config


# ------------------------------------------------------------------------------------------ before the first job


def test_only_a_job_that_reaches_storage_or_a_slice_needs_a_real_bucket_and_the_preflight(
    tmp_path, monkeypatch
):
    preflights = []

    def preflight(argv, **kwargs):
        preflights.append(argv)
        return subprocess.CompletedProcess(argv, returncode=len(preflights) - 1)  # passes, then fails

    monkeypatch.setattr(subprocess, "run", preflight)
    shipped = study(
        tmp_path / "shipped", {"experiments": ["exp01a"]}, profile=TPU_PROFILE
    )  # gs://YOUR-BUCKET
    assert shipped.placeholder_storage.startswith(
        "profiles/tpu-v4-64/study.yaml: storage 'gs://YOUR-BUCKET/trm-study': YOUR-BUCKET is a placeholder"
    )
    shipped.check_before_jobs({"compile_step", "puzzle_pool", "build_dataset"})  # all on this machine
    with pytest.raises(UserError, match="YOUR-BUCKET is a placeholder"):
        shipped.check_before_jobs({"build_dataset", "stage_dataset"})
    assert preflights == []

    planned = study(
        tmp_path / "set", {"experiments": ["exp01a"], "storage": "gs://trm-bucket/s"}, profile=TPU_PROFILE
    )
    assert planned.placeholder_storage is None
    planned.check_before_jobs({"compile_step"})
    planned.check_before_jobs({"train", "aggregate"})
    assert preflights == [planned.preflight_command()]
    with pytest.raises(UserError, match="trm preflight failed"):
        planned.check_before_jobs({"stage_dataset"})
    rules = "".join(path.read_text() for path in (REPO / "workflow/rules").glob("*.smk"))
    assert all(f"\nrule {name}:" in rules for name in CLOUD_RULES)

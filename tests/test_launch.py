"""`trm launch` on the local backend and the distributed settings: environments, supervision, signals, bad input."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from trm.cli import main as trm
from trm.errors import UserError
from trm.launch import local
from trm.launch.local import host_environment, one_thread_per_job, run_processes
from trm.run import distributed
from trm.run.state import read_run


def _options(argv: list[str]) -> distributed.DistributedOptions:
    parser = argparse.ArgumentParser()
    distributed.add_arguments(parser)
    return distributed.options_from_args(parser.parse_args(argv))


def test_distributed_options_from_flags_and_environment(monkeypatch):
    for name in ("TRM_DISTRIBUTED", "TRM_COORDINATOR", "TRM_NUM_PROCESSES", "TRM_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    assert _options([]).mode == "off"
    explicit = _options(["--coordinator", "10.0.0.1:9999", "--num-processes", "8", "--process-id", "3"])
    assert (explicit.mode, explicit.coordinator, explicit.num_processes, explicit.process_id) == (
        "explicit",
        "10.0.0.1:9999",
        8,
        3,
    )
    monkeypatch.setenv("TRM_COORDINATOR", "127.0.0.1:1234")
    monkeypatch.setenv("TRM_NUM_PROCESSES", "2")
    monkeypatch.setenv("TRM_PROCESS_ID", "1")
    monkeypatch.setenv("TRM_HEARTBEAT_TIMEOUT", "7")
    from_env = _options(["--process-id", "0"])  # a flag wins over its variable
    assert (from_env.coordinator, from_env.process_id, from_env.heartbeat_timeout) == ("127.0.0.1:1234", 0, 7)
    monkeypatch.setenv("TRM_DISTRIBUTED", "auto")
    assert _options([]).mode == "auto"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--coordinator", "h:1"], {}, "needs --num-processes and --process-id"),
        (["--coordinator", "h:1", "--num-processes", "2", "--process-id", "2"], {}, "must lie in 0..1"),
        (["--num-processes", "2"], {}, "need --coordinator"),
        ([], {"TRM_HEARTBEAT_TIMEOUT": "soon"}, "TRM_HEARTBEAT_TIMEOUT='soon': expected an integer"),
        ([], {"TRM_SHUTDOWN_TIMEOUT": "0"}, "--shutdown-timeout 0: must be >= 1"),
    ],
)
def test_bad_distributed_settings_are_named(monkeypatch, argv, env, message):
    for name in ("TRM_DISTRIBUTED", "TRM_COORDINATOR", "TRM_NUM_PROCESSES", "TRM_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        _options(argv)


def test_host_environments():
    base = {"PATH": "/bin", "TRM_COORDINATOR": "stale:1", "TRM_HEARTBEAT_TIMEOUT": "5"}
    single = host_environment(base, hosts=1, devices=4, index=0, port=1234)
    assert single["JAX_PLATFORMS"] == "cpu" and single["JAX_NUM_CPU_DEVICES"] == "4"
    assert "TRM_COORDINATOR" not in single and "TRM_PROCESS_ID" not in single  # one host: no coordinator
    second = host_environment(base, hosts=2, devices=2, index=1, port=1234)
    assert (second["TRM_COORDINATOR"], second["TRM_NUM_PROCESSES"], second["TRM_PROCESS_ID"]) == (
        "127.0.0.1:1234",
        "2",
        "1",
    )
    assert second["TRM_HEARTBEAT_TIMEOUT"] == "5"  # the user's setting wins over the launcher's default
    assert second["TRM_SHUTDOWN_TIMEOUT"] == "10"
    assert base["TRM_COORDINATOR"] == "stale:1"  # the caller's mapping is not modified
    assert single["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"


def test_hosts_get_malloc_on_huge_pages_unless_the_user_chose():
    own = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"}
    assert host_environment(own, 1, 1, 0, 1)["GLIBC_TUNABLES"] == own["GLIBC_TUNABLES"]
    other = host_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, 1, 1, 0, 1)
    assert other["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


def test_cpu_hosts_compile_without_llvms_expensive_passes_and_keep_the_users_flags():
    cpu = host_environment({"XLA_FLAGS": "--xla_dump_to=/tmp/x"}, 1, 1, 0, 1)
    assert cpu["XLA_FLAGS"] == f"--xla_dump_to=/tmp/x {local.CPU_COMPILE_FLAG}"
    own = {"XLA_FLAGS": "--xla_llvm_disable_expensive_passes=false"}
    assert host_environment(own, 1, 1, 0, 1)["XLA_FLAGS"] == own["XLA_FLAGS"]  # the user's choice wins
    gpu = host_environment({}, 1, 1, 0, 1, gpus=["0"])
    assert "XLA_FLAGS" not in gpu  # GPU kernels keep LLVM's full optimisation


def test_jobs_of_the_workflow_get_one_xla_thread_unless_the_user_chose():
    environ = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    one_thread_per_job(environ)
    assert environ == {"XLA_FLAGS": "--xla_dump_to=/tmp/x", "NPROC": "1"}
    own = {"NPROC": "2"}
    one_thread_per_job(own)
    assert own == {"NPROC": "2"}


def test_cpu_hosts_get_the_thread_pool_of_one_process_holding_all_the_devices():
    cores = len(os.sched_getaffinity(0))
    host = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}
    distributed.size_cpu_thread_pool(4, host)
    assert host["NPROC"] == str(max(cores, 8))
    alone = {"JAX_PLATFORMS": "cpu"}
    distributed.size_cpu_thread_pool(1, alone)
    assert alone["NPROC"] == str(cores)  # what a single process gets anyway
    # A budget (a workflow job's one thread) is raised to the job's devices, as XLA raises one process's pool.
    budget = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2", "NPROC": "1"}
    distributed.size_cpu_thread_pool(2, budget)
    assert budget["NPROC"] == "4"
    wide = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2", "NPROC": "64"}
    distributed.size_cpu_thread_pool(2, wide)
    assert wide["NPROC"] == "64"
    tpu = {"JAX_NUM_CPU_DEVICES": "2"}
    distributed.size_cpu_thread_pool(8, tpu)
    assert "NPROC" not in tpu  # not on a TPU host


def _run_hosts(*codes: str) -> int:
    """run_processes with one host per Python snippet, each in this process's environment."""
    return run_processes([[sys.executable, "-c", code] for code in codes], [dict(os.environ)] * len(codes))


def test_a_failing_host_stops_the_others_and_sets_the_exit_code(capsys, monkeypatch):
    monkeypatch.setattr(local, "FAILED_GRACE_S", 1.0)
    started = time.time()
    code = _run_hosts("import time; print('waiting', flush=True); time.sleep(120)", "print('bye'); exit(3)")
    assert code == 3
    assert time.time() - started < 30  # the sleeping host was killed, not waited for
    out = capsys.readouterr().out
    assert "[host 1] bye" in out and "[host 0] waiting" in out
    assert "host 1 failed with code 3" in out


def test_hosts_failing_moments_after_the_first_end_on_their_own(capsys, monkeypatch):
    """Hosts that fail in setup for one reason exit moments apart; the later ones are not killed first, so process
    0 still writes its failed status.json (the launcher's grace, FAILED_GRACE_S), and the first failure's code is
    the job's."""
    monkeypatch.setattr(local, "FAILED_GRACE_S", 30.0)
    started = time.time()
    code = _run_hosts("import time; time.sleep(1); print('status written', flush=True); exit(2)", "exit(3)")
    out = capsys.readouterr().out
    assert code == 3 and "[host 0] status written" in out and "host exit codes: [2, 3]" in out, out
    assert time.time() - started < 20  # it ended when they did, not after the grace


def test_all_hosts_succeed_and_a_signal_becomes_a_preemption_everywhere(capsys):
    assert _run_hosts("print('a')", "print('b')") == 0

    # Hosts that save and exit 42 on SIGTERM, as the trainer does; the launcher gets SIGINT (Ctrl-C).
    host = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )

    def interrupt_when_ready():
        deadline, seen = time.time() + 60, ""
        while seen.count("ready") < 2 and time.time() < deadline:  # the two lines may come in separate reads
            seen += capsys.readouterr().out
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_ready, daemon=True).start()
    started = time.time()
    assert _run_hosts(host, host) == 42
    assert time.time() - started < 60


def test_hosts_that_do_not_stop_within_the_grace_are_killed(capsys, monkeypatch):
    monkeypatch.setattr(local, "STOP_GRACE_S", 2.0)
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(120)\n"

    def interrupt_when_ready():
        deadline = time.time() + 60
        while "ready" not in capsys.readouterr().out and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=interrupt_when_ready, daemon=True).start()
    started = time.time()
    assert _run_hosts(stubborn) == 128 + signal.SIGKILL
    assert time.time() - started < 60
    assert "hosts still running 2 s after the stop request: killed" in capsys.readouterr().out


def test_launch_rejects_bad_arguments(capsys):
    assert trm(["launch", "--hosts", "0", "--config", "c"]) == 2
    assert capsys.readouterr().err == (
        "trm launch: error: argument --hosts: expected an integer >= 1, got '0' (see trm launch --help)\n"
    )
    assert trm(["launch", "--hosts", "2", "--data", "d"]) == 2
    assert "trm launch: error: no --config, --run-dir: trm launch --job FILE, or" in capsys.readouterr().err
    assert trm(["launch", "--config", "c", "--data", "d", "--run-dir", "r", "--", "--process-id", "1"]) == 2
    assert "--process-id: the launcher sets the multi-host options itself" in capsys.readouterr().err
    # The run's arguments are parsed once, by the launcher: after -- come only the trainer's other options.
    assert trm(["launch", "--data", "d", "--run-dir", "r", "--", "--config", "c", "--log-every", "4"]) == 2
    assert (
        "--config: the run's arguments come before --; after -- only trainer options"
        in capsys.readouterr().err
    )


def test_the_launchers_run_arguments_are_trm_trains():
    """`trm launch` by hand takes the run's arguments that `trm train` defines (add_run_arguments), and knows each
    by its name, to refuse it after -- or beside --job."""
    from trm.launch.launch_command import RUN_ARGS
    from trm.train.train_command import add_run_arguments

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    defined = {flag: action.dest for action in parser._actions for flag in action.option_strings}
    defined.pop("--help"), defined.pop("-h")
    assert defined == RUN_ARGS


def test_a_bad_config_is_refused_once_before_any_host_starts(tmp_path, capsys):
    """The launcher resolves the run's config itself, once: a missing file or a batch the job's devices cannot
    split is refused before a host starts or the run dir is written."""
    run = ["--data", str(tmp_path), "--run-dir", str(tmp_path / "run")]
    assert trm(["launch", "--hosts", "2", "--config", str(tmp_path / "missing.yaml"), *run]) == 2
    captured = capsys.readouterr()
    assert "missing.yaml: config file not found" in captured.err and "[host" not in captured.out
    base = str(Path(__file__).resolve().parents[1] / "config" / "base.yaml")
    assert trm(["launch", "--hosts", "2", "--config", base, *run, "--set=train.global_batch_size=9"]) == 2
    assert "train.global_batch_size=9 must be divisible by" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_job_whose_trainers_fail_before_training_fails_at_once_with_a_failed_status(tmp_path, capsys):
    """No dataset at --data: both hosts fail while setting up; the launcher returns their code at once and the
    run dir says why (process 0's failed status.json), as `trm status` and the TPU launcher read it."""
    run = tmp_path / "run"
    started = time.monotonic()
    code = trm(
        [
            "launch",
            "--hosts",
            "2",
            "--config",
            str(Path(__file__).resolve().parents[1] / "config" / "base.yaml"),
            "--data",
            str(tmp_path / "no-dataset"),
            "--run-dir",
            str(run),
            "--set=arch.hidden_size=32",
            "--set=arch.num_heads=2",
            "--set=train.global_batch_size=8",
        ]
    )
    out = capsys.readouterr().out
    assert code == 2, out[-3000:]
    assert time.monotonic() - started < 120
    state = read_run(str(run))
    assert state.state == "failed" and "no-dataset/MANIFEST.json not found" in state.detail, state
    assert "[host 0]" in out and "[host 1]" in out

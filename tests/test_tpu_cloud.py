"""The tpu-vm launcher against the cloud's states and errors, and the hosts' set-up on the stock image, each
injected into the fake gcloud (tests/fake_gcloud/gcloud): fast unit-level tests, tiny polls, no training.
The end-to-end runs (training, preemption, cancelling) are in test_tpu_vm.py and test_chaos.py.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from fake_tpu import gcloud_calls, write_wheel

from trm.errors import UserError
from trm.launch import gcloud, tpu_host, tpu_options, wheel
from trm.launch.tpu_slice import Slice, SliceLost

pytestmark = pytest.mark.tpu

REPO = Path(__file__).resolve().parents[1]
NAME = "trm-cloud"
ZONE = "us-central2-b"


def _local_python_311() -> str:
    """A local Python 3.11 for uv instead of a downloaded one (the hosts' venv is 3.11, as on real hosts): the
    interpreter behind this venv when the suite runs on 3.11, else one on PATH or pyenv's."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [
        Path(sys.base_prefix) / "bin" / "python3.11",
        Path(shutil.which("python3.11") or "/nonexistent"),
    ]
    candidates += sorted(pyenv.glob("versions/3.11*/bin/python3.11"))
    found = next((str(path) for path in candidates if path.is_file()), None)
    assert found, "these tests need a local Python 3.11 for the fake hosts' venv (none found)"
    return found


PYTHON_311 = _local_python_311()


@pytest.fixture(autouse=True)
def _lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's lock files and the records of created slices (trm/launch/slice_ledger.py) in the test's own
    folder: the default, ~/.cache/trm/tpu-locks, is the user's."""
    defaults = tpu_options.defaults()
    monkeypatch.setattr(tpu_options, "defaults", lambda: {**defaults, "lock_dir": str(tmp_path / "locks")})


def _options(**overrides) -> tpu_options.TpuOptions:
    settings = {
        **tpu_options.defaults(),
        "slices": [NAME],
        "code_url": "gs://bkt/code",
        "poll_seconds": 0.05,
        "gcloud_timeout_seconds": 60,  # no spurious timeouts on a loaded machine; the timeout test sets its own
        "provision_timeout_seconds": 600,
        "repair_timeout_seconds": 0.5,
        **overrides,
    }
    return tpu_options.check(settings)


def _slice(messages: list[str], **overrides) -> Slice:
    return Slice(NAME, _options(**overrides), messages.append)


def _fake(*args: str) -> None:
    subprocess.run(["gcloud", *args], check=True, timeout=30)


def _verbs(cloud: Path) -> list[str]:
    return [" ".join(argv[2:4]) for argv in gcloud_calls(cloud) if argv[:2] == ["compute", "tpus"]]


# ------------------------------------------------------------------------------------------ transient errors


@pytest.mark.parametrize("kind", ["unavailable", "throttled", "network", "timeout"])
def test_transient_describe_failures_are_retried_and_never_read_as_gone(cloud, kind):
    _fake("fake-create-node", NAME)
    _fake("fake-fault", "describe", kind, "1" if kind == "timeout" else "3")
    messages = []
    started = time.time()
    cloud_slice = _slice(messages, gcloud_timeout_seconds=3 if kind == "timeout" else 60)
    assert cloud_slice.health() == ("ok", "READY")
    assert _verbs(cloud).count("tpu-vm describe") == (2 if kind == "timeout" else 4)
    assert len([m for m in messages if "transient failure" in m]) == (1 if kind == "timeout" else 3)
    assert time.time() - started < 60


def test_a_describe_failing_for_the_whole_retry_budget_is_unknown_not_lost(cloud):
    _fake("fake-create-node", NAME)
    _fake("fake-fault", "describe", "unavailable", "100")
    unanswered = _slice([])
    unanswered.retry = dataclasses.replace(unanswered.retry, budget_s=1.0)
    health, detail = unanswered.health()
    assert health == "unknown" and "UNAVAILABLE" in detail


def test_transient_failures_while_provisioning_delete_nothing(cloud):
    """create mode on a healthy ACTIVE slice: failed describes make the launcher wait, never recreate."""
    messages = []
    _slice(messages, create=True).ensure_ready()  # creates it: ACCEPTED ... ACTIVE, node READY
    _fake("fake-fault", "describe", "unavailable", "4")
    node = _slice(messages, create=True).ensure_ready()
    assert node.state == "READY" and node.endpoints == ["127.0.0.1", "127.0.0.1"]
    verbs = _verbs(cloud)
    assert verbs.count("queued-resources create") == 1 and "queued-resources delete" not in verbs


def test_a_permanent_error_fails_with_the_clouds_message(cloud):
    _fake("fake-create-node", NAME)
    _fake("fake-fault", "describe", "permission")
    with pytest.raises(UserError, match="PERMISSION_DENIED: Permission 'tpu.nodes.get' denied"):
        _slice([]).health()


def test_a_timed_out_call_is_transient_not_an_exception(cloud):
    _fake("fake-fault", "list", "timeout")
    started = time.time()
    done = gcloud.run(gcloud.list_nodes(gcloud.Location(ZONE)), timeout=1.5)
    assert done.returncode == gcloud.EXIT_TIMEOUT and gcloud.classify(done) == "transient"
    assert time.time() - started < 30


# ------------------------------------------------------------------------------------------ queued resources


def test_queued_resource_waits_through_its_states_until_active(cloud):
    messages = []
    node = _slice(messages, create=True).ensure_ready()
    assert node.state == "READY" and len(node.endpoints) == 2
    seen = [
        m.removeprefix(f"queued resource {NAME} is ") for m in messages if m.startswith("queued resource")
    ]
    assert seen == ["ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]


def test_a_failed_queued_resource_fails_the_job_at_once_with_the_clouds_message(cloud):
    subprocess.run(
        gcloud.create_queued_resource(
            NAME, NAME, gcloud.Location(ZONE), "v4-64", "tpu-ubuntu2204-base", "spot"
        ),
        check=True,
        timeout=30,
    )
    _fake("fake-state", "queued", NAME, "FAILED", "Quota", "TPUV4sPodPerProjectPerZone", "exceeded")
    started = time.time()
    with pytest.raises(UserError, match="FAILED: Quota TPUV4sPodPerProjectPerZone exceeded"):
        _slice([], create=True).ensure_ready()
    assert time.time() - started < 60  # not the provision timeout (600 s)
    assert "queued-resources delete" not in _verbs(cloud)


@pytest.mark.parametrize("state", ["SUSPENDING", "SUSPENDED", "DELETING"])
def test_a_suspended_or_deleting_queued_resource_is_a_preemption(cloud, state):
    messages = []
    _slice(messages, create=True).ensure_ready()
    _fake("fake-state", "queued", NAME, state)
    with pytest.raises(SliceLost, match=state):  # while a job runs: relaunch
        _slice(messages, create=True)._wait_queued_active()
    node = _slice(messages, create=True).ensure_ready()  # the relaunch recreates the slice
    assert node.state == "READY"
    verbs = _verbs(cloud)
    assert verbs.count("queued-resources create") == 2
    assert verbs.count("queued-resources delete") == (0 if state == "DELETING" else 1)


def test_a_delete_that_fails_transiently_is_asked_again(cloud):
    messages = []
    _slice(messages, create=True).ensure_ready()
    _fake("fake-state", "queued", NAME, "SUSPENDED")
    _fake("fake-fault", "delete", "unavailable")
    assert _slice(messages, create=True).ensure_ready().state == "READY"
    assert _verbs(cloud).count("queued-resources delete") == 2
    assert any("delete queued resource trm-cloud failed: HttpError 503" in m for m in messages)


# ------------------------------------------------------------------------------------------ nodes


def test_a_repairing_node_is_waited_for_but_not_forever(cloud):
    _fake("fake-create-node", NAME)
    _fake("fake-state", "node", NAME, "REPAIRING")
    repairing = _slice([], repair_timeout_seconds=30)
    assert repairing.health()[0] == "repairing"
    _fake("fake-state", "node", NAME, "READY")
    assert repairing.health() == ("ok", "READY")
    _fake("fake-state", "node", NAME, "REPAIRING")
    bounded = _slice([])
    assert bounded.health()[0] == "repairing"
    time.sleep(0.6)
    assert bounded.health() == ("lost", f"slice {NAME} is REPAIRING")
    with pytest.raises(UserError, match="still REPAIRING after"):  # pool mode: nothing to recreate
        _slice([]).ensure_ready()


@pytest.mark.parametrize("state", ["PREEMPTED", "TERMINATED"])
def test_a_preempted_or_terminated_node_relaunches(cloud, state):
    messages = []
    _slice(messages, create=True).ensure_ready()
    _fake("fake-state", "node", NAME, state)
    assert _slice(messages, create=True).health() == ("lost", f"slice {NAME} is {state}")
    assert _slice(messages, create=True).ensure_ready().state == "READY"  # deleted and recreated
    assert _verbs(cloud).count("queued-resources delete") == 1


# ------------------------------------------------------------------------------------------ the hosts


def _ssh(script: str) -> subprocess.CompletedProcess:
    argv = gcloud.ssh_all(NAME, gcloud.Location(ZONE), script)
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_host_paths_expand_on_the_host_and_the_worker_number_comes_from_the_metadata_server(cloud):
    _fake("fake-create-node", NAME)
    paths = [tpu_host.host_path(p) for p in ("~/a b", "$HOME/c", "~", "/abs/~x", "it's")]
    start = tpu_host.start_script("abcdef12", [], NAME, "127.0.0.1:1", 2, 0)
    worker_lines = [line for line in start.splitlines() if "worker" in line and "TRM_" not in line]
    done = _ssh("\n".join([*worker_lines, f'echo "$worker" {" ".join(paths)}']))
    assert done.returncode == 0, done.stdout + done.stderr
    for index in range(2):
        home = cloud / "hosts" / NAME / str(index)
        assert f"{NAME}-w-{index}: {index} {home}/a b {home}/c {home} /abs/~x it's" in done.stdout


def _stub_dependencies(folder: Path) -> None:
    """A wheel per pinned dependency of pyproject.toml (and jax's tpu extra): what the set-up installs from
    PyPI, empty. Checks that the set-up asks for exactly these names and versions."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        pinned = [s.version for s in requirement.specifier if s.operator == "=="]
        extras = ("tpu",) if requirement.name == "jax" else ()
        write_wheel(folder, requirement.name, pinned[0] if pinned else "1.0", {}, extras=extras)


def test_stock_image_hosts_get_a_python_311_venv_once_per_slice_and_wheel(
    cloud, tmp_path, fake_pypi, monkeypatch
):
    """The real set-up downloads uv, CPython 3.11 and the dependencies (jax[tpu] pulls libtpu) from the
    internet; here they come from a local folder, a local interpreter and empty stub wheels."""
    _fake("fake-create-node", NAME)
    image = _ssh(
        'python3 --version; command -v python3.11 || echo "no python3.11"; command -v uv || echo "no uv"'
    )
    assert image.stdout.count("Python 3.10") == 2 and image.stdout.count("no python3.11") == 2
    assert image.stdout.count("no uv") == 2
    pypi = tmp_path / "pypi"
    pypi.mkdir()
    for source in fake_pypi.iterdir():
        (pypi / source.name).symlink_to(source)
    _stub_dependencies(pypi)
    version = wheel.code_wheel_version()
    built = wheel.build(version, tmp_path)
    key = tpu_host.setup_key("0" * 64, PYTHON_311, True, "0.13.8")
    setup = tpu_host.setup_script(key, str(built), built.name, PYTHON_311, True, "0.13.8")
    monkeypatch.setenv("FAKE_PYPI", str(pypi))
    started = time.time()
    first = _ssh(setup)
    first_s = time.time() - started
    assert first.returncode == 0, first.stdout + first.stderr
    probe = "import sys, importlib.metadata as m; print(sys.version_info[:2], m.version('jax'), m.version('trm-study'))"
    installed = _ssh(f'"$HOME"/.trm/venv/bin/python -c "{probe}"')
    assert installed.stdout.count(f"(3, 11) 0.10.2 {version}") == 2, installed.stdout + installed.stderr
    started = time.time()
    again = _ssh(setup)
    print(f"stock-image set-up on 2 hosts: first {first_s:.1f} s, reused {time.time() - started:.1f} s")
    assert again.stdout.count("set-up current") == 2


def test_a_digest_of_digits_with_a_leading_zero_names_the_wheel_pip_writes(tmp_path):
    """The case met in a test run: the sources' digest was 054675262871, pip named the wheel with 54675262871 (PEP
    440's normal form) and the launcher, looking for the name it had made, failed every TPU job."""
    version = "0.1.0+" + wheel.normal_local("git.0123456789ab.src.054675262871")
    assert version == "0.1.0+git.0123456789ab.src.54675262871"
    assert wheel.build(version, tmp_path).name == wheel.wheel_name(version)
    assert wheel.code_wheel_version() == "0.1.0+" + wheel.normal_local(
        wheel.code_wheel_version().split("+")[1]
    )

"""`trm preflight` against the fake gcloud and the GCS emulator, and with nothing installed or configured.

Each run is a real `trm preflight` process with its own environment: PATH decides whether gcloud exists, and an
empty HOME with NO_GCE_CHECK=true means no Application Default Credentials (no metadata server is contacted).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_tpu import FAKE_GCLOUD

from trm import storage

pytestmark = pytest.mark.tpu

REPO = Path(__file__).resolve().parents[1]
PYTHON_DIR = str(Path(sys.executable).parent)


def _preflight(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trm.cli", "preflight", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _bare_environment(home: Path) -> dict[str, str]:
    """No gcloud on PATH (an empty folder: some machines have a real gcloud in /usr/bin), no credentials, no
    emulator: a new user's machine."""
    (home / "bin").mkdir(parents=True, exist_ok=True)
    return {"PATH": str(home / "bin"), "HOME": str(home), "NO_GCE_CHECK": "true", "LANG": "C.UTF-8"}


def test_no_gcloud_and_no_credentials_fail_clearly_naming_both(tmp_path):
    done = _preflight(
        ["--storage", "gs://trm-study-bucket/s", "--tpu-zone", "us-central2-b", "--tpu-slices", "trm-v4-64"],
        _bare_environment(tmp_path / "home"),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("FAIL  gcloud") and "gcloud not found on PATH" in lines[0]
    assert "https://cloud.google.com/sdk/docs/install" in lines[0]
    credentials = next(line for line in lines if " credentials " in line)
    assert credentials.startswith("FAIL") and "gcloud auth application-default login" in credentials
    # What needs them is skipped, not attempted: no bucket request, no TPU call.
    assert any(line.startswith("skip  bucket") for line in lines)
    assert any(line.startswith("skip  slice trm-v4-64") for line in lines)
    assert any(line.startswith("skip  TPU API") for line in lines)
    assert "preflight: 2 check(s) failed: gcloud, credentials" in done.stderr


def test_storage_commands_never_go_anonymous(tmp_path):
    """Without credentials a gs:// command fails at once with the fix, instead of gcsfs's anonymous fallback."""
    done = subprocess.run(
        [sys.executable, "-m", "trm.cli", "status", "--storage", "gs://trm-study-bucket/s"],
        cwd=REPO,
        env=_bare_environment(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "no Google Cloud credentials" in done.stderr
    assert "gcloud auth application-default login" in done.stderr


def _cloud_environment(state: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PATH=os.pathsep.join([str(FAKE_GCLOUD), PYTHON_DIR, env["PATH"]]),
        FAKE_GCLOUD_STATE=str(state),
        FAKE_TPU_WORKERS="2",
        **extra,
    )
    return env


def test_everything_in_place_passes_and_leaves_no_probe(gcs_bucket, tmp_path):
    state = tmp_path / "cloud"
    env = _cloud_environment(state)
    subprocess.run(["gcloud", "fake-create-node", "trm-ready"], env=env, check=True, timeout=60)
    args = ["--storage", f"{gcs_bucket}/study", "--tpu-zone", "us-central2-b"]
    done = _preflight([*args, "--tpu-slices", "trm-ready,trm-later", "--tpu-create"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(line.startswith("ok") for line in lines[:-1]), lines
    assert "tester@example.com" in lines[1]
    assert any("slice trm-ready" in line and "READY" in line for line in lines)
    assert any("ssh trm-ready" in line and "every host answered" in line for line in lines)
    assert any("slice trm-later" in line and "will be created" in line for line in lines)
    assert lines[-1] == "preflight: every check passed"
    assert storage.list_files(f"{gcs_bucket}/study") == []  # the probe object is gone


def test_each_cloud_problem_names_its_fix(gcs_bucket, tmp_path):
    state = tmp_path / "cloud"
    args = ["--storage", f"{gcs_bucket}/study", "--tpu-zone", "us-central2-b", "--tpu-slices", "trm-missing"]

    no_account = _preflight(args, _cloud_environment(state, FAKE_GCLOUD_ACCOUNT=""))
    assert no_account.returncode == 1
    assert "FAIL  gcloud account     no active account: run `gcloud auth login`" in no_account.stdout
    tpu_line = next(line for line in no_account.stdout.splitlines() if "TPU API" in line)
    assert tpu_line.startswith("FAIL") and "You do not currently have an active account selected" in tpu_line
    assert "skip  slice trm-missing" in no_account.stdout
    missing = _preflight(args, _cloud_environment(state))
    assert "FAIL  slice trm-missing" in missing.stdout and "launch.tpu.create" in missing.stdout

    no_project = _preflight(args, _cloud_environment(state, FAKE_GCLOUD_PROJECT=""))
    assert no_project.returncode == 1
    assert "FAIL  project" in no_project.stdout and "gcloud config set project PROJECT" in no_project.stdout
    # The TPU calls would fail too, for want of a project: not blamed on the API.
    api_skipped = next(line for line in no_project.stdout.splitlines() if "TPU API" in line)
    assert api_skipped.startswith("skip") and api_skipped.endswith("needs gcloud and a project")
    assert "enable" not in no_project.stdout and "Traceback" not in no_project.stderr
    assert (
        "ok    project            my-project-1 (launch.tpu.project)"
        in _preflight([*args, "--tpu-project", "my-project-1"], _cloud_environment(state)).stdout
    )

    api_off = _preflight(args, _cloud_environment(state, FAKE_GCLOUD_TPU_API="disabled"))
    assert api_off.returncode == 1
    api_line = next(line for line in api_off.stdout.splitlines() if "TPU API" in line)
    assert api_line.startswith("FAIL") and "gcloud services enable tpu.googleapis.com" in api_line
    assert "roles/tpu.admin" in api_line
    assert "skip  slice trm-missing" in api_off.stdout

    wrong_type = _preflight(
        [*args, "--tpu-create", "--tpu-accelerator-type", "v9-8"], _cloud_environment(state)
    )
    assert wrong_type.returncode == 1
    assert "v9-8 cannot be created in us-central2-b" in wrong_type.stdout

    no_bucket = _preflight(["--storage", "gs://trm-no-such-bucket-here/s"], _cloud_environment(state))
    assert no_bucket.returncode == 1
    bucket_line = next(line for line in no_bucket.stdout.splitlines() if " bucket " in line)
    assert bucket_line.startswith("FAIL") and "trm-no-such-bucket-here" in bucket_line
    for done in (no_account, missing, no_project, api_off, wrong_type, no_bucket):
        assert "Traceback" not in done.stdout + done.stderr


def test_bad_arguments_are_refused_before_any_check(tmp_path):
    env = _bare_environment(tmp_path / "home")
    local = _preflight(["--storage", str(tmp_path / "here")], env)
    assert local.returncode == 2 and "preflight checks gs:// storage" in local.stderr
    bad_slice = _preflight(["--tpu-zone", "us-central2-b", "--tpu-slices", "Bad;Name"], env)
    assert bad_slice.returncode == 2 and "slice name 'Bad;Name' is not valid" in bad_slice.stderr
    assert local.stdout == bad_slice.stdout == ""

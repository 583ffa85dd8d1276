"""The test tools leave the machine alone: the fake gcloud's stock-image hosts get their own `gcloud` shim
without writing through the link to the system's /usr/bin/gcloud (which once replaced the machine's real Cloud
SDK entry point with our shim). `make test` also checks the whole suite with tests/system_guard.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import system_guard

pytestmark = pytest.mark.tpu

FAKE_GCLOUD = Path(__file__).resolve().parent / "fake_gcloud" / "gcloud"


def _system_files() -> dict[str, str]:
    return {path: seen for path, seen in system_guard.snapshot().items() if path.startswith("/usr/")}


def test_fake_hosts_get_their_own_gcloud_and_the_system_files_stay_byte_identical(cloud: Path):
    before = _system_files()
    subprocess.run([str(FAKE_GCLOUD), "fake-create-node", "trm-noharm"], check=True, timeout=60)
    probe = 'g=$(command -v gcloud); echo "$g"; test -L "$g" && echo LINK; gcloud --version | head -1'
    done = subprocess.run(
        [str(FAKE_GCLOUD), "compute", "tpus", "tpu-vm", "ssh", "trm-noharm", "--zone=us-central2-b",
         "--worker=all", f"--command={probe}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    shim = cloud / "image" / "bin" / "gcloud"
    lines = [line.split(": ", 1)[1] for line in done.stdout.splitlines()]  # "NAME-w-I: ..." per host line
    assert lines.count(str(shim)) == 2, done.stdout  # both hosts find the fake's shim first on PATH
    assert "LINK" not in lines, "the hosts' gcloud is a file of the fake's own, not a link into the system"
    assert lines.count("Google Cloud SDK 0.0.0 (the tests' fake)") == 2, done.stdout
    assert shim.is_file() and not shim.is_symlink()
    assert _system_files() == before, "the fake changed files under /usr (through a link?)"
    if Path("/usr/bin/gcloud").exists():  # a real Cloud SDK on this machine: still the SDK's own entry point
        assert "fake_gcloud" not in Path("/usr/bin/gcloud").resolve().read_text(errors="replace")


def test_the_guard_sees_a_file_changed_through_a_link(tmp_path: Path, monkeypatch, capsys):
    """What the guard around `make test` would report if a test wrote through a link, on a folder of our own."""
    system, sdk = tmp_path / "bin", tmp_path / "sdk"
    system.mkdir()
    sdk.mkdir()
    (sdk / "gcloud").write_text("#!/bin/sh\necho real\n")
    (system / "gcloud").symlink_to(sdk / "gcloud")
    monkeypatch.setattr(system_guard, "SYSTEM_FOLDERS", (system,))
    monkeypatch.setattr(system_guard, "USER_FOLDERS", (tmp_path / "home-cache",))
    record = tmp_path / "guard.json"
    assert system_guard.main(["snapshot", str(record)]) == 0
    assert system_guard.main(["compare", str(record)]) == 0
    (system / "gcloud").write_text(
        "#!/bin/sh\nexec fake\n"
    )  # the old fake's mistake: a write through the link
    (tmp_path / "home-cache").mkdir()
    (tmp_path / "home-cache" / "leftover").write_text("x")
    assert system_guard.main(["compare", str(record)]) == 1
    out = capsys.readouterr().out
    assert f"CHANGED {system / 'gcloud'}" in out and "leftover: absent" in out

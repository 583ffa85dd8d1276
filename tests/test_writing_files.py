"""The one way this project writes a file (trm.storage.write_bytes / local_writer): atomic only over regular
files, devices and pipes written in place and never replaced, folders refused, the umask's permissions, and one
line naming the path (exit 2, no traceback) for a destination that is read-only, under a file or full.

Every device written here is one this test made (mknod in its tmp_path), except the issue's own reproduction,
`trm config ... --output /dev/full`, which checks that /dev/full is still the same character device after."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trm import storage
from trm.errors import UserError

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = str(REPO / "config" / "experiments" / "exp01a.yaml")
FULL_DEVICE = os.makedev(1, 7)  # Linux's /dev/full: every write fails with ENOSPC
NULL_DEVICE = os.makedev(1, 3)  # /dev/null


def _trm(args: list[str], preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trm.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=preexec,
    )


def _one_error_line(done: subprocess.CompletedProcess, *expected: str) -> str:
    """The one error line, last on stderr, of a command that failed as bad input should (exit 2, no traceback;
    progress bars before it are fine)."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert [line for line in lines if "error" in line.lower()] == lines[-1:], done.stderr
    for text in expected:
        assert text in lines[-1], lines[-1]
    return lines[-1]


def _device(path: Path, device: int, system: str) -> Path:
    """A character device to write to: our own node at `path` where we may make one (root), else the system's
    `system` (/dev/full, /dev/null), which a user without root could not replace even if the writer tried."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, device)
    except PermissionError:
        return Path(system)
    return path


def _is_device(path: Path, device: int) -> bool:
    status = os.lstat(path)
    return stat.S_ISCHR(status.st_mode) and status.st_rdev == device


def _entries(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_the_issues_dev_full_fails_in_one_line_and_stays_a_device():
    assert _is_device(Path("/dev/full"), FULL_DEVICE)
    done = _trm(["config", EXPERIMENT, "--output", "/dev/full"])
    line = _one_error_line(done, "trm config: error: cannot write /dev/full: No space left on device")
    assert "unchanged" not in line  # written in place: no old content to keep
    assert _is_device(Path("/dev/full"), FULL_DEVICE)


def test_dev_stdout_is_written_in_place():
    expected = _trm(["config", EXPERIMENT])
    assert expected.returncode == 0
    assert os.path.islink("/dev/stdout")
    done = _trm(["config", EXPERIMENT, "--output", "/dev/stdout"])  # stdout is a pipe here
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected.stdout and done.stdout.startswith("{")
    assert os.path.islink("/dev/stdout")


def test_a_device_is_written_in_place_never_replaced(tmp_path: Path):
    full = _device(tmp_path / "full", FULL_DEVICE, "/dev/full")
    null = _device(tmp_path / "null", NULL_DEVICE, "/dev/null")
    with pytest.raises(UserError, match=rf"^cannot write {full}: No space left on device; free some space"):
        storage.write_text(str(full), "results\n")
    storage.write_text(str(null), "results\n")
    # A link to a device is followed, and the device written (the link stays a link).
    (tmp_path / "link").symlink_to(full)
    with pytest.raises(UserError, match="No space left on device"):
        storage.write_text(str(tmp_path / "link"), "results\n")
    assert _is_device(full, FULL_DEVICE) and _is_device(null, NULL_DEVICE)
    assert os.readlink(tmp_path / "link") == str(full)
    left = [name for name in _entries(tmp_path) if name not in ("full", "null")]
    assert left == ["link"]  # no temporary file


def test_a_fifo_is_written_in_place(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    storage.write_text(str(fifo), "through the pipe\n")
    reader.join(timeout=60)
    assert received == ["through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _entries(tmp_path) == ["fifo"]


def test_a_folder_is_refused(tmp_path: Path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "kept.txt").write_text("kept")
    with pytest.raises(UserError, match=rf"^cannot write {tmp_path / 'out'}: it is a folder"):
        storage.write_text(str(tmp_path / "out"), "results\n")
    assert _entries(tmp_path) == ["out"] and _entries(tmp_path / "out") == ["kept.txt"]


def test_a_path_ending_in_a_slash_is_refused(tmp_path: Path):
    with pytest.raises(UserError, match=r"ends with '/', so it names a folder"):
        storage.write_text(f"{tmp_path}/results/", "results\n")
    done = _trm(["config", EXPERIMENT, "--output", f"{tmp_path}/results/"])  # not a file named "results"
    _one_error_line(done, f"cannot write {tmp_path}/results/: it ends with '/'")
    assert _entries(tmp_path) == []


def test_a_path_below_a_file_names_the_file(tmp_path: Path):
    """What fails for root as well: a folder of the destination's path is a regular file."""
    (tmp_path / "notes").write_text("mine")
    destination = tmp_path / "notes" / "run" / "config.json"
    done = _trm(["config", EXPERIMENT, "--output", str(destination)])
    _one_error_line(done, f"cannot write {destination}: {tmp_path / 'notes'} is a file, not a folder")
    assert (tmp_path / "notes").read_text() == "mine"


def _without_capabilities() -> None:
    """In the child before exec: empty its capability bounding set, so after exec it is root without
    CAP_DAC_OVERRIDE, and a folder's permission bits bind it as they bind any user. Only this process changes."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop = 24
    for capability in range(64):
        libc.prctl(pr_capbset_drop, capability, 0, 0, 0)  # beyond the last capability: EINVAL, ignored


def test_a_read_only_folder_fails_in_one_line_and_keeps_the_old_file(tmp_path: Path):
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "config.json").write_text("old\n")
    folder.chmod(0o555)
    # As root (this machine, CI, containers) the permission bits alone do not bind: the command runs without
    # capabilities. A subprocess that can still write there would make this test fail, not pass.
    done = _trm(["config", EXPERIMENT, "--output", str(folder / "config.json")], _without_capabilities)
    _one_error_line(
        done, f"cannot write {folder / 'config.json'}: Permission denied; choose a writable place"
    )
    done = _trm(
        ["config", EXPERIMENT, "--output", str(folder / "new" / "config.json")], _without_capabilities
    )
    _one_error_line(done, f"cannot write {folder / 'new' / 'config.json'}: Permission denied")
    folder.chmod(0o755)
    assert _entries(folder) == ["config.json"] and (folder / "config.json").read_text() == "old\n"


def _files_up_to(size: int):
    """In the child before exec: files cannot grow past `size` bytes (the kernel refuses with EFBIG, as a full
    disk refuses with ENOSPC), and the signal that would kill the process for it is ignored."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return limit


def test_a_full_disk_during_an_atomic_write_keeps_the_old_file(tmp_path: Path):
    destination = tmp_path / "config.json"
    destination.write_text("old\n")
    done = _trm(["config", EXPERIMENT, "--output", str(destination)], _files_up_to(100))
    line = _one_error_line(done, f"cannot write {destination}: File too large; free some space")
    assert line.endswith("(what was there is unchanged)")
    assert destination.read_text() == "old\n"
    assert _entries(tmp_path) == ["config.json"]  # the temporary file is gone
    # The same command with room to write replaces the file.
    assert _trm(["config", EXPERIMENT, "--output", str(destination)]).returncode == 0
    assert destination.read_text().startswith("{")


@pytest.mark.slow
def test_build_dataset_into_a_read_only_or_full_place_fails_in_one_line(tmp_path: Path):
    build = ["build-dataset", "--source", "generate:8", "--num-aug", "2", "--output-dir"]
    folder = tmp_path / "datasets"
    folder.mkdir()
    folder.chmod(0o555)
    done = _trm([*build, str(folder / "ds")], _without_capabilities)
    _one_error_line(done, f"cannot write {folder / 'ds'}: Permission denied")
    folder.chmod(0o755)
    # A full disk while the arrays are written: the half-built folder is removed, the old dataset kept.
    assert _trm([*build, str(folder / "ds")]).returncode == 0  # the old dataset (--force replaces only those)
    old = {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in (folder / "ds").rglob("*") if p.is_file()
    }
    done = _trm([*build, str(folder / "ds"), "--force", "--seed", "1"], _files_up_to(1000))
    _one_error_line(done, f"cannot write {folder / 'ds'}: File too large; free some space")
    assert _entries(folder) == ["ds"]
    assert {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in (folder / "ds").rglob("*") if p.is_file()
    } == old


WRITE_A_RUN_DIR = """
import sys
from trm.config import load
from trm.run import layout, state
config = load.load_config(None, [], base=load.BASE_CONFIG)
layout.claim(sys.argv[1], config, load.config_hash(config))
state.write_status(sys.argv[1], {"state": "running", "step": 0})
"""


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)], ids=["umask-022", "umask-027"])
def test_files_of_a_run_dir_get_the_umasks_permissions(tmp_path: Path, umask: int, mode: int):
    run_dir = tmp_path / "run"
    subprocess.run(
        [sys.executable, "-c", WRITE_A_RUN_DIR, str(run_dir)],
        cwd=REPO,
        check=True,
        timeout=120,
        preexec_fn=lambda: os.umask(umask),
    )
    assert _entries(run_dir) == ["config.json", "status.json"]
    assert {name: stat.S_IMODE(os.stat(run_dir / name).st_mode) for name in _entries(run_dir)} == {
        "config.json": mode,
        "status.json": mode,
    }


def test_a_replaced_file_keeps_its_own_mode_and_a_link_stays_a_link(tmp_path: Path):
    private = tmp_path / "private.json"
    private.write_text("old")
    private.chmod(0o600)
    storage.write_text(str(private), "new")
    assert private.read_text() == "new" and stat.S_IMODE(os.stat(private).st_mode) == 0o600
    (tmp_path / "latest.json").symlink_to(private)
    storage.write_text(str(tmp_path / "latest.json"), "newer")
    assert os.path.islink(tmp_path / "latest.json") and private.read_text() == "newer"
    assert _entries(tmp_path) == ["latest.json", "private.json"]

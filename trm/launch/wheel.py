"""The exact code of this checkout as a wheel in storage, so every TPU host runs the same code as the controller.

The wheel's version carries a digest of the files it is built from (`0.1.0+git.<sha>.src.<digest>`), so the
same sources always map to the same storage URL: an existing wheel is not built or uploaded again, and any
edit, committed or not, gives a new one. On the hosts the trainer reports this version as its code version.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from trm import storage
from trm.checkout import INSTALLED_FROM
from trm.errors import UserError
from trm.run import distributed

REPO = INSTALLED_FROM  # the checkout whose code is built into the wheel
PACKAGE = "trm"
PROJECT_FILES = ("pyproject.toml", "README.md")


def _sources(repo: Path) -> list[Path]:
    files = [repo / name for name in PROJECT_FILES]
    files += sorted(p for p in (repo / PACKAGE).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return files


def _base_version(pyproject: str) -> str:
    found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.MULTILINE)
    if not found:
        raise UserError('pyproject.toml has no version = "..." line to build the code wheel from')
    return found.group(1)


def code_wheel_version(repo: Path = REPO) -> str:
    """The version the wheel of `repo`'s current sources gets (a PEP 440 local version)."""
    digest = hashlib.sha256()
    for path in _sources(repo):
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    sha = distributed.git_sha(repo)
    local = (f"git.{sha}." if sha else "") + f"src.{digest.hexdigest()[:12]}"
    return f"{_base_version((repo / 'pyproject.toml').read_text())}+{normal_local(local)}"


def normal_local(local: str) -> str:
    """A PEP 440 local version label in its normal form, as pip names the wheel: a segment of digits loses its
    leading zeros (a digest 054675262871 is 54675262871: about 1 in 2,800 of them)."""
    return ".".join(str(int(part)) if part.isdigit() else part for part in local.split("."))


def wheel_name(version: str) -> str:
    return f"trm_study-{version}-py3-none-any.whl"


def build(version: str, out_dir: Path, repo: Path = REPO) -> Path:
    """Build the wheel of `repo`'s sources with `version` into `out_dir` (no network, no build isolation)."""
    with tempfile.TemporaryDirectory(prefix="trm-wheel-") as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        pyproject = (repo / "pyproject.toml").read_text()
        (source / "pyproject.toml").write_text(
            re.sub(
                r'^version\s*=\s*"[^"]+"', f'version = "{version}"', pyproject, count=1, flags=re.MULTILINE
            )
        )
        shutil.copy(repo / "README.md", source / "README.md")
        shutil.copytree(repo / PACKAGE, source / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        done = subprocess.run([*command, "-w", str(out_dir), str(source)], capture_output=True, text=True)
        if done.returncode != 0:
            raise UserError(f"building the code wheel failed:\n{done.stdout}{done.stderr}")
    wheel = out_dir / wheel_name(version)
    if not wheel.exists():
        raise UserError(f"pip wheel did not write {wheel.name} (found {[p.name for p in out_dir.iterdir()]})")
    return wheel


def ensure_uploaded(code_url: str, repo: Path = REPO) -> tuple[str, str, str]:
    """Upload the wheel of the current sources below `code_url` unless it is there; (version, wheel URL, the
    wheel's sha256: what says whether a host's installed environment is current)."""
    version = code_wheel_version(repo)
    url = storage.join(code_url, wheel_name(version))
    if storage.exists(url):
        return version, url, hashlib.sha256(storage.read_bytes(url)).hexdigest()
    with tempfile.TemporaryDirectory(prefix="trm-wheel-out-") as out:
        data = build(version, Path(out), repo).read_bytes()
        storage.write_bytes(url, data)
    return version, url, hashlib.sha256(data).hexdigest()

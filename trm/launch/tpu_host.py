"""The bash scripts the TPU launcher runs on every host of a slice (`gcloud ... ssh --worker=all --command=`).

Each host has its own disk and HOME; everything a host needs comes from storage (the code wheel; the run's
resolved config, which the trainer reads from the run dir) or from the internet (uv and Python packages from
PyPI, a CPython build when the host has no Python 3.11). Files on a host live under ~/.trm:

  venv/                  the Python 3.11 environment the trainer runs in, made by uv once per slice
  venv/.trm-setup        the set-up key (the wheel's sha256 and the set-up settings): current means skip
  wheels/                the downloaded code wheels
  logs/setup.log         the last set-up's output (its tail is shown when it fails)
  logs/<hash>.log        the trainer's output, every attempt appended (also uploaded by the trainer to the run
                         dir's logs/)
  train.pid              pid of the running trainer, which leads its own process group

The stock image (tpu-ubuntu2204-base) has Python 3.10 only, and jax 0.10.2 needs 3.11: the set-up installs uv
with the image's pip (`python3 -m pip install --user uv==V`, from PyPI), then `uv venv --python 3.11` (uv
downloads a CPython 3.11 build when the host has none) and `uv pip install WHEEL[tpu]` (the pinned
dependencies and libtpu, from PyPI). Every value interpolated into a script is shlex-quoted here, except a
leading `~/` or `$HOME/` of a host path, which expands on the host (`host_path`).
"""

from __future__ import annotations

import hashlib
import re
import shlex

from trm.errors import UserError

HOME = '"$HOME"/.trm'
VENV = f"{HOME}/venv"
VENV_PYTHON = f"{VENV}/bin/python"
SETUP_MARKER = f"{VENV}/.trm-setup"
SETUP_LOG = f"{HOME}/logs/setup.log"
PID_FILE = f"{HOME}/train.pid"
EXIT_SETUP_FAILED = 97  # the set-up script's exit code when installing failed (not ssh, not the slice)
SETUP_FAILED = "TRM SET-UP FAILED"  # the first line a failed set-up prints, before its log's tail
SETUP_LOG_TAIL_LINES = 30
CONFIG_HASH = re.compile(r"^[0-9a-f]{6,64}$")
# What each host reads from the metadata server: its worker number, which is its JAX process id (as JAX's own
# TPU cluster detection does; jax/_src/clusters/cloud_tpu_cluster.py). GCE_METADATA_IP overrides the server's
# address, as in JAX.
WORKER_NUMBER_URL = 'http://"${GCE_METADATA_IP:-metadata.google.internal}"/computeMetadata/v1/instance/attributes/agent-worker-number'


def host_path(path: str) -> str:
    """`path` for a host's shell: quoted, but a leading `~/` or `$HOME/` (or `~`, `$HOME`) expands on the host."""
    for prefix in ("~", "$HOME", "${HOME}"):
        if path == prefix:
            return '"$HOME"'
        if path.startswith(prefix + "/"):
            rest = path[len(prefix) + 1 :]
            return '"$HOME"/' + shlex.quote(rest) if rest else '"$HOME"/'
    return shlex.quote(path)


def setup_key(wheel_sha256: str, python: str, install_dependencies: bool, uv_version: str) -> str:
    """What the installed environment must match to be reused: the wheel's hash and the set-up settings."""
    settings = f"{python}\0{install_dependencies}\0{uv_version}"
    return f"{wheel_sha256[:16]}-{hashlib.sha256(settings.encode()).hexdigest()[:8]}"


def setup_script(
    key: str, wheel_url: str, wheel_file: str, python: str, install_dependencies: bool, uv_version: str
) -> str:
    """Make ~/.trm/venv current once per slice and code version (see the module docstring); a failure prints
    SETUP_FAILED and the log's tail and exits EXIT_SETUP_FAILED."""
    wheel = f"{HOME}/wheels/{shlex.quote(wheel_file)}"
    py = host_path(python)
    if install_dependencies:
        install = [f"\"$uv\" pip install --python {VENV_PYTHON} {wheel}'[tpu]'"]
    else:
        # The interpreter has the pinned dependencies already (a custom image): the venv sees its packages.
        install = [
            f'base=$("$uv" python find {py})',
            'purelib=$("$base" -c "import site; print(chr(10).join(site.getsitepackages()))")',
            f"venv_purelib=$({VENV_PYTHON} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')",
            'echo "$purelib" > "$venv_purelib/trm-base-interpreter.pth"',
            f'"$uv" pip install --python {VENV_PYTHON} --no-deps {wheel}',
        ]
    body = [
        "set -eux",
        f"mkdir -p {HOME}/wheels",
        f"gcloud storage cp {shlex.quote(wheel_url)} {wheel}",
        'uv=$(command -v uv || echo "$HOME/.local/bin/uv")',
        'if [ ! -x "$uv" ]; then',
        f"  python3 -m pip install --user --quiet {shlex.quote('uv==' + uv_version)}",
        '  uv="$HOME/.local/bin/uv"',
        "fi",
        # Other set-up settings (another Python) than the venv was made with: make it again.
        f'old=$(cat {SETUP_MARKER} 2>/dev/null || true); [ "${{old#*-}}" = {shlex.quote(key.split("-", 1)[1])} ] || rm -rf {VENV}',
        f'[ -x {VENV_PYTHON} ] || "$uv" venv --python {py} {VENV}',
        *install,
        f"{VENV_PYTHON} -c 'import sys, trm; print(sys.version)'",
        f"echo {shlex.quote(key)} > {SETUP_MARKER}",
    ]
    return "\n".join(
        [
            f"mkdir -p {HOME}/logs",
            f'if [ "$(cat {SETUP_MARKER} 2>/dev/null)" = {shlex.quote(key)} ]; then echo "set-up current"; exit 0; fi',
            "(",
            *(f"  {line}" for line in body),
            f") > {SETUP_LOG} 2>&1",
            "rc=$?",
            'if [ "$rc" -ne 0 ]; then',
            f'  echo "{SETUP_FAILED} on $(hostname) (exit code $rc); the last lines of ~/.trm/logs/setup.log:"',
            f"  tail -n {SETUP_LOG_TAIL_LINES} {SETUP_LOG}",
            f"  exit {EXIT_SETUP_FAILED}",
            "fi",
        ]
    )


def stop_script(grace_s: int) -> str:
    """Stop this launcher's trainer on a host: SIGTERM (it checkpoints and exits), SIGKILL after `grace_s`."""
    return "\n".join(
        [
            f"if [ -f {PID_FILE} ]; then",
            f"  pid=$(cat {PID_FILE})",
            '  if kill -TERM -- "-$pid" 2>/dev/null; then',
            f"    for _ in $(seq {int(grace_s)}); do",
            '      kill -0 -- "-$pid" 2>/dev/null || break',
            "      sleep 1",
            "    done",
            '    kill -KILL -- "-$pid" 2>/dev/null || true',
            "  fi",
            f"  rm -f {PID_FILE}",
            "fi",
        ]
    )


def start_script(
    config_hash: str,
    train_args: list[str],
    slice_name: str,
    coordinator: str,
    num_processes: int,
    grace_s: int,
    command: str = "train",
) -> str:
    """Clear stale TPU users and start `trm train train_args` (`trm <command>`: canary) detached (it outlives the
    ssh call).

    The trainer joins the job explicitly: the coordinator (worker 0's address from the slice's describe) and the
    process count come from the launcher, the process id is the host's worker number from the metadata server.
    """
    if not CONFIG_HASH.fullmatch(config_hash):
        raise UserError(f"config hash {config_hash!r} is not valid: expected {CONFIG_HASH.pattern}")
    log = f"{HOME}/logs/{config_hash}.log"
    train = " ".join(
        [VENV_PYTHON, "-m", "trm.cli", shlex.quote(command), *(_host_arg(arg) for arg in train_args)]
    )
    # The trainer writes its own pid: after setsid it leads a process group, so the stop script gets all of it.
    inner = f"echo $$ > {PID_FILE}; exec {train}"
    return "\n".join(
        [
            stop_script(grace_s),
            # Only one process may own a host's TPU: kill leftovers and their lock.
            "if ls /dev/accel* >/dev/null 2>&1; then sudo lsof -t /dev/accel* | xargs -r sudo kill -9 || true; fi",
            "if [ -e /tmp/libtpu_lockfile ]; then sudo rm -f /tmp/libtpu_lockfile; fi",
            "set -eu",
            f"mkdir -p {HOME}/logs",
            f"worker=$(curl -sf -H 'Metadata-Flavor: Google' {WORKER_NUMBER_URL})",
            'case "$worker" in ""|*[!0-9]*) echo "no agent-worker-number from the metadata server"; exit 1;; esac',
            f"export TRM_COORDINATOR={shlex.quote(coordinator)} TRM_NUM_PROCESSES={int(num_processes)}",
            'export TRM_PROCESS_ID="$worker"',
            f"export TRM_SLICE={shlex.quote(slice_name)} PYTHONUNBUFFERED=1",
            # Appended: a relaunch keeps the output of the attempts before it.
            f'echo "===== $(date -u "+%Y-%m-%d %H:%M:%S") start of an attempt =====" >> {log}',
            f"nohup setsid bash -c {shlex.quote(inner)} >> {log} 2>&1 < /dev/null &",
        ]
    )


def _host_arg(arg: str) -> str:
    """One trainer argument for the host's shell: paths starting with ~/ or $HOME/ expand there."""
    flag, eq, value = arg.partition("=")
    if eq and flag.startswith("--"):
        return f"{shlex.quote(flag)}={host_path(value)}"
    return host_path(arg)

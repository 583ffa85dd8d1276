"""The bash scripts the TPU launcher runs on every host of a slice (`gcloud ... ssh --worker=all --command=`).

Each host has its own disk and HOME; everything a host needs comes from storage: the code wheel, and the run's
resolved config, which the trainer reads from the run dir itself. Files on a host live under ~/.trm:

  code/<version>/        the installed code wheel (PYTHONPATH), one folder per code version
  logs/<hash>.log        the trainer's output (also uploaded by the trainer to the run dir's logs/)
  train.pid              pid of the running trainer, which leads its own process group

Every value interpolated into a script is shlex-quoted here, whatever checks the caller made.
"""

from __future__ import annotations

import re
import shlex

from trm.errors import UserError

HOME = '"$HOME"/.trm'
PID_FILE = f"{HOME}/train.pid"
VERSION = re.compile(r"^[0-9][0-9a-z.+]*$")
CONFIG_HASH = re.compile(r"^[0-9a-f]{6,64}$")


def _code_dir(version: str) -> str:
    if not VERSION.fullmatch(version):
        raise UserError(f"code version {version!r} is not valid: expected {VERSION.pattern}")
    return f"{HOME}/code/{shlex.quote(version)}"


def setup_script(
    version: str, wheel_url: str, wheel_file: str, python: str, install_dependencies: bool
) -> str:
    """Install the code wheel once per code version (and its pinned dependencies, with the TPU extra)."""
    code = _code_dir(version)
    wheel = f"{HOME}/wheels/{shlex.quote(wheel_file)}"
    py = shlex.quote(python)
    steps = [
        "set -eu",
        f"if [ ! -e {code}/.installed ]; then",
        f"  mkdir -p {HOME}/wheels",
        f"  gcloud storage cp {shlex.quote(wheel_url)} {wheel}",
    ]
    if install_dependencies:
        steps.append(f'  {py} -m pip install --quiet "{wheel}[tpu]"')
    steps += [
        f"  rm -rf {code}",
        f"  {py} -m pip install --quiet --no-deps --target {code} {wheel}",
        f"  touch {code}/.installed",
        "fi",
    ]
    return "\n".join(steps)


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
    version: str,
    config_hash: str,
    train_args: list[str],
    slice_name: str,
    python: str,
    grace_s: int,
) -> str:
    """Clear stale TPU users and start `trm train train_args` detached (it outlives the ssh call).

    Without TRM_COORDINATOR (a real TPU VM) the trainer finds the slice by itself (TRM_DISTRIBUTED=auto).
    """
    code = _code_dir(version)
    if not CONFIG_HASH.fullmatch(config_hash):
        raise UserError(f"config hash {config_hash!r} is not valid: expected {CONFIG_HASH.pattern}")
    log = f"{HOME}/logs/{config_hash}.log"
    train = shlex.join([python, "-m", "trm.cli", "train", *train_args])
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
            '[ -n "${TRM_COORDINATOR:-}" ] || export TRM_DISTRIBUTED=auto',
            f"export TRM_SLICE={shlex.quote(slice_name)} PYTHONUNBUFFERED=1",
            f'export PYTHONPATH={code}"${{PYTHONPATH:+:$PYTHONPATH}}"',
            f"nohup setsid bash -c {shlex.quote(inner)} > {log} 2>&1 < /dev/null &",
        ]
    )

"""Check, from this machine and before any slice is paid for, that a TPU study can run.

    trm preflight --storage gs://BUCKET/trm-study --tpu-zone us-central2-b --tpu-slices trm-v4-64 [--tpu-create]

One line per check, in order: gcloud installed; an active gcloud account; a project; Application Default Credentials
(what gcsfs and orbax use on this machine: not gcloud's own login); the bucket listed, written, read and
cleaned (a probe object); the Cloud TPU API answering in the zone; each slice of the pool READY, or, with
--tpu-create, the accelerator type offered in the zone; ssh to every host of each READY slice. A failed check
says what is wrong and the command or IAM role that fixes it; later checks that need it are skipped. Exit code
0 when every check passed, 1 otherwise. The TPU workflow runs it once before its first job (docs/tpu.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from trm import storage
from trm.errors import UserError
from trm.launch import gcloud, tpu_options

GCLOUD_TIMEOUT_S = 60  # one gcloud call; ssh to every host of a slice gets SSH_TIMEOUT_S
SSH_TIMEOUT_S = 180
INSTALL_GCLOUD = (
    "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install) and put gcloud on PATH"
)


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool | None  # None: skipped, because an earlier check it needs failed
    detail: str

    def line(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[self.ok]
        return f"{mark}  {self.name:<18} {self.detail}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage", help="the study's storage root, gs://BUCKET[/PATH] (the bucket is probed)"
    )
    # The launcher's flags (trm/launch/tpu_options.py). Without --tpu-zone only the machine and the bucket are
    # checked; --tpu-create checks that the zone offers the accelerator type instead of requiring READY slices.
    tpu_options.add_argument(parser, "zone", default=None)
    tpu_options.add_argument(parser, "project", default=None)
    tpu_options.add_argument(parser, "slices", default=[])
    tpu_options.add_argument(parser, "create", default=False)
    tpu_options.add_argument(parser, "accelerator_type", default=tpu_options.defaults()["accelerator_type"])


def _gcloud(argv: list[str], timeout: float = GCLOUD_TIMEOUT_S) -> tuple[bool, str]:
    """(succeeded, stdout or the last line of stderr) of one gcloud call; a timeout is a failure."""
    done = gcloud.run(argv, timeout)
    if done.returncode != 0:
        return False, gcloud.error_line(done.stderr) or f"exit code {done.returncode}"
    return True, done.stdout.strip()


def check_gcloud() -> Result:
    try:
        ok, out = _gcloud(["gcloud", "--version"])
    except UserError:  # not on PATH
        return Result("gcloud", False, f"gcloud not found on PATH: {INSTALL_GCLOUD}")
    first = out.splitlines()[0] if ok and out else out
    return Result("gcloud", ok, first if ok else f"gcloud --version failed ({out}): {INSTALL_GCLOUD}")


def check_account() -> Result:
    ok, out = _gcloud(["gcloud", "auth", "list", "--filter=status:ACTIVE", "--format=value(account)"])
    if ok and out:
        return Result("gcloud account", True, out.splitlines()[0])
    reason = "no active account" if ok else out
    return Result("gcloud account", False, f"{reason}: run `gcloud auth login`")


def check_project(project: str | None) -> Result:
    if project:
        return Result("project", True, f"{project} (launch.tpu.project)")
    ok, out = _gcloud(["gcloud", "config", "get-value", "project"])
    if ok and out:
        return Result("project", True, f"{out} (gcloud's configured project)")
    return Result(
        "project", False, "none configured: `gcloud config set project PROJECT`, or set launch.tpu.project"
    )


def check_credentials() -> Result:
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return Result(
            "credentials", True, f"GCS emulator at {os.environ['STORAGE_EMULATOR_HOST']}: none needed"
        )
    import google.auth
    import google.auth.exceptions

    from trm.gcs import FIX_CREDENTIALS

    try:
        credentials, project = google.auth.default()
    except google.auth.exceptions.DefaultCredentialsError:
        return Result(
            "credentials",
            False,
            f"no Application Default Credentials (gcsfs and orbax use them, not gcloud's login): run "
            f"`{FIX_CREDENTIALS}`",
        )
    who = getattr(credentials, "service_account_email", None) or type(credentials).__name__
    return Result("credentials", True, f"Application Default Credentials: {who} (project {project or '?'})")


def check_bucket(url: str) -> Result:
    """List, write, read and delete a probe object under `url`."""
    bucket = url.removeprefix("gs://").split("/", 1)[0]
    probe = storage.join(url, f".trm-preflight-{uuid.uuid4().hex[:12]}")
    try:
        storage.list_files(url)
        storage.write_text(probe, "preflight probe; safe to delete\n")
        if storage.read_text(probe) != "preflight probe; safe to delete\n":
            return Result("bucket", False, f"{probe} read back different content")
        fs, path = storage.filesystem(probe)
        fs.rm(path)
    except FileNotFoundError:
        return Result("bucket", False, f"gs://{bucket} does not exist: `gcloud storage buckets create gs://{bucket} "
                      "--location=us-central2` (the TPU's region)")  # fmt: skip
    except (UserError, OSError) as err:
        return Result(
            "bucket",
            False,
            f"{err} (your account needs roles/storage.objectAdmin on gs://{bucket}: `gcloud storage buckets "
            f"add-iam-policy-binding gs://{bucket} --member=user:YOU --role=roles/storage.objectAdmin`)",
        )
    return Result("bucket", True, f"{url}: listed, wrote, read and deleted a probe object")


def check_tpu_api(where: gcloud.Location) -> Result:
    ok, out = _gcloud(gcloud.list_nodes(where))
    if ok:
        names = out.split()
        return Result("TPU API", True, f"{where.zone}: {len(names)} slice(s) ({', '.join(names) or 'none'})")
    return Result(
        "TPU API",
        False,
        f"{where.zone}: {out}: enable the API (`gcloud services enable tpu.googleapis.com`) and give your "
        "account roles/tpu.admin (and roles/iam.serviceAccountUser for the slices' service account)",
    )


def check_slice(name: str, where: gcloud.Location, create: bool, accelerator: str) -> Result:
    try:
        retry = gcloud.Retry(timeout_s=GCLOUD_TIMEOUT_S, budget_s=GCLOUD_TIMEOUT_S, log=lambda _: None)
        state = gcloud.describe(gcloud.describe_node(name, where), retry).state
    except (gcloud.CloudError, gcloud.CloudUnavailable) as err:
        return Result(f"slice {name}", False, f"cannot describe it: {err}")
    if state == gcloud.NODE_READY:
        return Result(f"slice {name}", True, "READY")
    if not create:
        return Result(
            f"slice {name}",
            False,
            f"{state or 'not found'}: create it (docs/tpu.md) or set launch.tpu.create: true",
        )
    ok, out = _gcloud(gcloud.describe_accelerator_type(accelerator, where))
    if not ok:
        return Result(f"slice {name}", False, f"{state or 'not found'}, and {accelerator} cannot be created "
                      f"in {where.zone}: {out}")  # fmt: skip
    return Result(
        f"slice {name}", True, f"{state or 'not found'}: will be created ({accelerator} is offered)"
    )


def check_ssh(name: str, where: gcloud.Location) -> Result:
    started = time.time()
    ok, out = _gcloud(gcloud.ssh_all(name, where, "true"), timeout=SSH_TIMEOUT_S)
    if ok:
        return Result(f"ssh {name}", True, f"every host answered in {time.time() - started:.0f} s")
    return Result(
        f"ssh {name}",
        False,
        f"{out}: with OS Login your account needs roles/compute.osAdminLogin; without it, let gcloud add your "
        "key to the project (`gcloud compute config-ssh`, then retry)",
    )


def run_checks(args: argparse.Namespace, report: Callable[[Result], None]) -> list[Result]:
    """Every check in order, each reported as it finishes; a check whose prerequisite failed is skipped."""
    results: list[Result] = []

    def add(result: Result) -> Result:
        results.append(result)
        report(result)
        return result

    has_gcloud = add(check_gcloud()).ok
    add(check_account() if has_gcloud else Result("gcloud account", None, "needs gcloud"))
    has_project = False
    if args.tpu_zone:
        has_project = add(
            check_project(args.tpu_project) if has_gcloud else Result("project", None, "needs gcloud")
        ).ok
    credentials = add(check_credentials()).ok
    if args.storage:
        if credentials:
            add(check_bucket(args.storage))
        else:
            add(Result("bucket", None, "needs credentials"))
    if not args.tpu_zone:
        return results
    where = gcloud.Location(args.tpu_zone, args.tpu_project or None)
    # Without a project every TPU call fails too, and its error reads like a disabled API.
    api = add(
        check_tpu_api(where) if has_project else Result("TPU API", None, "needs gcloud and a project")
    ).ok
    for name in args.tpu_slices:
        if not api:
            add(Result(f"slice {name}", None, "needs gcloud, a project and the TPU API"))
            continue
        if add(check_slice(name, where, args.tpu_create, args.tpu_accelerator_type)).detail == "READY":
            add(check_ssh(name, where))
    return results


def main(args: argparse.Namespace) -> int:
    if args.storage:
        storage.check_url(args.storage, "--storage")
        if not args.storage.startswith("gs://"):
            raise UserError(
                f"--storage {args.storage!r}: preflight checks gs:// storage; this is a local path"
            )
    for name in args.tpu_slices:
        gcloud.check(name, gcloud.NAME, "slice name")
    results = run_checks(args, lambda result: print(result.line(), flush=True))
    failed = [r.name for r in results if r.ok is False]
    if failed:
        print(f"preflight: {len(failed)} check(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("preflight: every check passed")
    return 0

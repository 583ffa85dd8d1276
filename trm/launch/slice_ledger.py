"""The slices this controller's launchers created and have not deleted, so that the end of a study can say which
slices still bill.

A launcher in create mode (`launch.tpu.create`) records each queued resource it created in
LOCK_DIR/created/ZONE-NAME.json (the pool's lock folder, on the controller) and removes the record once a delete
call succeeded. The workflow's `onsuccess` and `onerror` (Snakefile) call `report_leftovers`, which asks the cloud
about every recorded slice, forgets those already gone, and prints the others with the command that deletes each:
a slice kept between jobs (`delete_after: false`, the default) bills until someone deletes it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from trm import storage
from trm.errors import UserError
from trm.launch import gcloud

FOLDER = "created"


def _record_path(lock_dir: Path, name: str, zone: str) -> Path:
    return Path(lock_dir) / FOLDER / f"{zone}-{name}.json"


def record_created(lock_dir: Path, name: str, where: gcloud.Location, accelerator_type: str) -> None:
    """Note that this controller created queued resource `name` (a slice of `accelerator_type`) in `where`."""
    path = _record_path(lock_dir, name, where.zone)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "name": name,
        "zone": where.zone,
        "project": where.project,
        "accelerator_type": accelerator_type,
        "created_at": time.time(),
    }
    storage.write_text(str(path), json.dumps(record, sort_keys=True) + "\n")


def record_deleted(lock_dir: Path, name: str, where: gcloud.Location) -> None:
    _record_path(lock_dir, name, where.zone).unlink(missing_ok=True)


def created(lock_dirs: Iterable[Path]) -> list[dict]:
    """The records of every slice created from these lock folders and not deleted since (unreadable ones are
    skipped: a half-written record names no slice we could delete)."""
    records = []
    for lock_dir in dict.fromkeys(Path(d) for d in lock_dirs):
        for path in sorted((lock_dir / FOLDER).glob("*.json")):
            try:
                record = json.loads(path.read_text())
                records.append({**record, "path": str(path)})
            except (OSError, ValueError):
                continue
    return records


def delete_command(record: dict) -> str:
    where = gcloud.Location(record["zone"], record["project"])
    return " ".join(gcloud.delete_queued_resource(record["name"], where))


def report_leftovers(lock_dirs: Iterable[Path], timeout_s: float, out=sys.stderr) -> list[dict]:
    """Print the slices the workflow created that still exist, each with its delete command; forget those that
    are gone or being deleted. Returns the records printed. One the cloud does not answer for is printed as
    "not checked"."""
    retry = gcloud.Retry(
        timeout_s=timeout_s, budget_s=2 * timeout_s, first_s=1.0, max_s=2.0, log=lambda _: None
    )
    left = []
    for record in created(lock_dirs):
        where = gcloud.Location(record["zone"], record["project"])
        try:
            state = gcloud.describe(gcloud.describe_queued_resource(record["name"], where), retry).state
        except (UserError, gcloud.CloudUnavailable):  # gcloud missing, or no answer: say what we know
            state = "unknown"
        if state in (None, "DELETING"):
            Path(record["path"]).unlink(missing_ok=True)
            continue
        left.append({**record, "state": state})
    if left:
        print(
            f"\n{len(left)} TPU slice(s) this workflow created still exist and bill until deleted "
            "(launch.tpu.delete_after: false keeps them for the next jobs):",
            file=out,
        )
        for record in left:
            state = (
                "not checked: the cloud did not answer" if record["state"] == "unknown" else record["state"]
            )
            print(f"  {record['name']} ({record['accelerator_type']}, {record['zone']}): {state}", file=out)
            print(f"    delete: {delete_command(record)}", file=out)
    return left


def report_study(backend: str, pools: list[dict]) -> None:
    """The workflow's end (Snakefile onsuccess/onerror): `report_leftovers` over the lock folders of every pool
    of the study (each job's merged `launch.tpu`), for a tpu-vm study."""
    if backend == "tpu-vm":
        lock_dirs = [Path(pool["lock_dir"]).expanduser() for pool in pools]
        report_leftovers(lock_dirs, pools[0]["gcloud_timeout_seconds"])

"""The slices a study created and did not delete are listed at its end with their delete command
(trm/launch/slice_ledger.py), against the fake gcloud (tests/fake_gcloud/gcloud): create, describe, delete."""

from __future__ import annotations

import io
import shlex
import subprocess
from pathlib import Path

from trm.launch import slice_ledger, tpu_options
from trm.launch.tpu_slice import Slice

NAME = "trm-ledger"  # no other test module's slice name: modules run side by side


def _slice(lock_dir: Path, **overrides) -> Slice:
    settings = {
        **tpu_options.defaults(),
        "slices": [NAME],
        "code_url": "gs://bkt/code",
        "poll_seconds": 0.05,
        "gcloud_timeout_seconds": 60,
        "provision_timeout_seconds": 600,
        "lock_dir": str(lock_dir),
        "create": True,
        **overrides,
    }
    return Slice(NAME, tpu_options.check(settings), lambda _: None)


def _report(lock_dir: Path) -> tuple[list[dict], str]:
    out = io.StringIO()
    left = slice_ledger.report_leftovers([lock_dir], timeout_s=30, out=out)
    return left, out.getvalue()


def test_a_created_slice_is_listed_with_the_command_that_deletes_it_until_it_is_gone(cloud, tmp_path):
    locks = tmp_path / "locks"
    assert _report(locks) == ([], "")  # nothing created: nothing said
    _slice(locks).ensure_ready()  # creates the queued resource: ACCEPTED ... ACTIVE
    left, text = _report(locks)
    assert [record["name"] for record in left] == [NAME]
    assert "1 TPU slice(s) this workflow created still exist" in text and f"{NAME} (v4-" in text
    command = text.split("delete: ", 1)[1].strip()
    assert command.startswith("gcloud compute tpus queued-resources delete trm-ledger")
    # The printed command is one a user can paste: it deletes the slice, and the next report forgets it.
    subprocess.run(shlex.split(command), check=True, timeout=60, capture_output=True)
    assert _report(locks) == ([], "")
    assert not list((locks / slice_ledger.FOLDER).glob("*.json"))


def test_a_slice_deleted_by_its_launcher_is_not_listed(cloud, tmp_path):
    locks = tmp_path / "locks"
    created = _slice(locks)
    created.ensure_ready()
    assert created.delete()
    assert _report(locks) == ([], "")


def test_without_an_answer_from_the_cloud_the_slice_is_listed_as_not_checked(cloud, tmp_path, monkeypatch):
    locks = tmp_path / "locks"
    _slice(locks).ensure_ready()
    monkeypatch.setenv("PATH", str(tmp_path / "no-gcloud-here"))  # gcloud missing on this machine
    left, text = _report(locks)
    assert [record["name"] for record in left] == [NAME]
    assert "not checked: the cloud did not answer" in text and "delete: gcloud compute tpus" in text

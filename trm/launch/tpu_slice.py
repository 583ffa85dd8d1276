"""One slice of the pool as the cloud reports it: waiting until it can run a job, creating and deleting it.

The states (trm/launch/gcloud.py has the lists):
  queued resource  ACCEPTED, CREATING, PROVISIONING, WAITING_FOR_RESOURCES: wait; ACTIVE: its node is used;
                   SUSPENDING, SUSPENDED, DELETING: a preemption (deleted, unless deleting, and recreated);
                   FAILED: the job fails at once with the cloud's message (quota, stockout, a bad type).
  node             READY: runs; CREATING, STARTING, RESTARTING: wait; REPAIRING: wait at most
                   repair_timeout_seconds, then it counts as lost; PREEMPTED, TERMINATED, anything else or
                   gone: lost (create mode recreates it, pool mode waits for it to be READY again).
A describe that fails transiently (timeout, network, 429, 5xx) is retried with backoff and, when it keeps
failing, reported as unknown: never as a lost slice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from trm.errors import UserError
from trm.launch import gcloud, slice_ledger
from trm.launch.tpu_options import TpuOptions

CREATE_TIMEOUT_S = 300.0


class SliceLost(Exception):
    """The slice was preempted or lost while we waited for it: relaunch."""


class Slice:
    def __init__(self, name: str, options: TpuOptions, log: Callable[[str], None]) -> None:
        self.name = name
        self.options = options
        self.log = log
        self.repairing_since: float | None = None
        poll = options.poll_seconds
        self.retry = gcloud.Retry(  # transient describe failures: backoff, at most 10 minutes by default
            timeout_s=options.gcloud_timeout_seconds,
            budget_s=max(5 * options.gcloud_timeout_seconds, 10 * poll),
            first_s=min(2.0, poll),
            max_s=max(poll, 2.0),
            log=log,
        )

    def node(self) -> gcloud.Resource:
        return gcloud.describe(gcloud.describe_node(self.name, self.options.where), self.retry)

    def queued(self) -> gcloud.Resource:
        return gcloud.describe(gcloud.describe_queued_resource(self.name, self.options.where), self.retry)

    def health(self) -> tuple[str, str]:
        """While a job runs: ("ok"|"unknown"|"repairing"|"lost", what the cloud said)."""
        try:
            state = self.node().state
        except gcloud.CloudUnavailable as err:
            return "unknown", str(err)
        if state == gcloud.NODE_READY:
            self.repairing_since = None
            return "ok", state
        if state == gcloud.NODE_REPAIRING and not self._repair_overdue():
            return "repairing", state
        return "lost", f"slice {self.name} is {state or 'gone'}"

    def _repair_overdue(self) -> bool:
        self.repairing_since = self.repairing_since or time.time()
        return time.time() - self.repairing_since > self.options.repair_timeout_seconds

    # ------------------------------------------------------------------------------------------ waiting

    def ensure_ready(self) -> gcloud.Resource:
        """The READY node (its endpoints give the hosts' addresses): created or recreated in create mode, waited
        for in pool mode. SliceLost when it is preempted meanwhile; UserError when it cannot come."""
        if self.options.create:
            self._ensure_queued_resource()
        return self._wait_node_ready()

    def _ensure_queued_resource(self) -> None:
        qr = self._unknown_as_none(self.queued)
        if qr is not None and qr.state == gcloud.QR_FAILED:
            raise UserError(f"queued resource {self.name} FAILED: {qr.failure}")
        if qr is not None and qr.state in gcloud.QR_PREEMPTED:
            self.log(f"queued resource {self.name} is {qr.state} (preempted): deleting it to recreate")
            self._delete_and_wait(qr.state)
            qr = gcloud.Resource(None, {})
        elif qr is not None and qr.state == gcloud.QR_ACTIVE:
            node = self._unknown_as_none(self.node)
            broken = node is not None and node.state not in (gcloud.NODE_READY, *gcloud.NODE_COMING)
            if broken or (
                node is not None and node.state == gcloud.NODE_REPAIRING and self._repair_overdue()
            ):
                self.log(
                    f"slice {self.name} is {node.state or 'gone'}: deleting its queued resource to recreate"
                )
                self.repairing_since = None
                self._delete_and_wait(qr.state)
                qr = gcloud.Resource(None, {})
        if qr is not None and qr.state is None:
            self._create()
        self._wait_queued_active()

    def _unknown_as_none(self, describe: Callable[[], gcloud.Resource]) -> gcloud.Resource | None:
        try:
            return describe()
        except gcloud.CloudUnavailable as err:
            self.log(f"the cloud does not answer ({err}); waiting")
            return None

    def _create(self) -> None:
        o = self.options
        argv = gcloud.create_queued_resource(
            self.name, self.name, o.where, o.accelerator_type, o.runtime_version, o.provisioning
        )
        self.log(f"create queued resource: {' '.join(argv[:6])} ...")
        done = gcloud.run(argv, CREATE_TIMEOUT_S)
        kind = gcloud.classify(done)
        if kind == "transient" or kind == "ok":  # recorded even when unsure: the study's end checks it exists
            slice_ledger.record_created(o.lock_dir, self.name, o.where, o.accelerator_type)
        if kind == "ok" or "ALREADY_EXISTS" in done.stderr:
            return
        message = gcloud.error_line(done.stderr)
        if kind == "transient":  # it may or may not exist now: the wait below describes it again
            self.log(f"creating queued resource {self.name} failed transiently ({message}); checking")
            return
        raise UserError(f"could not create queued resource {self.name}: {message}")

    def _deadline(self) -> float:
        return time.time() + self.options.provision_timeout_seconds

    def _poll(
        self, describe: Callable[[], gcloud.Resource], what: str, wanted: str
    ) -> Iterator[tuple[gcloud.Resource | None, str | None]]:
        """(resource, state) every poll_seconds ("unknown" while the cloud does not answer), logging each new
        state; a UserError when the caller is still waiting after provision_timeout_seconds."""
        deadline, last = self._deadline(), object()
        while True:
            resource = self._unknown_as_none(describe)
            state = resource.state if resource else "unknown"
            if state != last:
                self.log(f"{what} is {state or 'not found'}")
                last = state
            yield resource, state
            if time.time() > deadline:
                raise UserError(f"{what} not {wanted} after {self.options.provision_timeout_seconds:.0f} s")
            time.sleep(self.options.poll_seconds)

    def _wait_queued_active(self) -> None:
        created = False
        for qr, state in self._poll(self.queued, f"queued resource {self.name}", gcloud.QR_ACTIVE):
            if state == gcloud.QR_ACTIVE:
                return
            if state == gcloud.QR_FAILED:
                raise UserError(f"queued resource {self.name} FAILED: {qr.failure}")
            if state in gcloud.QR_PREEMPTED:
                raise SliceLost(f"queued resource {self.name} is {state}")
            if state is None:  # a transient create failure that did not create it
                if created:
                    raise SliceLost(f"queued resource {self.name} disappeared")
                self._create()
                created = True

    def _wait_node_ready(self) -> gcloud.Resource:
        for node, state in self._poll(self.node, f"slice {self.name}", gcloud.NODE_READY):
            if state == gcloud.NODE_READY:
                self.repairing_since = None
                return node
            if state == gcloud.NODE_REPAIRING and self._repair_overdue():
                why = f"slice {self.name} still REPAIRING after {self.options.repair_timeout_seconds:.0f} s"
                raise SliceLost(why) if self.options.create else UserError(why)
            lost = state is None or (state != "unknown" and state not in gcloud.NODE_COMING)
            if self.options.create and lost:
                raise SliceLost(f"slice {self.name} is {state or 'gone'}")
        raise AssertionError("unreachable: _poll ends by raising")

    def _delete_and_wait(self, state: str | None) -> None:
        """Delete the queued resource and wait until it is gone, asking again while a deletion call fails."""
        deleted = self.delete(state)
        for qr, _ in self._poll(self.queued, f"queued resource {self.name}", "deleted"):
            if qr is not None and qr.state is None:
                return
            if not deleted:
                deleted = self.delete(qr.state if qr else None)

    def delete(self, state: str | None = None) -> bool:
        """Delete the queued resource and its slice (not waiting; nothing to do while it is DELETING); False
        when the call failed."""
        if state == "DELETING":
            return True
        argv = gcloud.delete_queued_resource(self.name, self.options.where)
        done = gcloud.run(argv, self.options.gcloud_timeout_seconds)
        if gcloud.classify(done) in ("ok", "not_found"):
            slice_ledger.record_deleted(self.options.lock_dir, self.name, self.options.where)
            return True
        self.log(f"delete queued resource {self.name} failed: {gcloud.error_line(done.stderr)}")
        return False

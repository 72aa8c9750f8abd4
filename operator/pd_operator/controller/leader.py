"""Leader election on a coordination.k8s.io Lease, as Kubernetes' own controllers do.

Every replica watches and caches (so a standby is warm); only the holder of
the Lease reconciles, resyncs and autoscales. The holder renews every
``renew`` seconds; a standby takes the Lease over when its record has not
changed for ``duration`` seconds by the standby's own clock (no clock
agreement between nodes is needed), or at once when the holder released it
on a clean shutdown (a rolling update then has no gap). A holder that cannot
renew within ``duration`` steps down before anyone else can take over.

A standby takes over no earlier than ``duration`` after the holder's last
successful renewal began (it sees the record change only once that write is
done), so the holder writes only while ``holds()``: less than
``duration - renew`` since that moment (client-go's renew deadline). Each Lease
call is bounded by that deadline too: a renewal hung on a slow API server
returns, fails, and the holder steps down before the standby may take over
(an unbounded call kept a replica leading ~50 s past its takeover).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone

from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

LEASE_NAME = "pd-operator-leader"


def _micro_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaderElector:
    def __init__(self, kube, namespace: str, name: str = LEASE_NAME, identity: str | None = None,
                 duration: float = 15.0, renew: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[bool], None] | None = None):
        self.kube, self.namespace, self.name = kube, namespace, name
        self.identity = identity or default_identity()
        self.duration, self.renew, self.clock = duration, renew, clock
        self.on_change = on_change
        self.leading = threading.Event()
        self._observed: tuple[str, str, str] | None = None  # (holder, renewTime, resourceVersion) last seen
        self._observed_at = 0.0
        self._last_renewed = 0.0
        self._mine: dict | None = None  # the Lease as our last write left it (the holder renews from it)
        # one round or release at a time; after release() no round takes the Lease again
        self._lock = threading.Lock()
        self._released = False

    @property
    def deadline(self) -> float:
        """How long after its last renewal began the holder still writes (renew deadline)."""
        return max(1.0, self.duration - self.renew)

    def holds(self) -> bool:
        """Whether this replica may write now: it leads, and its last renewal is recent enough
        that no standby can have taken over (checked before each write, not only when the
        lease thread gets to run: a process frozen past its lease resumes here)."""
        return self.leading.is_set() and self.clock() - self._last_renewed < self.deadline

    def _call(self, method: str, path: str, **kw):
        return self.kube._call(method, path, timeout=self.deadline, **kw)

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def _set(self, leading: bool) -> None:
        if leading == self.leading.is_set():
            return
        if leading:
            self.leading.set()
        else:
            self.leading.clear()
        log.info("%s %s the lease %s/%s", self.identity, "holds" if leading else "does not hold",
                 self.namespace, self.name)
        if self.on_change:
            self.on_change(leading)

    def _record(self, holder: str, transitions: int, acquire: str | None) -> dict:
        now = _micro_now()
        return {"holderIdentity": holder, "leaseDurationSeconds": int(self.duration),
                "acquireTime": acquire or now, "renewTime": now, "leaseTransitions": transitions}

    def try_once(self) -> bool:
        """One round: acquire or renew. Returns whether this replica leads afterwards."""
        with self._lock:
            if self._released:
                return False
            return self._round()

    def _round(self) -> bool:
        now = self.clock()
        if self.leading.is_set() and self._mine is not None:
            # the holder renews with one request: a patch conditional on the version its
            # own last write returned; anyone else's write since (409) sends it to a read
            spec = self._mine.get("spec") or {}
            try:
                self._mine = self._patch(self._mine, self._record(self.identity, int(spec.get("leaseTransitions") or 0),
                                                                  spec.get("acquireTime")))
            except ApiException as err:
                self._mine = None
                if err.status != 409:
                    return self._failed(self.clock(), err)
            else:
                self._last_renewed = now
                return True
        try:
            lease = self._call("GET", self.path)
        except ApiException as err:
            if err.status != 404:
                return self._failed(self.clock(), err)
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._record(self.identity, 0, None)}
            try:
                self._mine = self._call("POST", self.path.rsplit("/", 1)[0], body=body)
            except ApiException as err2:
                return self._failed(self.clock(), err2)
            self._last_renewed = now
            self._set(True)
            return True
        now = self.clock()  # after the read: a change it shows may be that recent
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        seen = (holder, spec.get("renewTime") or "", (lease.get("metadata") or {}).get("resourceVersion") or "")
        if seen != self._observed:
            self._observed, self._observed_at = seen, now
        if holder and holder != self.identity and now - self._observed_at < self.duration:
            self._set(False)  # someone else holds a live lease
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquire = spec.get("acquireTime") if holder == self.identity else None
        record = self._record(self.identity, transitions, acquire)
        try:  # resourceVersion in the patch is a precondition: of two replicas taking over at once, one wins (409)
            self._mine = self._patch(lease, record)
        except ApiException as err:
            return self._failed(self.clock(), err)
        self._last_renewed = now
        self._observed = None  # the next read sees our own write as a change
        self._observed_at = now
        self._set(True)
        return True

    def _patch(self, lease: dict, spec: dict) -> dict:
        """A merge patch (RBAC: patch, no update) conditional on the version read; the Lease written."""
        body = {"metadata": {"resourceVersion": (lease.get("metadata") or {}).get("resourceVersion")}, "spec": spec}
        return self._call("PATCH", self.path, body=body, content_type="application/merge-patch+json")

    def _failed(self, now: float, err: Exception) -> bool:
        if self.leading.is_set() and now - self._last_renewed >= self.duration - self.renew:
            log.warning("could not renew the lease for %.0fs (%s): stepping down", now - self._last_renewed, err)
            self._set(False)
        elif isinstance(err, ApiException) and err.status == 403:
            log.error("may not get/create/patch the Lease %s/%s (%s): grant it (the chart's %s Role does), set "
                      "--lease-namespace (or POD_NAMESPACE) to where it may, or run one replica with --no-leader-elect",
                      self.namespace, self.name, err.reason, "-leader")
        elif not isinstance(err, ApiException) or err.status != 409:
            log.warning("lease %s/%s: %s", self.namespace, self.name, err)
        return self.leading.is_set()

    def release(self) -> None:
        """Give the lease up now (clean shutdown): the standby takes over at its next round.
        Waits for a round in progress; no later round takes the Lease again."""
        with self._lock:
            self._released = True
            self._release()

    def _release(self) -> None:
        if not self.leading.is_set():
            return
        self._set(False)
        self._mine = None
        try:
            lease = self._call("GET", self.path)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                self._patch(lease, {"holderIdentity": ""})
        except Exception as err:  # noqa: BLE001 - the lease then expires by itself
            log.warning("could not release the lease: %s", err)

    def run(self, stop: threading.Event) -> None:
        """Rounds every ``renew`` seconds until ``stop``; the Lease is then kept until
        release() (a clean shutdown gives it up once its writes are done)."""
        while not stop.is_set():
            try:
                self.try_once()
            except Exception as err:  # noqa: BLE001 - never let the loop die
                self._failed(self.clock(), err)
            stop.wait(self.renew)

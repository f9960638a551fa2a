"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that two scheduler replicas
never both act.

One replica holds the Lease and renews it; the others watch it and take it over only once
it has not been renewed for ``lease_s`` *as they observed it* (their own clock from the
moment they last saw the record change, as client-go does, so clock skew between replicas
does not matter). Every write carries the ``resourceVersion`` it read, so when two replicas
race for an expired Lease exactly one write succeeds. A leader that cannot renew within
``renew_deadline_s`` stops acting before another replica can take over.

Renewal runs in a thread of its own (:meth:`LeaseElector.run`, every ``retry_s``), as
client-go's leader elector does (defaults 15 s lease, 10 s renew deadline, 2 s retry
period): a scheduling round that spends seconds on API writes does not delay it, so a long
round never costs the Lease.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fgpu.k8s.kube import KubeApi, KubeError

log = logging.getLogger("fgpu.k8s.leader")


def _micro_time(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Acquire and renew a Lease.

    Args:
        api: the Kubernetes API.
        namespace: the Lease's namespace.
        name: the Lease's name.
        identity: this replica's name (unique: pod name and a random suffix).
        lease_s: how long a Lease not renewed stays another replica's (seconds).
        renew_deadline_s: a leader that has not renewed for this long stops acting
            (must be below ``lease_s``).
        retry_s: seconds between attempts in :meth:`run` (default: a fifth of
            ``renew_deadline_s``, 2 s with the defaults, client-go's retry period).
        clock: monotonic seconds (tests pass a fake one).

    Raises:
        ValueError: ``renew_deadline_s`` not below ``lease_s``, or ``retry_s`` not below
            ``renew_deadline_s``.
    """

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < renew_deadline_s < lease_s:
            raise ValueError("renew_deadline_s: must be positive and below lease_s")
        if retry_s is None:
            retry_s = renew_deadline_s / 5
        if not 0 < retry_s < renew_deadline_s:
            raise ValueError(
                f"retry_s: {retry_s} must be positive and below renew_deadline_s "
                f"({renew_deadline_s})"
            )
        self.retry_s = retry_s
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_s = lease_s
        self.renew_deadline_s = renew_deadline_s
        self.clock = clock
        self._renewed_at: float | None = None
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._lock = threading.Lock()  # one attempt at a time (run() and step())
        self.renewals = 0
        """Successful writes of the Lease by this replica (acquisitions and renewals)."""
        self.last_error = ""
        """Why the last attempt on the Lease failed ("" when the API server answered it)."""

    def is_leader(self) -> bool:
        """True while this replica renewed the Lease within ``renew_deadline_s``."""
        return (
            self._renewed_at is not None and self.clock() - self._renewed_at < self.renew_deadline_s
        )

    def step(self) -> bool:
        """Try to acquire or renew the Lease once; return :meth:`is_leader`.

        API errors are logged and count as a failed attempt.
        """
        with self._lock:
            now = self.clock()
            try:
                self._try(now)
                self.last_error = ""
            except KubeError as exc:
                self.last_error = ""  # 409: a race lost, the API server answered
                if exc.status != 409:
                    log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
                    self.last_error = str(exc).splitlines()[0]
            return self.is_leader()

    def run(self, stop: threading.Event, on_acquired: Callable[[], None] | None = None) -> None:
        """Acquire or renew every ``retry_s`` until ``stop`` is set (a thread's target).

        Each attempt starts ``retry_s`` after the last one began, so a slow API stretches
        the gap only by the time the attempt itself took.

        Args:
            stop: ends the loop.
            on_acquired: called each time this replica becomes the leader (client-go's
                ``OnStartedLeading``), e.g. to start a round at once.
        """
        leading = False
        while not stop.is_set():
            began = time.monotonic()
            try:
                now_leading = self.step()
            except Exception:  # a bug must not end renewal silently: keep trying
                log.exception("lease %s/%s: renewal attempt failed", self.namespace, self.name)
                now_leading = False
            if now_leading and not leading and on_acquired is not None:
                on_acquired()
            leading = now_leading
            stop.wait(max(0.0, self.retry_s - (time.monotonic() - began)))

    def _record(self, holder: str, transitions: int, acquired: str) -> dict[str, Any]:
        wall = time.time()
        return {
            "holderIdentity": holder,
            "leaseDurationSeconds": max(1, int(self.lease_s)),
            "acquireTime": acquired,
            "renewTime": _micro_time(wall),
            "leaseTransitions": transitions,
        }

    def _try(self, now: float) -> None:
        lease = self.api.get_lease(self.namespace, self.name)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._record(self.identity, 0, _micro_time(time.time())),
            }
            self.api.create_lease(self.namespace, body)
            self._renewed_at = now
            self.renewals += 1
            log.info("%s acquired lease %s/%s", self.identity, self.namespace, self.name)
            return
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        seen = (holder, spec.get("renewTime"), lease["metadata"].get("resourceVersion"))
        if seen != self._observed:
            self._observed = seen
            self._observed_at = now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_s)
        mine = holder == self.identity
        if not mine and holder and now - self._observed_at < duration:
            self._renewed_at = None  # someone else holds it
            return
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        acquired = spec.get("acquireTime") if mine else _micro_time(time.time())
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": lease["metadata"]["resourceVersion"],
            },
            "spec": self._record(self.identity, transitions, acquired or ""),
        }
        try:
            self.api.replace_lease(self.namespace, self.name, body)
        except KubeError:
            self._renewed_at = None if not mine else self._renewed_at
            raise
        if not mine:
            log.info(
                "%s took over lease %s/%s from %r", self.identity, self.namespace, self.name, holder
            )
        self._renewed_at = now
        self.renewals += 1

    def release(self) -> None:
        """Give the Lease up (on a clean stop) so that another replica need not wait.

        Raises:
            KubeError: the API server refused or could not be reached: the Lease then runs
                out after ``lease_s`` (this replica has stopped acting either way).
        """
        with self._lock:
            if self._renewed_at is None:
                return
            self._renewed_at = None
        lease = self.api.get_lease(self.namespace, self.name)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        lease["spec"]["holderIdentity"] = ""
        lease["spec"]["leaseDurationSeconds"] = 1
        self.api.replace_lease(self.namespace, self.name, lease)

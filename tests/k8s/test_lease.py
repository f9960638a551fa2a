"""Leader election renews the Lease in a thread of its own, so a scheduling round that
spends longer than the renew deadline on API writes does not cost the Lease.

Kubernetes semantics relied on (client-go ``tools/leaderelection``, the library
kube-scheduler and kube-controller-manager elect their leader with): the holder renews
``renewTime`` every retry period (2 s by default), stops acting once it has not renewed for
``renewDeadline`` (10 s), and another candidate takes over only after ``leaseDuration``
(15 s) without a renewal; a takeover increments ``spec.leaseTransitions``. The stand-in
here answers every request after a delay (:attr:`fgpu_standin.Options.latency_s`), as
an API server writing through etcd does, so that one round's serial status and event writes
outlast the renew deadline.
"""

from __future__ import annotations

import threading
import time

import pytest

from fgpu.k8s.leader import LeaseElector
from fgpu.k8s.scheduler import K8sScheduler
from tests.k8s.kube import add_node, create, pod, wait_until

pytestmark = pytest.mark.k8s

LATENCY_S = 0.05
PODS = 24  # each waits: a status patch and an event, written one after the other


def _unschedulable(cluster) -> int:
    out = cluster.api.list_pods(namespace=cluster.namespace).items
    return sum(
        1
        for p in out
        for c in (p.get("status") or {}).get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("status") == "False"
    )


def test_a_round_longer_than_the_renew_deadline_keeps_the_lease(make_cluster) -> None:
    cluster = make_cluster(latency_s=LATENCY_S)
    if cluster.real:
        pytest.skip("the latency knob is the stand-in's")
    add_node(cluster, "node-a", gpus=2)
    for i in range(PODS):
        create(cluster, pod(f"big-{i}", "4"))  # fits nowhere: every pod gets a reason written

    def elector(identity: str) -> LeaseElector:
        return LeaseElector(
            cluster.api,
            cluster.namespace,
            "fgpu-scheduler",
            identity,
            lease_s=3,
            renew_deadline_s=2,
            retry_s=0.4,
        )

    leader = K8sScheduler(cluster.scheduler_api, env_without_isolation=True, elector=elector("a"))
    standby = K8sScheduler(cluster.scheduler_api, env_without_isolation=True, elector=elector("b"))
    lost = threading.Event()
    holders: set[str] = set()
    transitions: set[int] = set()
    done = threading.Event()

    def watch() -> None:  # what the leader believes, and what the Lease says
        while not done.is_set():
            if not leader.is_leader():
                lost.set()
            lease = cluster.api.get_lease(cluster.namespace, "fgpu-scheduler")
            if lease is not None:
                holders.add(lease["spec"].get("holderIdentity") or "")
                transitions.add(int(lease["spec"].get("leaseTransitions") or 0))
            done.wait(0.02)

    leader.start(tick_s=30)  # one round after the sync; no ticks during the test
    monitor: threading.Thread | None = None
    try:
        wait_until(leader.is_leader, "replica a holds the lease")
        began = time.monotonic()
        monitor = threading.Thread(target=watch, daemon=True)
        monitor.start()
        standby.start(tick_s=30)
        renewals_before = leader.elector.renewals if leader.elector else 0
        wait_until(lambda: _unschedulable(cluster) == PODS, "every pod's reason written")
        took = time.monotonic() - began
    finally:
        done.set()
        if monitor is not None:
            monitor.join(timeout=10)
        standby.stop()
        leader.stop()
    # the writes alone (2 per pod, one at a time) take longer than the renew deadline ...
    assert took > 2 * PODS * LATENCY_S > 2
    # ... yet the leader never stopped being the leader, kept renewing meanwhile, and the
    # standby never took over nor acted
    assert not lost.is_set()
    assert leader.elector is not None
    assert leader.elector.renewals > renewals_before
    assert holders == {"a"}
    assert transitions == {0}
    assert standby.bound == 0
    assert standby.last is None


def test_the_retry_period_must_be_below_the_renew_deadline(cluster) -> None:
    with pytest.raises(ValueError, match=r"retry_s: 3 must be positive and below"):
        LeaseElector(cluster.api, "x", "y", "me", lease_s=5, renew_deadline_s=3, retry_s=3)

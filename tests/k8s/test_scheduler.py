"""The fgpu scheduler against the Kubernetes API (stand-in, or a real cluster with
KUBECONFIG): binding, ledger rebuilt from the cluster, leader election, reasons."""

from __future__ import annotations

import itertools
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from fgpu.k8s import wire
from fgpu.k8s.kube import KubeError
from fgpu.k8s.leader import LeaseElector
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.k8s.webhook_app import create_app
from fgpu.sched.state import check_invariants
from tests.k8s.conftest import Cluster, Served, fgpu_admission
from tests.k8s.kube import (
    add_node,
    assignment,
    bound,
    create,
    events,
    gpu_uuid,
    pod,
    wait_until,
)

pytestmark = pytest.mark.k8s


def per_gpu_milli(cluster: Cluster) -> Counter[str]:
    use: Counter[str] = Counter()
    for p in bound(cluster):
        a = assignment(p)
        for u, m in zip(a.uuids, a.gpu_milli, strict=True):
            use[u] += m
    return use


def test_sixteen_half_gpu_pods_created_at_once_land_two_per_gpu_each_seeing_its_own(
    make_cluster,
) -> None:
    with Served(create_app(env_without_isolation=True)) as webhook:
        cluster = make_cluster(admission=fgpu_admission(webhook.url))
        add_node(cluster, "node-a", gpus=8)
        scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
        scheduler.start(tick_s=1.0)
        try:
            admit = cluster.real  # a real cluster runs the webhook through its configuration
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda i: create(cluster, pod(f"half-{i}", "0.5"), admit), range(16)))
            wait_until(lambda: len(bound(cluster)) == 16, "all 16 pods bound")
        finally:
            scheduler.stop()
    placed = bound(cluster)
    assert {p["spec"]["nodeName"] for p in placed} == {"node-a"}
    uuids = Counter(u for p in placed for u in assignment(p).uuids)
    assert uuids == {gpu_uuid("node-a", i): 2 for i in range(8)}
    for p in placed:
        a = assignment(p)
        assert a.gpu_milli == (500,)
        assert a.gpu_memory_mib == (40960,)
        refs = [r["configMapRef"]["name"] for r in p["spec"]["containers"][0]["envFrom"]]
        assert refs == [p["metadata"]["annotations"][wire.ENV_CONFIGMAP]]
        env = cluster.api.get_config_map(cluster.namespace, refs[0])["data"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == a.uuids[0]
        assert env["CUDA_VISIBLE_DEVICES"] == a.uuids[0]
        assert env["FGPU_GPU_COMPUTE_MILLI"] == "500"
        assert env["FGPU_GPU_MEMORY_MIB"] == "40960"
        assert env["FGPU_WORKLOAD_ID"] == f"{cluster.namespace}/{p['metadata']['name']}"
        assert p["metadata"]["annotations"][wire.GPU_UUIDS] == a.uuids[0]


def test_deleted_pods_free_their_capacity_even_when_the_scheduler_was_down(cluster) -> None:
    add_node(cluster, "node-a", gpus=4)
    for i in range(4):
        create(cluster, pod(f"whole-{i}", "1"))
    first = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    first.sync()
    first.run_once()
    assert len(bound(cluster)) == 4
    create(cluster, pod("late", "2"))
    first.sync()
    first.run_once()
    late = cluster.api.get_pod(cluster.namespace, "late")
    assert not late["spec"].get("nodeName")
    # the scheduler is gone; two pods are deleted meanwhile
    del first
    cluster.api.delete_pod(cluster.namespace, "whole-0", grace_s=0)
    cluster.api.delete_pod(cluster.namespace, "whole-1", grace_s=0)
    second = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    second.sync()
    second.run_once()
    late = cluster.api.get_pod(cluster.namespace, "late")
    assert late["spec"]["nodeName"] == "node-a"
    assert sorted(assignment(late).uuids) == [gpu_uuid("node-a", 0), gpu_uuid("node-a", 1)]


def test_a_deletion_seen_through_the_watch_frees_capacity(cluster) -> None:
    add_node(cluster, "node-a", gpus=1)
    create(cluster, pod("first", "1"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    scheduler.start(tick_s=1.0)
    try:
        wait_until(lambda: len(bound(cluster)) == 1, "first bound")
        create(cluster, pod("second", "0.5"))
        # considered: the scheduler said why it waits (no GPU free while first holds it)
        wait_until(lambda: f"{cluster.namespace}/second" in scheduler._reasons, "second considered")
        cluster.api.delete_pod(cluster.namespace, "first", grace_s=0)
        wait_until(
            lambda: bool(cluster.api.get_pod(cluster.namespace, "second")["spec"].get("nodeName")),
            "second bound after first was deleted",
        )
    finally:
        scheduler.stop()
    assert assignment(cluster.api.get_pod(cluster.namespace, "second")).uuids == (
        gpu_uuid("node-a", 0),
    )


def test_a_restarted_scheduler_rebuilds_the_same_state(cluster) -> None:
    add_node(cluster, "node-a", gpus=8)
    add_node(cluster, "node-b", gpus=4, model="H100-80GB")
    shapes = ["0.5", "0.25", "1", "2", "0.3", "0.7"]
    for i, shape in zip(range(14), itertools.cycle(shapes), strict=False):
        create(cluster, pod(f"p-{i}", shape))
    create(cluster, pod("mem", None, gpu_memory="10Gi"))
    first = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    first.sync()
    first.run_once()
    assert len(bound(cluster)) == 15
    for gone in ("p-0", "p-3", "mem"):  # the kept state follows deletions
        cluster.api.delete_pod(cluster.namespace, gone, grace_s=0)
    create(cluster, pod("p-new", "0.5"))
    first.sync()
    first.run_once()
    first.sync()
    rnd_a, dec_a = first.plan()
    first.check_state(rnd_a)
    second = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    second.sync()
    rnd_b, dec_b = second.plan()
    key = lambda w: (w.id, w.allocation, w.request, w.queue, w.priority)  # noqa: E731
    assert sorted(map(key, rnd_a.workloads)) == sorted(map(key, rnd_b.workloads))
    assert all(w.allocation is not None for w in rnd_b.workloads)
    assert dec_a.allocated == dec_b.allocated
    use = per_gpu_milli(cluster)
    assert max(use.values()) <= 1000
    from fgpu.sched.rounds import state_with

    state = state_with([i.node for i in rnd_b.infos], rnd_b.workloads, lambda w, e: None)
    check_invariants(state)
    assert int(state.gpu_allocated_milli) == sum(use.values())
    assert np.array_equal(
        state.gpu_free_milli.sum(axis=1),
        [
            8000 - sum(m for u, m in use.items() if "node-a" in u),
            4000 - sum(m for u, m in use.items() if "node-b" in u),
        ],
    )


def test_two_replicas_never_both_bind(cluster) -> None:
    add_node(cluster, "node-a", gpus=2)
    clock = {"a": 0.0, "b": 0.0}
    electors = {
        r: LeaseElector(
            cluster.api,
            cluster.namespace,
            "fgpu-scheduler",
            r,
            lease_s=15,
            renew_deadline_s=10,
            clock=lambda r=r: clock[r],
        )
        for r in ("a", "b")
    }
    a = K8sScheduler(cluster.scheduler_api, env_without_isolation=True, elector=electors["a"])
    b = K8sScheduler(cluster.scheduler_api, env_without_isolation=True, elector=electors["b"])
    assert electors["a"].step() is True
    assert electors["b"].step() is False
    for i in range(2):
        create(cluster, pod(f"w-{i}", "1"))
    for s in (a, b):
        s.sync()
    assert b.run_once() is None
    assert a.run_once() is not None
    assert a.bound == 2
    assert b.bound == 0
    # a stops renewing (hung); b takes over only once the lease has run out as b saw it
    create(cluster, pod("w-2", "0.5"))
    clock["b"] += 10
    assert electors["b"].step() is False
    clock["b"] += 6
    assert electors["b"].step() is True
    clock["a"] += 11  # a's own clock: past its renew deadline, so it stops acting
    a.sync()
    b.sync()
    assert a.run_once() is None
    decision = b.run_once()
    assert decision is not None
    assert b.bound == 0  # the node is full: w-2 waits, nobody double-books
    assert electors["a"].step() is False  # a comes back and finds b holding the lease
    assert sorted(p["metadata"]["name"] for p in bound(cluster)) == ["w-0", "w-1"]


def test_two_running_replicas_bind_each_pod_once(cluster) -> None:
    add_node(cluster, "node-a", gpus=4)
    replicas = [
        K8sScheduler(
            cluster.api,
            env_without_isolation=True,
            elector=LeaseElector(
                cluster.api,
                cluster.namespace,
                "fgpu-scheduler",
                f"r{i}",
                lease_s=3,
                renew_deadline_s=2,
            ),
        )
        for i in range(2)
    ]
    for r in replicas:
        r.start(tick_s=0.2)
    try:
        for i in range(12):
            create(cluster, pod(f"q-{i}", "0.25"))
        wait_until(lambda: len(bound(cluster)) == 12, "12 pods bound")
    finally:
        for r in replicas:
            r.stop()
    assert sorted(r.bound for r in replicas)[0] == 0
    scheduled = Counter(e["involvedObject"]["name"] for e in events(cluster, "Scheduled"))
    assert scheduled == {f"q-{i}": 1 for i in range(12)}
    assert max(per_gpu_milli(cluster).values()) <= 1000


def test_an_unschedulable_pod_gets_a_condition_and_an_event_with_the_reason(cluster) -> None:
    add_node(cluster, "node-a", gpus=2)
    create(cluster, pod("big", "4"))
    create(cluster, pod("elsewhere", "0.5", queue="no-such-queue"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    scheduler.sync()
    scheduler.run_once()
    big = cluster.api.get_pod(cluster.namespace, "big")
    cond = [c for c in big["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert cond[0]["status"] == "False"
    assert cond[0]["reason"] == "Unschedulable"
    assert "0/1 nodes" in cond[0]["message"]
    failed = {
        e["involvedObject"]["name"]: e["message"] for e in events(cluster, "FailedScheduling")
    }
    assert failed["big"] == cond[0]["message"]
    assert "unknown queue 'no-such-queue'" in failed["elsewhere"]
    scheduler.sync()
    scheduler.run_once()  # the same reason again: no second event
    assert len(events(cluster, "FailedScheduling")) == 2


def test_a_pod_the_webhook_did_not_admit_is_not_bound(cluster) -> None:
    add_node(cluster, "node-a", gpus=1)
    create(cluster, pod("raw", "0.5"), admit=False)
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    scheduler.sync()
    scheduler.run_once()
    raw = cluster.api.get_pod(cluster.namespace, "raw")
    assert not raw["spec"].get("nodeName")
    assert "not admitted by the fgpu webhook" in raw["status"]["conditions"][0]["message"]


def test_binding_twice_is_refused_by_the_api(cluster) -> None:
    add_node(cluster, "node-a", gpus=1)
    created = create(cluster, pod("once", "0.5"))
    uid = created["metadata"]["uid"]
    cluster.api.bind(cluster.namespace, "once", uid, "node-a", {wire.GPU_UUIDS: "x"})
    with pytest.raises(KubeError) as err:
        cluster.api.bind(cluster.namespace, "once", uid, "node-a", {wire.GPU_UUIDS: "y"})
    assert err.value.status == 409
    assert (
        cluster.api.get_pod(cluster.namespace, "once")["metadata"]["annotations"][wire.GPU_UUIDS]
        == "x"
    )


def test_settling_memory_freezes_what_is_alive(cluster) -> None:
    import gc

    add_node(cluster, "node-a", gpus=1)
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    scheduler.sync()
    gc.unfreeze()
    try:
        took = scheduler.settle_memory()
        assert took >= 0
        # the cache's objects are in the permanent generation: full collections skip them
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()

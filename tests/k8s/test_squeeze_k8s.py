"""Squeeze before evict in the Kubernetes scheduler (issue 17): the shared decision core
squeezes instead of evicting where memory allows; the scheduler records it on the pod
(annotation ``fgpu.io/squeezed-by``, events ``Squeezed`` and ``Released``) and counts the
squeezed pod without compute in the rounds after."""

from __future__ import annotations

import pytest

from fgpu.k8s import wire
from fgpu.k8s.scheduler import K8sScheduler
from tests.k8s.kube import add_node, assignment, bound, create, events, pod

pytestmark = pytest.mark.k8s


def round_(s: K8sScheduler) -> None:
    s.sync()
    s.run_once()


def test_a_higher_priority_pod_squeezes_a_low_one_instead_of_evicting_it(make_cluster) -> None:
    cluster = make_cluster(kubelet=False, graceful_delete=True)
    if cluster.real:
        pytest.skip("reads the stand-in's events right after the round")
    add_node(cluster, "node-a", gpus=1)
    for name in ("low-0", "low-1"):
        create(cluster, pod(name, "0.5", priority="low", gpu_memory="16Gi"))
    s = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(s)
    assert len(bound(cluster)) == 2
    create(cluster, pod("vip", "0.5", priority="90", gpu_memory="16Gi"))
    round_(s)
    vip = cluster.api.get_pod(cluster.namespace, "vip")
    assert assignment(vip).gpu_milli == (500,)  # placed at once, on the same GPU
    notes = {
        n: cluster.api.get_pod(cluster.namespace, n)["metadata"].get("annotations", {})
        for n in ("low-0", "low-1")
    }
    squeezed = [n for n, a in notes.items() if wire.SQUEEZED_BY in a]
    assert len(squeezed) == 1, notes
    assert notes[squeezed[0]][wire.SQUEEZED_BY] == f"{cluster.namespace}/vip"
    assert not events(cluster, "Preempted")
    assert [e["involvedObject"]["name"] for e in events(cluster, "Squeezed")] == squeezed
    for name in ("low-0", "low-1"):
        assert not cluster.api.get_pod(cluster.namespace, name)["metadata"].get("deletionTimestamp")
    # the next round reads the annotation back: the GPU is full, nothing else moves
    create(cluster, pod("low-2", "0.1", priority="low", gpu_memory="1Gi"))
    round_(s)
    assert not cluster.api.get_pod(cluster.namespace, "low-2")["spec"].get("nodeName")
    rnd, _ = s.plan()
    s.check_state(rnd)  # the kept state (squeezed pod without compute) equals a rebuild
    # the preemptor goes: the squeezed pod gets its compute back
    cluster.api.delete_pod(cluster.namespace, "vip", grace_s=0)
    round_(s)
    again = cluster.api.get_pod(cluster.namespace, squeezed[0])["metadata"].get("annotations", {})
    assert wire.SQUEEZED_BY not in again
    assert [e["involvedObject"]["name"] for e in events(cluster, "Released")] == squeezed

"""The quota rule for non-preemptible work holds for what the placement really takes
(DESIGN.md section 5): a share asked for as memory only costs more compute on a smaller GPU
than the share of the largest GPU that the admission counted."""

from __future__ import annotations

from fgpu.model.types import Request
from fgpu.sched.decide import SchedulerConfig
from fgpu.sched.workload import Place, QueueSpec, QueueTree, Resources, Wait
from tests.builders import cluster, node, pod
from tests.shell import Shell

HIGH = 100


def quota_of(milli: int) -> QueueTree:
    return QueueTree(
        [
            QueueSpec("q", quota=Resources(gpu_milli=milli)),
            QueueSpec("other", quota=Resources(gpu_milli=1000)),
        ]
    )


def five_gib(*models: str) -> Request:
    b = pod().gpu_memory("5GiB")
    return (b.models(*models) if models else b).build()


def two_sizes(big_taken: bool) -> Shell:
    """An 80 GiB and a 40 GiB GPU; with ``big_taken`` the 80 GiB one is held by work that
    cannot be a victim."""
    sh = Shell(
        cluster(node("big").gpus(1, "A100-80GB"), node("small").gpus(1, "A100-40GB")),
        quota_of(63),
        SchedulerConfig(),
    )
    if big_taken:
        sh.run("busy", "other", pod().gpu(1).build(), 0, [0], priority=HIGH)
    return sh


def test_memory_only_nonpreemptible_work_never_spends_more_than_the_quota() -> None:
    # 5 GiB is 63 milli of the 80 GiB GPU but 125 of the 40 GiB one; the quota is 63
    sh = two_sizes(big_taken=True)
    sh.submit("vip", "q", five_gib(), priority=HIGH)
    [action] = sh.round().actions
    assert isinstance(action, Wait)
    assert action.reason == (
        "non-preemptible work must stay within the quota of queue q (quota 0.063 GPUs, "
        "in use 0.0; the GPU free for it now would take 0.125)"
    )
    assert sh.running("q") == []


def test_it_runs_where_the_gpu_it_gets_keeps_it_within_the_quota() -> None:
    sh = two_sizes(big_taken=False)
    sh.submit("vip", "q", five_gib(), priority=HIGH)
    [action] = sh.round().actions
    assert isinstance(action, Place)
    assert action.allocation.node_name == "big"
    assert action.allocation.gpu_milli == (63,)

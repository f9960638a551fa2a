"""Rule 11 of fgpu.sched.decide, where a suspended workload comes back: onto the GPUs its
device memory was checkpointed from (``Workload.suspended_gpus``), because the CUDA driver
restores a checkpoint there (r570-r580); onto any GPU of its node only where the node's
driver can restore onto other GPUs of the same model (``Node.restore_other_gpus``, CUDA
13). Scenarios: cluster, running and pending work -> the exact actions."""

from __future__ import annotations

import pytest

from fgpu.model.types import InvalidRequestError, Request
from fgpu.sched.decide import SchedulerConfig
from fgpu.sched.workload import (
    Place,
    QueueSpec,
    QueueTree,
    Resources,
    Restore,
    Suspend,
    Wait,
    Workload,
)
from tests.builders import cluster, node, pod
from tests.shell import Shell

LOW, NORMAL, HIGH = 40, 50, 100


def whole() -> Request:
    return pod().gpu(1).memory("8GiB").build()


def summary(sh: Shell) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for a in sh.round().actions:
        if isinstance(a, Place):
            out.append(("place", a.workload, str(a.allocation.gpus)))
        elif isinstance(a, Restore):
            out.append(("restore", a.workload, str(a.allocation.gpus)))
        elif isinstance(a, Suspend):
            out.append(("suspend", a.victim, a.preemptor))
        elif isinstance(a, Wait):
            out.append(("wait", a.workload, a.reason))
    return out


def suspended_from_gpu_1(other_gpus: bool) -> Shell:
    """n1 with 2 GPUs: a non-preemptible job on GPU 0, a low suspendable one on GPU 1; a
    normal job suspends the low one and takes GPU 1."""
    n1 = node("n1").gpus(2).suspend_pool("256GiB")
    sh = Shell(
        cluster(n1.restore_other_gpus() if other_gpus else n1),
        QueueTree([QueueSpec("q", quota=Resources(gpu_milli=8000))]),
        SchedulerConfig(preempt_delay_s=0.0),
    )
    sh.run("steady", "q", whole(), 0, [0], priority=HIGH)
    sh.run("low", "q", whole(), 0, [1], priority=LOW, suspendable=True)
    sh.submit("new", "q", whole(), priority=NORMAL, at=1.0)
    assert [a[:2] for a in summary(sh)] == [("suspend", "low"), ("wait", "new")]
    assert summary(sh)[0] == ("place", "new", "(1,)")
    assert sh.suspended() == {"low": "n1"}
    assert sh.workloads["low"].suspended_gpus == (1,)
    return sh


def test_a_free_gpu_other_than_its_own_is_not_where_it_comes_back() -> None:
    sh = suspended_from_gpu_1(other_gpus=False)
    sh.finish("steady")  # GPU 0 frees; low's memory came from GPU 1, which new holds
    sh.submit("later-low", "q", whole(), priority=LOW, at=2.0)
    actions = summary(sh)
    assert ("place", "later-low", "(0,)") in actions
    (low_wait,) = [a for a in actions if a[:2] == ("wait", "low")]
    assert (
        "restores when that node has room on GPUs 1, the ones it was checkpointed from"
        in (low_wait[2])
    )
    assert sh.suspended() == {"low": "n1"}
    # its own GPU frees: restored there, at once
    sh.finish("new")
    assert summary(sh) == [("restore", "low", "(1,)")]
    assert sh.suspended() == {}
    assert sh.workloads["low"].suspended_gpus == ()


def test_a_node_whose_driver_restores_onto_other_gpus_takes_it_back_on_any() -> None:
    sh = suspended_from_gpu_1(other_gpus=True)
    sh.finish("steady")
    assert summary(sh) == [("restore", "low", "(0,)")]
    assert sh.suspended() == {}


def test_its_own_gpus_on_a_reserved_node_wait_for_the_reservation() -> None:
    n1 = node("n1").gpus(2).suspend_pool("256GiB")
    sh = Shell(
        cluster(n1),
        QueueTree([QueueSpec("q", quota=Resources(gpu_milli=8000))]),
        SchedulerConfig(preempt_delay_s=0.0, reservation_after_s=10.0, reservation_min_gpus=2),
    )
    sh.run("steady", "q", whole(), 0, [0], priority=HIGH)
    sh.run("low", "q", whole(), 0, [1], priority=LOW, suspendable=True)
    sh.submit("new", "q", whole(), priority=NORMAL, at=1.0)
    sh.round()
    sh.round()
    sh.finish("new")  # GPU 1 frees, but a two-GPU job has reserved n1 to drain into
    sh.submit("pair", "q", pod().gpus(2).memory("8GiB").build(), priority=HIGH, at=0.0)
    sh.now = 20.0
    actions = summary(sh)
    (low_wait,) = [a for a in actions if a[:2] == ("wait", "low")]
    assert "the node is reserved for other work now" in low_wait[2]
    assert sh.suspended() == {"low": "n1"}


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"suspended_gpus": (1,)}, "suspended_gpus"),  # not suspended
        ({"suspended_on": "n1", "suspended_gpus": (0, 1)}, "suspended_gpus"),  # 2 for 1 GPU
        ({"suspended_on": "n1", "suspended_gpus": (-1,)}, "suspended_gpus"),
    ],
)
def test_suspended_gpus_must_name_its_gpus_on_its_node(fields: dict[str, object], why: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Workload("w", "q", whole(), **fields)  # type: ignore[arg-type]
    assert caught.value.field == why
    assert "must be 1 distinct GPU indices" in caught.value.reason

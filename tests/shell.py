"""A minimal test shell around the decision core: it executes actions the way the service
and the replay simulator do (Place binds; Preempt marks the victim terminating, and the
victim exits at the start of the next round and returns to pending; Suspend marks the
victim terminating and charges its node's suspend budget, and at the start of the next
round the victim releases its allocation and waits suspended; Restore binds again and frees
the budget).

The default configuration preempts at once (``preempt_delay_s=0``): the scenarios written
before the wait before evict (issue 28) are about whom preemption picks, not when; the
wait has its own scenarios (``tests/scenario/test_preemption_keeps_work.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from fgpu.model.types import Request
from fgpu.plugins import create_policy
from fgpu.sched.decide import Decision, Scheduler, SchedulerConfig
from fgpu.sched.frag import TargetWorkload, TaskType
from fgpu.sched.squeeze import check_squeeze_invariants, execute_squeeze, held_allocation
from fgpu.sched.state import ClusterState, check_invariants
from fgpu.sched.workload import (
    Hold,
    Place,
    Preempt,
    QueueTree,
    Restore,
    Squeeze,
    Suspend,
    Unsqueeze,
    Wait,
    Workload,
)

TARGET = TargetWorkload((TaskType(0, 500, 1, "", 1), TaskType(0, 1000, 1, "", 1)))


@dataclass
class Shell:
    state: ClusterState
    queues: QueueTree
    config: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(preempt_delay_s=0.0))
    policy: str = "best-fit"
    workloads: dict[str, Workload] = field(default_factory=dict)
    holds: dict[str, Hold] = field(default_factory=dict)
    now: float = 0.0
    log: list[Decision] = field(default_factory=list)
    suspending: dict[str, int] = field(default_factory=dict)
    """id -> host MiB of a victim told to suspend (it finishes at the next round)."""

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(
            create_policy(self.policy, target=TARGET, rng=np.random.default_rng(0)), self.config
        )

    def submit(
        self,
        id_: str,
        queue: str,
        request: Request,
        priority: int = 50,
        at: float | None = None,
        preemptible: bool | None = None,
        nodes: frozenset[str] | None = None,
        suspendable: bool = False,
    ) -> None:
        self.workloads[id_] = Workload(
            id_,
            queue,
            request,
            priority,
            self.now if at is None else at,
            preemptible,
            nodes=nodes,
            suspendable=suspendable,
        )

    def run(
        self,
        id_: str,
        queue: str,
        request: Request,
        node: int,
        gpus: list[int],
        priority: int = 50,
        started: float = 0.0,
        preemptible: bool | None = None,
        suspendable: bool = False,
    ) -> None:
        """A workload already running at a given spot."""
        allocation = self.state.allocate(request, node, gpus)
        self.workloads[id_] = Workload(
            id_,
            queue,
            request,
            priority,
            started,
            preemptible,
            allocation,
            started,
            suspendable=suspendable,
        )

    def finish(self, id_: str) -> None:
        w = self.workloads.pop(id_)
        if w.allocation is not None:
            self.state.release(held_allocation(w))

    def round(self) -> Decision:
        for w in list(self.workloads.values()):  # victims told last round exit now
            if w.terminating and w.allocation is not None:
                self.state.release(held_allocation(w))
                host = self.suspending.pop(w.id, None)
                self.workloads[w.id] = replace(
                    w,
                    allocation=None,
                    started_at=None,
                    terminating=False,
                    squeezed=False,
                    squeezed_by=(),
                    suspended_on=None if host is None else w.allocation.node_name,
                    suspended_host_mib=host or 0,
                )
        decision = self.scheduler.decide(
            self.now, self.state, self.queues, list(self.workloads.values()), self.holds
        )
        for action in decision.actions:
            if isinstance(action, Place):
                w = self.workloads[action.workload]
                a = action.allocation
                allocation = self.state.allocate(w.request, a.node, a.gpus)
                assert allocation == a
                self.workloads[w.id] = replace(w, allocation=allocation, started_at=self.now)
            elif isinstance(action, Squeeze | Unsqueeze):
                w = self.workloads[action.workload]
                self.workloads[w.id] = execute_squeeze(self.state, w, action)
            elif isinstance(action, Preempt | Suspend):
                v = self.workloads[action.victim]
                assert v.allocation is not None
                assert not v.terminating
                self.workloads[v.id] = replace(v, terminating=True)
                if isinstance(action, Suspend):
                    assert v.suspendable
                    self.state.hold_suspended(v.allocation.node, action.host_memory_mib)
                    self.suspending[v.id] = action.host_memory_mib
            elif isinstance(action, Restore):
                w = self.workloads[action.workload]
                assert w.suspended_on == action.allocation.node_name
                a = action.allocation
                allocation = self.state.allocate(w.request, a.node, a.gpus)
                assert allocation == a
                self.state.free_suspended(a.node, w.suspended_host_mib)
                self.workloads[w.id] = replace(
                    w,
                    allocation=allocation,
                    started_at=self.now,
                    suspended_on=None,
                    suspended_host_mib=0,
                    suspended_gpus=(),
                )
        self.holds = dict(decision.holds)
        check_invariants(self.state)
        check_squeeze_invariants(self.state, list(self.workloads.values()))
        self.check_suspend_budget()
        self.check_reasons(decision)
        self.log.append(decision)
        return decision

    def check_reasons(self, decision: Decision) -> None:
        placed = {a.workload for a in decision.actions if isinstance(a, Place | Restore)}
        waiting = {a.workload: a.reason for a in decision.actions if isinstance(a, Wait)}
        for w in self.workloads.values():
            if w.allocation is None and w.id not in placed:
                assert waiting.get(w.id), f"pending {w.id} has no reason"

    def running(self, queue: str | None = None) -> list[str]:
        return sorted(
            w.id
            for w in self.workloads.values()
            if w.allocation is not None
            and not w.terminating
            and (queue is None or w.queue == queue)
        )

    def gpu_milli(self, queue: str) -> int:
        return sum(
            sum(w.allocation.gpu_milli)
            for w in self.workloads.values()
            if w.allocation is not None and not w.terminating and w.queue == queue
        )

    def squeezed(self) -> dict[str, tuple[str, ...]]:
        """Squeezed workloads -> who squeezed them."""
        return {w.id: w.squeezed_by for w in self.workloads.values() if w.squeezed}

    def evictions(self) -> int:
        return sum(isinstance(a, Preempt) for d in self.log for a in d.actions)

    def suspended(self) -> dict[str, str]:
        """Suspended workloads -> the node they wait on."""
        return {w.id: w.suspended_on for w in self.workloads.values() if w.suspended_on is not None}

    def check_suspend_budget(self) -> None:
        """The state's suspend budget equals what suspended (and suspending) work holds."""
        expected = self.state.suspend_capacity.copy()
        for w in self.workloads.values():
            if w.suspended_on is not None:
                expected[self.state.node_index[w.suspended_on]] -= w.suspended_host_mib
        for wid, mib in self.suspending.items():
            a = self.workloads[wid].allocation
            assert a is not None
            expected[a.node] -= mib
        assert (expected == self.state.suspend_free).all(), (expected, self.state.suspend_free)

"""Hypothesis state machine for squeeze before evict (issue 17): submit, finish, cancel,
busy/idle and scheduling rounds. After every step:

- the cluster state is what the running workloads hold (rebuilt from them, squeezed ones
  without compute) and within capacity (``check_invariants``);
- per GPU, compute of workloads that are not squeezed <= 1000 milli, memory of all <= the
  GPU's (``check_squeeze_invariants``); a squeezed workload is running, single-GPU, and
  names who squeezed it;
- the node's governor (its pure planner) never lets a squeezed workload run while one of
  the workloads that squeezed it is busy;
- nothing is evicted by a squeeze: a Preempt only comes when no squeeze was possible.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fgpu.agent.governor.plan import (
    GpuPolicy,
    NodeState,
    PlannerConfig,
    RunState,
    WorkloadState,
    plan,
)
from fgpu.model.catalog import gpu_model
from fgpu.model.types import Node, Request
from fgpu.sched.decide import SchedulerConfig
from fgpu.sched.rounds import state_with
from fgpu.sched.squeeze import check_squeeze_invariants
from fgpu.sched.state import ClusterState, check_invariants
from fgpu.sched.workload import Preempt, QueueSpec, QueueTree, Resources, Squeeze
from tests.shell import Shell

GIB = 1024
SEEN: Counter[str] = Counter()
requests = st.sampled_from(
    [
        Request(1000, 1024, 1, 250, 10 * GIB),
        Request(1000, 1024, 1, 500, 16 * GIB),
        Request(1000, 1024, 1, 300, 20 * GIB),
        Request(1000, 1024, 1, 500),  # memory in proportion: 40 GiB
        Request(1000, 1024, 1, 1000),
        Request(1000, 1024, 2, 500, 8 * GIB),
    ]
)
priorities = st.sampled_from([25, 40, 50, 100, 125])


class SqueezeMachine(RuleBasedStateMachine):
    @initialize(gpus=st.lists(st.integers(1, 2), min_size=1, max_size=2), two=st.booleans())
    def build(self, gpus: list[int], two: bool) -> None:
        mem = gpu_model("A100-80GB").memory_mib
        self.nodes = [
            Node(f"n{i}", 64_000, 256 * GIB, g, "A100-80GB", mem) for i, g in enumerate(gpus)
        ]
        names = ("a", "b") if two else ("a",)
        self.queues = names
        tree = QueueTree(QueueSpec(q, quota=Resources(4000)) for q in names)
        self.shell = Shell(ClusterState(self.nodes), tree, SchedulerConfig())
        self.busy: set[str] = set()
        self.count = 0

    @rule(
        batch=st.lists(st.tuples(st.integers(0, 1), requests, priorities), min_size=1, max_size=3)
    )
    def submit(self, batch: list[tuple[int, Request, int]]) -> None:
        for queue, request, priority in batch:
            q = self.queues[queue % len(self.queues)]
            self.shell.submit(f"w{self.count}", q, request, priority)
            self.busy.add(f"w{self.count}")
            self.count += 1
        self.schedule()

    @rule()
    def schedule(self) -> None:
        sh = self.shell
        decision = sh.round()
        squeezed_now = {a.workload for a in decision.actions if isinstance(a, Squeeze)}
        evicted_now = {a.victim for a in decision.actions if isinstance(a, Preempt)}
        assert not squeezed_now & evicted_now, "squeezed and evicted in one round"
        SEEN["squeeze"] += len(squeezed_now)
        SEEN["evict"] += len(evicted_now)
        sh.now += 10.0

    def _running(self) -> list[str]:
        return self.shell.running()

    @precondition(lambda self: hasattr(self, "shell") and bool(self.shell.running()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self.shell.finish(data.draw(st.sampled_from(self.shell.running())))

    @precondition(lambda self: hasattr(self, "shell") and bool(self.shell.workloads))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        wid = data.draw(st.sampled_from(sorted(self.shell.workloads)))
        self.shell.finish(wid)  # running or pending: it is gone

    @precondition(lambda self: hasattr(self, "shell") and bool(self.shell.workloads))
    @rule(data=st.data())
    def toggle_busy(self, data: st.DataObject) -> None:
        wid = data.draw(st.sampled_from(sorted(self.shell.workloads)))
        self.busy ^= {wid}

    @invariant()
    def state_is_the_ledger(self) -> None:
        if not hasattr(self, "shell"):
            return
        sh = self.shell
        workloads = list(sh.workloads.values())
        check_invariants(sh.state)
        check_squeeze_invariants(sh.state, workloads)
        rebuilt = state_with(self.nodes, workloads, lambda w, e: (_ for _ in ()).throw(e))
        for name in ("cpu_free", "memory_free", "gpu_free_milli", "gpu_free_memory"):
            assert np.array_equal(getattr(rebuilt, name), getattr(sh.state, name)), name
        for w in workloads:
            if w.squeezed:
                assert w.id not in w.squeezed_by

    @invariant()
    def governor_pauses_squeezed_work_while_a_squeezer_is_busy(self) -> None:
        if not hasattr(self, "shell"):
            return
        running = [w for w in self.shell.workloads.values() if w.allocation is not None]
        if not running:
            return
        states = [
            WorkloadState(
                workload_id=w.id,
                shares={
                    f"{w.allocation.node_name}/{g}": m
                    for g, m in zip(w.allocation.gpus, w.allocation.gpu_milli, strict=True)
                },
                priority=w.priority,
                busy=w.id in self.busy,
            )
            for w in running
            if w.allocation is not None
        ]
        gpus = {uuid: GpuPolicy() for s in states for uuid in s.shares}
        decided = plan(
            0, NodeState(config=PlannerConfig(), gpus=gpus, workloads=states, period_start_ns=0)
        )
        by_id = {w.id: w for w in running}
        for w in running:
            if w.squeezed and any(b in self.busy and b in by_id for b in w.squeezed_by):
                assert decided.states[w.id] is RunState.FROZEN_BY_PRIORITY, w.id


TestSqueezeMachine = SqueezeMachine.TestCase
TestSqueezeMachine.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_machine_squeezes_at_all() -> None:
    # the machine is only worth its steps if squeezes happen: one fixed run that must squeeze
    sh = Shell(
        ClusterState([Node("n0", 64_000, 256 * GIB, 1, "A100-80GB", 81_920)]),
        QueueTree([QueueSpec("a", quota=Resources(4000))]),
    )
    sh.submit("low", "a", Request(1000, 1024, 1, 500, 16 * GIB), 40)
    sh.submit("low2", "a", Request(1000, 1024, 1, 500, 16 * GIB), 40)
    sh.round()
    sh.submit("crit", "a", Request(1000, 1024, 1, 500, 16 * GIB), 125)
    sh.round()
    assert list(sh.squeezed().values()) == [("crit",)]


def test_the_machine_saw_squeezes_and_evictions() -> None:
    # run after the machine (file order): both paths were exercised
    if not SEEN:
        TestSqueezeMachine().runTest()
    assert SEEN["squeeze"] > 0, SEEN
    assert SEEN["evict"] > 0, SEEN

"""Hypothesis state machine over the decision core: submit, finish, cancel, queue change,
node added or removed, and scheduling rounds. After every step:

- no GPU, CPU or memory is over-allocated (``check_invariants``);
- no Preempt ever names a non-preemptible victim, and a reclaim never takes a victim queue
  below its guarantee min(quota, demand);
- sibling fair shares add up to at most their parent's (the cluster's) capacity;
- every pending workload that was not placed has a reason;
- (issue 28) a Suspend names only a suspendable, preemptible victim, a Restore only a
  suspended workload on its own node, and every node's suspend budget equals what its
  suspended and suspending work holds (``Shell.check_suspend_budget``), through cancels of
  suspended work and nodes that come and go.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fgpu.model.catalog import gpu_model
from fgpu.model.types import Node, Request
from fgpu.sched.decide import SchedulerConfig, allocation_resources
from fgpu.sched.state import ClusterState
from fgpu.sched.workload import (
    Place,
    Preempt,
    QueueSpec,
    QueueTree,
    Resources,
    Restore,
    Suspend,
)
from tests.shell import Shell

QUEUES = ("a", "b", "c")

requests = st.one_of(
    st.builds(
        lambda m, c: Request(c * 1000, 1024, 1, m),
        st.sampled_from([250, 500, 700]),
        st.integers(0, 4),
    ),
    st.builds(lambda k: Request(1000, 1024, k, 1000), st.integers(1, 3)),
    st.builds(lambda m: Request(1000, 1024, 2, m), st.sampled_from([300, 600])),
    st.just(Request(2000, 1024)),
)


def make_node(i: int, gpus: int, pool_mib: int = 0) -> Node:
    memory = gpu_model("A100-80GB").memory_mib
    return Node(f"n{i}", 16_000, 64 * 1024, gpus, "A100-80GB", memory, pool_mib)


# a node's budget for suspended work: none, one whole GPU's worth (80 GiB + 1 GiB host), two
POOLS = st.sampled_from([0, 81 * 1024, 200 * 1024])


class DecisionMachine(RuleBasedStateMachine):
    @initialize(
        gpus=st.lists(st.integers(1, 4), min_size=1, max_size=3),
        quotas=st.lists(st.integers(0, 3), min_size=3, max_size=3),
        weights=st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=3, max_size=3),
        policy=st.sampled_from(["best-fit", "fgd", "spread"]),
        reservation=st.booleans(),
        pool=POOLS,
        delay=st.sampled_from([0.0, 20.0]),
    )
    def build(
        self,
        gpus: list[int],
        quotas: list[int],
        weights: list[float],
        policy: str,
        reservation: bool,
        pool: int,
        delay: float,
    ) -> None:
        self.pool = pool
        self.nodes = [make_node(i, g, pool) for i, g in enumerate(gpus)]
        self.next_node = len(gpus)
        queues = QueueTree(
            QueueSpec(q, quota=Resources(quota * 1000), over_quota_weight=w, priority=i % 2)
            for i, (q, quota, w) in enumerate(zip(QUEUES, quotas, weights, strict=True))
        )
        config = SchedulerConfig(
            reservation_after_s=30.0 if reservation else None, preempt_delay_s=delay
        )
        self.shell = Shell(ClusterState(self.nodes), queues, config, policy)
        self.count = 0
        self.preemptions: Counter[str] = Counter()

    @rule(
        batch=st.lists(
            st.tuples(
                st.sampled_from(QUEUES),
                requests,
                st.sampled_from([40, 50, 90, 100, 125]),
                st.booleans(),
            ),
            min_size=1,
            max_size=4,
        )
    )
    def submit(self, batch: list[tuple[str, Request, int, bool]]) -> None:
        for queue, request, priority, suspendable in batch:
            self.shell.submit(f"w{self.count}", queue, request, priority, suspendable=suspendable)
            self.count += 1

    @rule()
    def schedule(self) -> None:
        sh = self.shell
        before = {w.id: w for w in sh.workloads.values()}
        decision = sh.round()
        for action in decision.actions:
            if isinstance(action, Preempt | Suspend):
                victim = before[action.victim]
                assert victim.is_preemptible, action
                self.preemptions[action.kind] += 1
            if isinstance(action, Suspend):
                assert before[action.victim].suspendable, action
            if isinstance(action, Restore):  # the shell checked it was suspended there
                restored = sh.workloads[action.workload]
                assert restored.suspended_on is None, action
                assert restored.allocation == action.allocation, action
        # a reclaim never takes a victim queue below its guarantee min(quota, demand),
        # counting what the queue holds after the round (its placements included)
        share = decision.fair_share
        placed: Counter[str] = Counter()
        lost: Counter[str] = Counter()
        for action in decision.actions:
            if isinstance(action, Place):
                placed[before[action.workload].queue] += sum(action.allocation.gpu_milli)
            elif isinstance(action, Preempt | Suspend) and action.kind == "reclaim":
                victim = before[action.victim]
                assert victim.allocation is not None
                lost[victim.queue] += sum(victim.allocation.gpu_milli)
        for q, amount in lost.items():
            held = decision.allocated.get(q, Resources()).gpu_milli
            demand = held + sum(
                w.request.total_gpu_milli
                for w in before.values()
                if w.queue == q and w.allocation is None
            )
            guarantee = min(sh.queues[q].quota.gpu_milli, demand)
            assert held + placed[q] - amount >= guarantee, (q, held, placed[q], amount)
        total = sum(share[q].gpu_milli for q in QUEUES)
        assert total <= sh.state.gpu_capacity_milli
        sh.now += 10.0

    @precondition(
        lambda self: (
            hasattr(self, "shell")
            and any(
                w.allocation is not None and not w.terminating
                for w in self.shell.workloads.values()
            )
        )
    )
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        running = self.shell.running()
        self.shell.finish(data.draw(st.sampled_from(running)))

    @precondition(
        lambda self: (
            hasattr(self, "shell")
            and any(w.allocation is None for w in self.shell.workloads.values())
        )
    )
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        pending = sorted(w.id for w in self.shell.workloads.values() if w.allocation is None)
        wid = data.draw(st.sampled_from(pending))
        gone = self.shell.workloads.pop(wid)
        self.shell.holds.pop(wid, None)
        if gone.suspended_on is not None:  # a suspended workload cancelled is simply ended
            state = self.shell.state
            state.free_suspended(state.node_index[gone.suspended_on], gone.suspended_host_mib)

    @rule(
        queue=st.sampled_from(QUEUES), quota=st.integers(0, 4), weight=st.sampled_from([0.0, 1.0])
    )
    def change_queue(self, queue: str, quota: int, weight: float) -> None:
        sh = self.shell
        old = sh.queues
        sh.queues = old.with_queue(
            replace(old[queue], quota=Resources(quota * 1000), over_quota_weight=weight)
        )
        assert old[queue].quota.gpu_milli in range(0, 5000)  # the old tree is unchanged

    @precondition(lambda self: hasattr(self, "shell") and len(self.nodes) < 4)
    @rule(gpus=st.integers(1, 4))
    def add_node(self, gpus: int) -> None:
        self.nodes.append(make_node(self.next_node, gpus, self.pool))
        self.next_node += 1
        self._rebuild()

    @precondition(lambda self: hasattr(self, "shell") and len(self.nodes) > 1)
    @rule(data=st.data())
    def remove_node(self, data: st.DataObject) -> None:
        gone = data.draw(st.sampled_from([n.name for n in self.nodes]))
        self.nodes = [n for n in self.nodes if n.name != gone]
        self._rebuild()

    def _rebuild(self) -> None:
        """New cluster state; work on surviving nodes keeps its GPUs, the rest is pending."""
        sh = self.shell
        old = sh.state
        state = ClusterState(self.nodes)
        for w in list(sh.workloads.values()):
            if w.suspended_on is not None:  # its node's budget keeps it, or it is lost
                if w.suspended_on in state.node_index:
                    state.hold_suspended(state.node_index[w.suspended_on], w.suspended_host_mib)
                else:
                    sh.workloads[w.id] = replace(
                        w, suspended_on=None, suspended_host_mib=0, suspended_gpus=()
                    )
            if w.allocation is None:
                continue
            name = old.node_names[w.allocation.node]
            if name in state.node_index:
                alloc = state.allocate(w.request, state.node_index[name], w.allocation.gpus)
                sh.workloads[w.id] = replace(w, allocation=alloc)
                if w.id in sh.suspending:
                    state.hold_suspended(alloc.node, sh.suspending[w.id])
            else:
                sh.workloads[w.id] = replace(w, allocation=None, started_at=None, terminating=False)
                sh.suspending.pop(w.id, None)
        sh.state = state
        sh.holds = {k: h for k, h in sh.holds.items() if h.node in state.node_index}

    @invariant()
    def ledger(self) -> None:
        if not hasattr(self, "shell"):
            return
        sh = self.shell
        used = sum(
            allocation_resources(w.allocation)[0]
            for w in sh.workloads.values()
            if w.allocation is not None
        )
        assert used == sh.state.gpu_allocated_milli
        sh.check_suspend_budget()


DecisionMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestDecisionMachine = DecisionMachine.TestCase

"""Hypothesis: random place/release sequences keep every invariant.

After every step: no free amount is negative or above capacity; the free amounts equal the
capacities minus what the live allocations hold (the ledger); the incrementally kept
cluster fragmentation equals a from-scratch recomputation with the reference function.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from fgpu.model.catalog import gpu_model
from fgpu.model.types import Allocation, Node, Request
from fgpu.plugins import create_policy, policy_names
from fgpu.sched.frag import FragmentationMeasure, TargetWorkload, TaskType, reference_node_fragment
from fgpu.sched.placer import Placer
from fgpu.sched.state import ClusterState, check_invariants

MODELS = ("A100-80GB", "T4")
TARGET = TargetWorkload(
    (
        TaskType(2000, 500, 1, "", 3),
        TaskType(4000, 1000, 1, "", 2),
        TaskType(8000, 1000, 2, "", 1),
        TaskType(1000, 250, 1, "T4", 1),
        TaskType(4000, 0, 0, "", 1),
    )
)

nodes_strategy = st.lists(
    st.tuples(st.integers(0, 4), st.sampled_from(MODELS), st.integers(2, 32)),
    min_size=1,
    max_size=4,
)


@st.composite
def requests(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(["cpu", "share", "whole", "shares", "memory"]))
    cpu = draw(st.integers(0, 8)) * 1000
    mem = draw(st.integers(0, 64)) * 1024
    models = draw(st.sampled_from([frozenset(), frozenset({"T4"}), frozenset(MODELS)]))
    if kind == "cpu":
        return Request(cpu, mem)
    if kind == "share":
        return Request(cpu, mem, 1, draw(st.integers(1, 999)), None, models)
    if kind == "whole":
        return Request(cpu, mem, draw(st.integers(1, 3)), 1000, None, models)
    if kind == "shares":
        return Request(cpu, mem, draw(st.integers(2, 3)), draw(st.integers(1, 999)), None, models)
    return Request(cpu, mem, 1, None, draw(st.integers(1, 40)) * 1024, models)


class PlaceRelease(RuleBasedStateMachine):
    allocations = Bundle("allocations")

    @initialize(spec=nodes_strategy, policy=st.sampled_from(policy_names()), seed=st.integers(0, 9))
    def build(self, spec: list[tuple[int, str, int]], policy: str, seed: int) -> None:
        nodes = [
            Node(
                f"n{i}",
                cores * 1000,
                256 * 1024,
                gpus,
                model if gpus else None,
                gpu_model(model).memory_mib if gpus else 0,
            )
            for i, (gpus, model, cores) in enumerate(spec)
        ]
        self.state = ClusterState(nodes)
        self.placer = Placer(
            self.state, create_policy(policy, target=TARGET, rng=np.random.default_rng(seed))
        )
        self.measure = FragmentationMeasure(self.state.model_names, TARGET)
        self.node_frag = self.measure.node_fragment(
            self.state.gpu_free_milli, self.state.cpu_free, self.state.node_model
        )
        self.live: list[Allocation] = []

    def _refresh(self, node: int) -> None:
        s = self.state
        self.node_frag[node] = self.measure.node_fragment(
            s.gpu_free_milli[node], s.cpu_free[node], s.node_model[node]
        )

    @rule(target=allocations, request=requests())
    def place(self, request: Request) -> Allocation | None:
        result = self.placer.place(request)
        if not isinstance(result, Allocation):
            assert result.reason.startswith("0/")
            ok, _ = self.state.feasible(request)
            assert not ok.any()
            return None
        assert len(result.gpus) == request.gpu_count
        self.live.append(result)
        self._refresh(result.node)
        return result

    @rule(allocation=consumes(allocations))
    def release(self, allocation: Allocation | None) -> None:
        if allocation is None:
            return
        self.placer.release(allocation)
        self.live.remove(allocation)
        self._refresh(allocation.node)

    @invariant()
    def capacities_hold(self) -> None:
        if not hasattr(self, "state"):
            return
        check_invariants(self.state)

    @invariant()
    def ledger_matches(self) -> None:
        if not hasattr(self, "state"):
            return
        s = self.state
        used_milli = np.zeros_like(s.gpu_free_milli)
        used_mem = np.zeros_like(s.gpu_free_memory)
        used_cpu = np.zeros_like(s.cpu_free)
        for a in self.live:
            used_cpu[a.node] += a.cpu_milli
            for g, m, mem in zip(a.gpus, a.gpu_milli, a.gpu_memory_mib, strict=True):
                used_milli[a.node, g] += m
                used_mem[a.node, g] += mem
        assert (s.gpu_free_milli == s.gpu_milli_capacity - used_milli).all()
        assert (s.gpu_free_memory == s.gpu_memory_capacity - used_mem).all()
        assert (s.cpu_free == s.cpu_capacity - used_cpu).all()

    @invariant()
    def fragmentation_matches_reference(self) -> None:
        if not hasattr(self, "state"):
            return
        s = self.state
        for n, node in enumerate(s.nodes):
            free = s.gpu_free_milli[n, : node.gpu_count].tolist()
            expected = reference_node_fragment(free, int(s.cpu_free[n]), node.gpu_model, TARGET)
            assert self.node_frag[n] == expected


PlaceRelease.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPlaceRelease = PlaceRelease.TestCase

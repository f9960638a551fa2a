"""Prometheus series of ``fgpu k8s scheduler`` and of the node agent (:mod:`fgpu.metrics`).

The scheduler shows the fleet as its last round saw it: every fgpu node's GPUs with what is
granted on them, each running pod's shares (``workload`` is ``namespace/name``, ``user``
the namespace), the queues' quota, fair share, allocation and pending pods by reason, and
the fragmentation against the recent requests; plus rounds, preemptions and start latency.
The node agent shows its own GPUs' live figures (memory in use, utilization) and each of
its pods' share, and while enforcing their achieved share, paused time and memory in use
(the pods' processes found through their cgroups), and counts memory violations.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fgpu.agent.backend import GpuProcess, SimulatedBackend
from fgpu.agent.events import MEMORY_EXCEEDED, MEMORY_WARNING, AgentEvent
from fgpu.agent.governor.runtime import WorkloadView
from fgpu.metrics import (
    Exporter,
    FleetSample,
    GpuSample,
    QueueSample,
    WorkloadSample,
    fleet_fragmentation,
    pending_reason,
)
from fgpu.sched.decide import Decision
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.state import ClusterState
from fgpu.sched.workload import QueueTree, Wait, Workload

if TYPE_CHECKING:
    from fgpu.k8s.agent import NodeAgent, PlacedContainer
    from fgpu.k8s.objects import NodeInfo
    from fgpu.k8s.scheduler import Round


@dataclass(frozen=True, slots=True)
class _RoundSeen:
    """What a round leaves for the scrapes: references to its own (not changed after it)
    lists, its waiting and refused pods with their reasons, each queue's (name, quota,
    fair share, allocation) in milli-GPU, and a copy of its cluster state."""

    workloads: Sequence[Workload]
    pods: Mapping[str, Any]
    infos: Sequence[NodeInfo]
    waiting: Sequence[tuple[str, str | None]]
    queues: Sequence[tuple[str, int, int, int]]
    state: ClusterState
    target: TargetWorkload


class SchedulerMetrics(Exporter):
    """The scheduler's series: the last round's fleet and the event series.

    A round only keeps what it saw (:meth:`observe_round`: references, a copy of a few
    arrays, one pass over its decisions); the fleet sample is built from that at the first
    scrape after the round (every GPU and running pod, and FGD's fragmentation), so a round's
    cost does not grow with the fleet for the metrics' sake (issue 26: rebuilding the
    cluster state each round took 146 of 228 ms per round at 1,000 nodes).
    """

    def __init__(self) -> None:
        super().__init__(self.sample)
        self._lock = threading.Lock()  # the round's hand-over
        self._building = threading.Lock()  # one scrape builds at a time
        self._seen: _RoundSeen | None = None
        self._last: FleetSample = FleetSample()

    def observe_round(
        self,
        rnd: Round,
        decision: Decision,
        tree: QueueTree,
        target: TargetWorkload,
        state: ClusterState,
    ) -> None:
        """Keep what one round saw for the scrapes until the next round (called by the
        scheduler after it decided). ``state``: the round's cluster with every running pod
        applied (before the decision's placements); it is copied (its free capacity only,
        a few arrays), since the scheduler keeps changing it from round to round."""
        waits = [(a.workload, a.reason) for a in decision.actions if isinstance(a, Wait)]
        queues = [
            (
                name,
                spec.quota.gpu_milli,
                decision.fair_share[name].gpu_milli if name in decision.fair_share else 0,
                decision.allocated[name].gpu_milli if name in decision.allocated else 0,
            )
            for name, spec in tree.specs.items()
        ]
        seen = _RoundSeen(
            tuple(rnd.workloads),
            dict(rnd.pods),
            tuple(rnd.infos),
            [*waits, *rnd.refused.items()],
            queues,
            state.copy(),
            target,
        )
        with self._lock:
            self._seen = seen

    def sample(self) -> FleetSample:
        """The last round's fleet (built at the first scrape after it, then kept; scrapes
        wait for each other, never a round)."""
        with self._building:
            with self._lock:
                seen, self._seen = self._seen, None
            if seen is not None:
                self._last = _fleet(seen)
            return self._last


def _fleet(seen: _RoundSeen) -> FleetSample:
    """Every GPU with what is granted on it, each running pod's shares, the queues, and
    the fragmentation of what one round saw."""
    gpus: list[GpuSample] = []
    milli: dict[tuple[int, int], int] = {}
    memory: dict[tuple[int, int], int] = {}
    running: list[WorkloadSample] = []
    for w in seen.workloads:
        a = w.allocation
        if a is None:
            continue
        pod = seen.pods.get(w.id) or {}
        meta = pod.get("metadata") or {}
        for g, m, mm in zip(a.gpus, a.gpu_milli, a.gpu_memory_mib, strict=True):
            milli[(a.node, g)] = milli.get((a.node, g), 0) + m
            memory[(a.node, g)] = memory.get((a.node, g), 0) + mm
            running.append(
                WorkloadSample(
                    workload=w.id,
                    name=str(meta.get("name", w.id)),
                    queue=w.queue,
                    user=str(meta.get("namespace", "")),
                    node=a.node_name,
                    gpu=g,
                    compute_milli=m,
                    memory_mib=mm,
                )
            )
    for n, info in enumerate(seen.infos):
        node = info.node
        for g, uuid in enumerate(info.uuids):
            gpus.append(
                GpuSample(
                    node=node.name,
                    index=g,
                    uuid=uuid,
                    model=node.gpu_model or "",
                    memory_mib=node.gpu_memory_mib,
                    allocated_milli=milli.get((n, g), 0),
                    allocated_memory_mib=memory.get((n, g), 0),
                )
            )
    queue_of = {w.id: w.queue for w in seen.workloads}
    pending: dict[str, dict[str, int]] = {}
    for key, reason in seen.waiting:
        counts = pending.setdefault(queue_of.get(key, ""), {})
        label = pending_reason(reason)
        counts[label] = counts.get(label, 0) + 1
    queues = [
        QueueSample(name, quota, fair, allocated, pending.get(name, {}))
        for name, quota, fair, allocated in seen.queues
    ]
    return FleetSample(gpus, running, queues, fleet_fragmentation(seen.state, seen.target))


class AgentMetrics(Exporter):
    """The node agent's series: its GPUs and pods as it last reported them.

    Args:
        agent: the node agent (its devices, backend and last placed pods).
        governor_views: the governor's per-pod views, or None when not enforcing.
        pids_of: a pod's processes (``namespace/name`` -> host pids, from its cgroup),
            or None where they are not known (not enforcing: NVML's host pids cannot be
            told apart); with it each pod's memory in use is exported.
    """

    def __init__(
        self,
        agent: NodeAgent,
        governor_views: Callable[[], Sequence[WorkloadView]] | None = None,
        pids_of: Callable[[str], Sequence[int]] | None = None,
    ) -> None:
        super().__init__(self.sample)
        self._agent = agent
        self._views = governor_views
        self._pids_of = pids_of
        if isinstance(agent.backend, SimulatedBackend):
            agent.backend.estimate_utilization(self.estimated_utilization)

    def agent_event(self, event: AgentEvent) -> None:
        """Count the memory guard's findings (subscribe to the enforcer's event log)."""
        if event.kind in (MEMORY_EXCEEDED, MEMORY_WARNING):
            self.events.memory_violations.inc()

    def _governed(self) -> dict[str, WorkloadView]:
        return {v.workload_id: v for v in self._views()} if self._views is not None else {}

    def estimated_utilization(self) -> dict[str, int]:
        """Simulated GPUs' percent busy: the run time the pods received (the governor's
        achieved share) where governed, else their granted shares (assumed busy)."""
        busy = {d.uuid: 0 for d in self._agent.devices}
        governed = self._governed()
        for placed in self._agent.last_placed:
            view = governed.get(placed.workload_id)
            a = placed.assignment
            for uuid, milli in zip(a.uuids, a.gpu_milli, strict=False):
                if uuid in busy:
                    busy[uuid] += view.achieved_milli if view is not None else milli
        return {uuid: min(100, milli // 10) for uuid, milli in busy.items()}

    def sample(self) -> FleetSample:
        """This node's GPUs and placed pods now (live figures read from the backend)."""
        agent = self._agent
        placed: list[PlacedContainer] = list(agent.last_placed)
        backend = agent.backend
        used: dict[str, int] = {d.uuid: 0 for d in agent.devices}
        procs = []
        try:
            procs = backend.process_memory()
            for proc in procs:
                if proc.gpu_uuid in used:
                    used[proc.gpu_uuid] += proc.used_mib
            util = backend.utilization()
        except Exception:  # a flaky driver: the live figures are unknown this scrape
            used, util = {}, {}
        pod_used = self._pod_memory(placed, procs) if used else None
        milli: dict[str, int] = {}
        memory: dict[str, int] = {}
        governed = self._governed()
        running: list[WorkloadSample] = []
        index = {d.uuid: d.index for d in agent.devices}
        for p in placed:
            a = p.assignment
            view = governed.get(p.workload_id)
            namespace, _, name = p.workload_id.partition("/")
            for uuid, m, mm in zip(a.uuids, a.gpu_milli, a.gpu_memory_mib, strict=False):
                if uuid not in index:
                    continue
                milli[uuid] = milli.get(uuid, 0) + m
                memory[uuid] = memory.get(uuid, 0) + mm
                running.append(
                    WorkloadSample(
                        workload=p.workload_id,
                        name=name,
                        queue=a.queue,
                        user=namespace,
                        node=agent.node,
                        gpu=index[uuid],
                        compute_milli=m,
                        memory_mib=mm,
                        used_memory_mib=(
                            pod_used.get((p.workload_id, uuid), 0) if pod_used is not None else None
                        ),
                        achieved_milli=view.achieved_milli if view else None,
                        paused_s=(
                            {"share": view.paused_ns[0] / 1e9, "priority": view.paused_ns[1] / 1e9}
                            if view
                            else {}
                        ),
                        paused=view is not None and view.state == "frozen-by-priority",
                    )
                )
        gpus = [
            GpuSample(
                node=agent.node,
                index=d.index,
                uuid=d.uuid,
                model=d.model,
                memory_mib=d.memory_mib,
                allocated_milli=milli.get(d.uuid, 0),
                allocated_memory_mib=memory.get(d.uuid, 0),
                used_memory_mib=used.get(d.uuid),
                utilization_pct=util.get(d.uuid),
            )
            for d in agent.devices
        ]
        return FleetSample(gpus, running, ())

    def _pod_memory(
        self, placed: Sequence[PlacedContainer], procs: Sequence[GpuProcess]
    ) -> dict[tuple[str, str], int] | None:
        """(pod, GPU uuid) -> MiB its processes hold there; None without ``pids_of``."""
        if self._pids_of is None:
            return None
        owner = {pid: p.workload_id for p in placed for pid in self._pids_of(p.workload_id)}
        found: dict[tuple[str, str], int] = {}
        for proc in procs:
            pod = owner.get(proc.pid)
            if pod is not None:
                key = (pod, proc.gpu_uuid)
                found[key] = found.get(key, 0) + proc.used_mib
        return found

"""Fluent builders for tests: ``node("n1").gpus(4, "A100-80GB")``, ``pod().gpu(0.5)``."""

from __future__ import annotations

from fgpu import states
from fgpu.model.catalog import canonical_name, gpu_model
from fgpu.model.types import Node, Request
from fgpu.model.units import parse_gpu_request, parse_memory_mib
from fgpu.sched.state import ClusterState
from fgpu.wire import GpuGrant, ResourceRequest, WorkloadView


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._cpu = 64_000
        self._memory = 512 * 1024
        self._count = 0
        self._model: str | None = None
        self._suspend = 0
        self._restore_other = False

    def gpus(self, count: int, model: str = "A100-80GB") -> NodeBuilder:
        self._count = count
        self._model = canonical_name(model)
        return self

    def cpu(self, cores: float) -> NodeBuilder:
        self._cpu = int(cores * 1000)
        return self

    def memory(self, size: str) -> NodeBuilder:
        self._memory = parse_memory_mib(size)
        return self

    def suspend_pool(self, size: str) -> NodeBuilder:
        """Host memory set aside for suspended work (``Node.suspend_host_memory_mib``)."""
        self._suspend = parse_memory_mib(size)
        return self

    def restore_other_gpus(self) -> NodeBuilder:
        """Its driver restores checkpoints onto other GPUs (``Node.restore_other_gpus``)."""
        self._restore_other = True
        return self

    def build(self) -> Node:
        mem = gpu_model(self._model).memory_mib if self._model else 0
        return Node(
            self._name,
            self._cpu,
            self._memory,
            self._count,
            self._model,
            mem,
            self._suspend,
            self._restore_other,
        )


class PodBuilder:
    def __init__(self) -> None:
        self._cpu = 0
        self._memory = 0
        self._count = 0
        self._milli: int | None = None
        self._gpu_memory: int | None = None
        self._models: frozenset[str] = frozenset()

    def gpu(self, value: float | str) -> PodBuilder:
        self._count, self._milli = parse_gpu_request(value)
        return self

    def gpus(self, count: int, fraction: float = 1.0) -> PodBuilder:
        self._count = count
        self._milli = round(fraction * 1000)
        return self

    def gpu_memory(self, size: str) -> PodBuilder:
        self._gpu_memory = parse_memory_mib(size)
        if self._count == 0:
            self._count = 1
        return self

    def cpu(self, cores: float) -> PodBuilder:
        self._cpu = int(cores * 1000)
        return self

    def memory(self, size: str) -> PodBuilder:
        self._memory = parse_memory_mib(size)
        return self

    def models(self, *names: str) -> PodBuilder:
        self._models = frozenset(canonical_name(n) for n in names)
        return self

    def build(self) -> Request:
        return Request(
            self._cpu, self._memory, self._count, self._milli, self._gpu_memory, self._models
        )


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def pod() -> PodBuilder:
    return PodBuilder()


def cluster(*nodes: NodeBuilder) -> ClusterState:
    return ClusterState([n.build() for n in nodes])


def workload_view(**fields: object) -> WorkloadView:
    """A running half-GPU workload as the API lists it, with ``fields`` replaced; its
    ``state`` and ``state_text`` as the service derives them (:mod:`fgpu.states`) unless
    given."""
    base: dict[str, object] = {
        "id": "237094bf",
        "name": "fgpu-test-bob",
        "owner_uid": 0,
        "phase": "running",
        "queue": "default",
        "priority": 50,
        "preemptible": True,
        "request": ResourceRequest(
            gpu_count=1,
            gpu_milli=500,
            gpu_memory_mib=None,
            gpu_models=[],
            cpu_milli=0,
            memory_mib=0,
        ),
        "gpus": [GpuGrant(node="vm", index=0, uuid="u", compute_milli=500, memory_mib=20480)],
        "command": ["x"],
        "submitted_at": 0.0,
        "started_at": 0.0,
        "finished_at": None,
        "exit_code": None,
        "reason": "",
        "restarts": 0,
    }
    view = WorkloadView.model_validate({**base, **fields})
    if "state" in fields:
        return view
    state = states.workload_state(
        phase=view.phase,
        stopping=view.stopping,
        squeezed=view.squeezed,
        suspended=view.suspended_host_mib is not None,
        gpu_state=view.gpu_state,
        preempted_kind=None,
    )
    text = states.state_text(
        state,
        restarts=view.restarts,
        squeezed_by=view.squeezed_by,
        suspended_host_mib=view.suspended_host_mib,
    )
    return view.model_copy(update={"state": state, "state_text": text})

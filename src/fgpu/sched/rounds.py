"""Pieces every online shell's scheduling round shares (``fgpu serve`` and the Kubernetes
scheduler): the cluster state built from running workloads, and FGD's target workload
learned from recent submissions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fgpu.model.types import Allocation, InvalidRequestError, Node, Request
from fgpu.sched.frag import TargetWorkload, TaskType
from fgpu.sched.squeeze import held_allocation
from fgpu.sched.state import ClusterState
from fgpu.sched.workload import Workload

TARGET_WINDOW = 1000
"""FGD's target workload is learned from this many most recent submissions."""

FALLBACK_TARGET = TargetWorkload(
    (TaskType(0, 250, 1, "", 1), TaskType(0, 500, 1, "", 1), TaskType(0, 1000, 1, "", 1))
)
"""Target workload before anything was submitted: quarter, half and whole GPUs."""


def state_with(
    nodes: Sequence[Node],
    workloads: Sequence[Workload],
    on_error: Callable[[Workload, InvalidRequestError], None],
) -> ClusterState:
    """The cluster with every running workload's allocation applied (terminating ones too);
    a squeezed workload holds its CPU and memory but no compute.

    A workload whose allocation does not fit the nodes (they changed under it) is passed to
    ``on_error`` and left out; the round goes on.
    """
    state = ClusterState(nodes)
    for w in workloads:
        if w.allocation is not None:
            try:
                apply_running(state, w)
            except InvalidRequestError as exc:
                on_error(w, exc)
    return state


def apply_running(state: ClusterState, w: Workload) -> Allocation:
    """Apply running ``w`` to ``state`` and return what it holds there: its allocation
    (checked against its request), or, when it is squeezed, its CPU and memory without
    compute (:func:`fgpu.sched.squeeze.held_allocation`).

    Raises:
        InvalidRequestError: it does not fit; nothing changes then.
    """
    assert w.allocation is not None
    if w.squeezed:
        held = held_allocation(w)
        state.occupy(held)
        return held
    return state.allocate(w.request, w.allocation.node, w.allocation.gpus)


def target_key(workloads: Sequence[Workload], window: int = TARGET_WINDOW) -> tuple[Request, ...]:
    """The requests with explicit shares among the ``window`` most recent submissions."""
    recent = sorted(workloads, key=lambda w: w.submitted_at)[-window:]
    return tuple(w.request for w in recent if w.request.gpu_milli is not None)


def target_for(requests: tuple[Request, ...]) -> TargetWorkload:
    """FGD's target workload for :func:`target_key`'s requests (the fallback when none)."""
    return TargetWorkload.from_requests(requests) if requests else FALLBACK_TARGET

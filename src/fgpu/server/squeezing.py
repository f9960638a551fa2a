"""The service's side of squeeze before evict (:mod:`fgpu.sched.squeeze`).

The decision core says who is squeezed (:class:`~fgpu.sched.workload.Squeeze`) and who gets
its compute back (:class:`~fgpu.sched.workload.Unsqueeze`); the service records it (the
workload's ``squeezed_by`` and an event ``squeezed`` or ``released``) before anything else
of the round acts. Nothing is signalled: a squeezed workload keeps its process and memory,
and the node's governor pauses it while a higher-priority workload on its GPU is busy (its
``priority`` rule; ``compress`` holds it to the floor share instead) and lets it run when
that workload idles, as for any lower-priority neighbour.
"""

from __future__ import annotations

from typing import Protocol

from fgpu.sched.workload import Squeeze, Unsqueeze
from fgpu.store.records import WorkloadRecord


class SqueezeWriter(Protocol):
    """The store method the service calls (through its mirror-tracking wrapper)."""

    def mark_squeezed(
        self, workload_id: str, by: tuple[str, ...] | None, reason: str
    ) -> WorkloadRecord: ...


def record_squeeze(store: SqueezeWriter, action: Squeeze | Unsqueeze) -> WorkloadRecord:
    """Write ``action``: ``squeezed_by`` set (Squeeze) or cleared (Unsqueeze), with its event.

    Raises:
        NotFound, StoreConflict: the workload is unknown or no longer holds its allocation.
    """
    if isinstance(action, Squeeze):
        return store.mark_squeezed(action.workload, action.by, action.reason)
    return store.mark_squeezed(action.workload, None, action.reason)

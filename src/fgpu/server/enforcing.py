"""The service's side of enforcement: hands the running shared-GPU workloads to
:class:`fgpu.server.enforcement.Enforcement` (governor, memory guard) and carries out its
``kill`` (a workload over its memory quota)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

from fgpu.agent.events import AgentEvent
from fgpu.agent.launcher import Launcher
from fgpu.agent.process import ProcessHandle
from fgpu.sched.accounting import counted_gpu_milli
from fgpu.sched.borrowing import Holding, borrowed
from fgpu.server.enforcement import Enforcement, Running
from fgpu.store import Store

log = logging.getLogger("fgpu.server")


class EnforcementHooks:
    """Part of :class:`fgpu.server.service.Service`: what it tells the enforcement layer and
    what that layer asks of it (attributes set by :class:`fgpu.server.core.ServiceCore`)."""

    store: Store
    launcher: Launcher
    enforcement: Enforcement
    _handles: dict[str, ProcessHandle]
    _terminating: set[str]
    _fail_reasons: dict[str, str]

    def _listed(self, text: str) -> str:  # ServiceCore's
        raise NotImplementedError

    def _lister(self) -> Callable[[str], str]:  # ServiceCore's
        raise NotImplementedError

    def _enforce(self) -> None:
        """Hand the governor and the memory guard the running shared-GPU workloads, each
        marked ``borrowed`` when it runs beyond its queue's quota (:mod:`fgpu.sched.borrowing`,
        counted over all of the queue's running work, MIG and other nodes included)."""
        records = self.store.list_workloads(("running", "paused"))
        quotas = {q.name: q.config.quota.gpu_milli for q in self.store.list_queues()}
        lent = borrowed(
            (
                Holding(
                    workload_id=r.id,
                    queue=r.queue,
                    gpu_milli=counted_gpu_milli(r.allocation.gpu_milli, r.squeezed_by is not None),
                    priority=r.priority,
                    started_at=r.started_at,
                )
                for r in records
                if r.allocation is not None
            ),
            quotas,
        )
        running = []
        for record in records:
            handle = self._handles.get(record.id)
            a = record.allocation
            if handle is None or a is None or a.mig is not None or not a.gpu_uuids:
                continue
            if record.id in self._terminating:
                continue
            running.append(
                Running(
                    workload_id=record.id,
                    handle=handle,
                    gpu_uuids=tuple(a.gpu_uuids),
                    compute_milli=tuple(a.gpu_milli),
                    memory_mib=tuple(a.gpu_memory_mib),
                    priority=record.priority,
                    squeezed_by=record.squeezed_by or (),
                    borrowed=record.id in lent,
                )
            )
        # a workload whose processes live keeps its interposer segment (a suspended one too)
        self.enforcement.sync(running, keep_segments=set(self._handles))

    def _kill_over_quota(self, workload_id: str, message: str) -> None:
        """The memory guard's ``kill``: remember why, thaw, SIGKILL (the exit is recorded as
        failed with ``message``)."""
        handle = self._handles.get(workload_id)
        if handle is None:
            return
        self._fail_reasons[workload_id] = f"stopped: {message}"
        self.enforcement.before_signal(workload_id)
        self.launcher.signal(handle, signal.SIGKILL)

    def _store_agent_event(self, event: AgentEvent) -> None:
        self.store.record_event(
            event.workload_id or None,  # "": of no workload (GPU memory outside fgpu)
            event.kind,
            event.reason,
            self._listed(event.message),
        )


__all__ = ["EnforcementHooks"]

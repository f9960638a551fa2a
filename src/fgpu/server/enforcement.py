"""What the service does on the GPU beyond placing: the governor and the memory guard.

One :class:`Enforcement` per service owns the node agent's enforcement parts
(DESIGN.md section 7, ``docs/governor.md``):

- the :class:`~fgpu.agent.governor.runtime.Governor` over every shared (not MIG) GPU, which
  freezes and thaws workloads so that each gets its compute share (``strict`` or ``fair``)
  and lower priorities pause (or are compressed) while a higher one is busy;
- the :class:`~fgpu.agent.governor.activity.HintListener` on the agent socket, where
  workloads send :mod:`fgpu.sdk` busy/idle hints and (on simulated GPUs) their pretend
  memory use;
- the :class:`~fgpu.agent.memguard.MemoryGuard`, which stops a workload over its GPU memory
  quota (policy ``kill``) or records that it is over (``warn``);
- :func:`~fgpu.agent.limits.launch_env`, the framework limits put into a workload's
  environment before launch.

MIG workloads are not governed: their instance isolates them in hardware.

The service calls :meth:`Enforcement.sync` with every running workload after each launch,
exit and recovery, :meth:`Enforcement.before_signal` before it signals a workload, and
:meth:`Enforcement.close` when it stops (nothing is left frozen). Agent events (paused,
resumed, memory) are written to the store by a background writer, off the governor's thread.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fgpu.agent.backend import GpuBackend
from fgpu.agent.events import AgentEvent, EventLog
from fgpu.agent.governor.activity import HintListener
from fgpu.agent.governor.freezer import detect_freezer
from fgpu.agent.governor.plan import ComputeMode, GpuPolicy, PriorityPolicy
from fgpu.agent.governor.runtime import (
    GovernedWorkload,
    Governor,
    GovernorConfig,
    WorkloadView,
)
from fgpu.agent.governor.watchdog import WatchedFreezer
from fgpu.agent.limits import GpuGrant, launch_env
from fgpu.agent.memguard import GuardedWorkload, MemoryGuard, MemoryPolicy, MemoryViolation
from fgpu.agent.process import ProcessHandle, group_pids

log = logging.getLogger("fgpu.server")


@dataclass(frozen=True, slots=True, kw_only=True)
class EnforcementConfig:
    """``fgpu serve`` settings of the governor and the memory guard.

    Attributes:
        compute_mode: ``fair`` (shares are minimums; idle time goes to busy workloads) or
            ``strict`` (each workload gets its share of every period, no more).
        priority_policy: ``pause`` or ``compress`` lower priorities while a higher one is
            busy.
        memory_policy: ``kill`` (default) or ``warn`` a workload over its memory quota.
        memory_interval_s: seconds between two looks at per-process GPU memory.
        governor: False turns time slicing off (placement and the memory guard remain).
    """

    compute_mode: ComputeMode = ComputeMode.FAIR
    priority_policy: PriorityPolicy = PriorityPolicy.PAUSE
    memory_policy: MemoryPolicy = MemoryPolicy.KILL
    memory_interval_s: float = 1.0
    governor: bool = True


@dataclass(frozen=True, slots=True)
class Running:
    """A running workload on shared GPUs, as the service knows it.

    Attributes:
        workload_id: its id.
        handle: its processes.
        gpu_uuids: its GPUs, in ``CUDA_VISIBLE_DEVICES`` order.
        compute_milli: its compute share on each, milli-GPU.
        memory_mib: its memory quota on each, MiB.
        priority: numeric priority.
    """

    workload_id: str
    handle: ProcessHandle
    gpu_uuids: tuple[str, ...]
    compute_milli: tuple[int, ...]
    memory_mib: tuple[int, ...]
    priority: int


class Enforcement:
    """The governor, hint socket and memory guard of one service (module docstring).

    Args:
        backend: the GPU backend (memory figures; on simulated GPUs the hints' memory
            reports go to it).
        gpus: uuid -> memory (MiB) of every shared GPU (MIG GPUs excluded).
        agent_socket: where workloads send hints (``FGPU_AGENT_SOCKET``); None: no hints.
        config: settings.
        record: ``record(event)``: store an agent event (called from a background thread).
        kill: ``kill(workload_id, message)``: stop a workload over its memory quota now
            (the service records why, then kills it).
        cgroup_name: this service's own cgroup subtree under ``<cgroup2 mount>/fgpu`` (the
            freezer's recovery thaws and removes only what is under it), or None for the
            shared ``fgpu`` folder.
    """

    def __init__(
        self,
        backend: GpuBackend,
        gpus: Mapping[str, int],
        *,
        agent_socket: Path | None,
        config: EnforcementConfig,
        record: Callable[[AgentEvent], None],
        kill: Callable[[str, str], None],
        cgroup_name: str | None = None,
    ) -> None:
        self.config = config
        self._device_mib = dict(gpus)
        self._record = record
        self._kill = kill
        self.events = EventLog()
        self._outbox: queue.SimpleQueue[AgentEvent | None] = queue.SimpleQueue()
        self.events.subscribe(self._outbox.put)
        self._writer = threading.Thread(target=self._write_events, name="fgpu-agent-events")
        self._writer.daemon = True
        self.listener: HintListener | None = None
        if agent_socket is not None:
            try:
                self.listener = HintListener(agent_socket)
            except OSError as exc:
                log.warning("no activity hints: cannot bind %s: %s", agent_socket, exc)
        self.socket = self.listener.path if self.listener is not None else None
        policy = GpuPolicy(mode=config.compute_mode, priority_policy=config.priority_policy)
        self.governor = Governor(
            list(gpus),
            config=GovernorConfig(gpu_policy=policy),
            # a killed service's frozen work is thawed by the watchdog it leaves behind
            freezer=WatchedFreezer(
                detect_freezer(cgroup_root=Path(cgroup_name) if cgroup_name else None)
            ),
            listener=self.listener,
            backend=backend,
            events=self.events,
        )
        self.guard = MemoryGuard(
            backend,
            policy=config.memory_policy,
            interval_s=config.memory_interval_s,
            events=self.events,
            stop=self._over_quota,
            governor=self.governor,
            pids_of=self._pids,
        )
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the governor's loop, the guard's polling and the event writer."""
        if self._started:
            return
        self._started = True
        self._writer.start()
        if self.config.governor:
            self.governor.start()
        self.guard.start()

    def close(self) -> None:
        """Stop everything; every frozen workload is thawed first. Idempotent."""
        with contextlib.suppress(Exception):
            self.guard.close()
        self.governor.close()  # thaws all, closes the hint socket
        if self._started:
            self._outbox.put(None)
            self._writer.join(timeout=5)

    # ---------------------------------------------------------------------- calls
    def sync(self, running: Sequence[Running]) -> None:
        """Govern and guard exactly ``running`` (the service's running shared-GPU work)."""
        governed = []
        guarded = []
        for r in running:
            if not r.gpu_uuids or any(u not in self._device_mib for u in r.gpu_uuids):
                continue
            guarded.append(
                GuardedWorkload(
                    workload_id=r.workload_id,
                    handle=r.handle,
                    quotas_mib=dict(zip(r.gpu_uuids, r.memory_mib, strict=True)),
                )
            )
            governed.append(
                GovernedWorkload(
                    workload_id=r.workload_id,
                    handle=r.handle,
                    gpu_uuids=r.gpu_uuids,
                    compute_milli=tuple(max(1, m) for m in r.compute_milli),
                    priority=r.priority,
                )
            )
        if self.config.governor:
            try:
                self.governor.update(governed)
            except ValueError as exc:  # a ledger bug must not stop the service
                log.error("governor: %s", exc)
        self.guard.update(guarded)

    def before_signal(self, workload_id: str) -> None:
        """Thaw ``workload_id`` and stop governing it, before it is signalled."""
        self.governor.before_signal(workload_id)

    def launch_env(
        self,
        uuids: Sequence[str],
        compute_milli: Sequence[int],
        memory_mib: Sequence[int],
        env: Mapping[str, str],
    ) -> dict[str, str]:
        """Variables that keep the workload's framework within its memory quotas (merge
        them over ``env``), plus ``FGPU_AGENT_SOCKET`` when hints are received."""
        grants = [
            GpuGrant(
                uuid=u,
                device_memory_mib=self._device_mib[u],
                memory_mib=min(max(1, m), self._device_mib[u]),
                compute_milli=min(max(1, c), 1000),
            )
            for u, c, m in zip(uuids, compute_milli, memory_mib, strict=True)
            if u in self._device_mib
        ]
        extra = launch_env(grants, env=env)
        if self.socket is not None:
            extra["FGPU_AGENT_SOCKET"] = str(self.socket)
        return extra

    def views(self) -> dict[str, WorkloadView]:
        """The governor's view of each governed workload, by id (for ``fgpu top``)."""
        if not self.config.governor:
            return {}
        return {v.workload_id: v for v in self.governor.snapshot().workloads}

    # -------------------------------------------------------------------- private
    def _pids(self, handle: ProcessHandle) -> list[int]:
        return self.governor.pids(handle.workload_id) or group_pids(handle)

    def _over_quota(self, workload: GuardedWorkload, violation: MemoryViolation) -> None:
        self._kill(workload.workload_id, violation.message)

    def _write_events(self) -> None:
        while True:
            event = self._outbox.get()
            if event is None:
                return
            try:
                self._record(event)
            except Exception as exc:  # e.g. the workload row is gone; the log has it
                log.warning("agent event not stored (%s): %s", exc, event)

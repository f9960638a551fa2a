"""Events the node agent's components record for ``fgpu describe`` (governor, memory guard).

The service reads them with :meth:`EventLog.since` (a cursor, like the store's events) or
gets each as it happens through a listener, and stores them with the workload's other
events. Kinds follow the store's vocabulary (:class:`fgpu.store.records.EventRecord`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

PAUSED = "paused"
"""Frozen by priority (pause), or held to a floor share (compress)."""
RESUMED = "resumed"
"""No longer held back by priority."""
MEMORY_EXCEEDED = "memory-exceeded"
"""Over its memory quota; stopped (policy ``kill``)."""
MEMORY_WARNING = "memory-warning"
"""Over its memory quota; left running (policy ``warn``)."""
MEMORY_REFUSED = "memory-refused"
"""The interposer refused an allocation over the workload's memory cap (the program got
CUDA's out-of-memory error)."""
FREEZE_SLOW = "freeze-slow"
"""A freeze was not confirmed within the timeout (the next lease was granted anyway)."""
GATE_IGNORED = "gate-ignored"
"""A workload held at launch kept running kernels (NVML per-process utilization) after its
gate closed and its launches drained: it went around the interposer (an ``exec`` without
``LD_PRELOAD``, its own driver calls). It is held by the freezer from then on."""


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """Something the agent did to a workload.

    Attributes:
        seq: increasing number within this log (a cursor for :meth:`EventLog.since`).
        time: wall-clock time, seconds since the epoch.
        mono_ns: monotonic clock, ns (to compare with other monotonic stamps).
        workload_id: the workload.
        kind: one of the constants of this module.
        reason: a few words (``priority``, ``compress``, ``memory quota``).
        message: a sentence for users, naming figures (``used 5000 MiB, allowed 4096``).
    """

    seq: int
    time: float
    mono_ns: int
    workload_id: str
    kind: str
    reason: str
    message: str


class EventLog:
    """A bounded, thread-safe list of :class:`AgentEvent` with listeners.

    Args:
        capacity: how many events are kept (older ones are dropped).
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self._events: deque[AgentEvent] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._seq = 0
        self._listeners: list[Callable[[AgentEvent], None]] = []

    def add(
        self,
        time: float,
        mono_ns: int,
        workload_id: str,
        kind: str,
        reason: str,
        message: str,
    ) -> AgentEvent:
        """Record an event and tell the listeners (a failing listener is logged, not
        raised)."""
        with self._lock:
            self._seq += 1
            event = AgentEvent(self._seq, time, mono_ns, workload_id, kind, reason, message)
            self._events.append(event)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.exception("event listener failed on %s", event)
        return event

    def since(self, seq: int = 0, workload_id: str | None = None) -> list[AgentEvent]:
        """Events after ``seq`` (oldest first), of one workload when given."""
        with self._lock:
            return [
                e
                for e in self._events
                if e.seq > seq and (workload_id is None or e.workload_id == workload_id)
            ]

    def subscribe(self, listener: Callable[[AgentEvent], None]) -> None:
        """Call ``listener(event)`` for every later event, from the thread that records it
        (keep it short: the governor's thread calls it)."""
        with self._lock:
            self._listeners.append(listener)


__all__ = [
    "FREEZE_SLOW",
    "MEMORY_EXCEEDED",
    "MEMORY_WARNING",
    "PAUSED",
    "RESUMED",
    "AgentEvent",
    "EventLog",
]

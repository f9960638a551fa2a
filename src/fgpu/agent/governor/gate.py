"""The governor's launch gate: its decisions carried out inside CUDA by the interposer.

A workload whose processes use the GPU through libfgpu (``native/interposer``) is held at
kernel launch instead of being frozen: closing its gate makes every gated driver call
(kernel and graph launches, async copies and memsets) wait inside the interposer, while its
CPU threads keep running (data loading, network, logging). Each process keeps at most
``max_inflight`` operations in flight, so a hold takes effect within about that many kernels,
not after a deep launch queue drains (``docs/governor.md``). A workload counts as busy while it
launches, and its run time is charged in device time measured with CUDA events, so shares are
shares of the GPU, not of wall time.

:class:`LaunchGate` wraps one workload's :class:`~fgpu.agent.interposer.segment.Segment` for
the :class:`~fgpu.agent.governor.runtime.Governor`. A workload starts under the freezer; the
gate takes over once a process of it has used the driver through the interposer (programs
without CUDA keep the freezer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from fgpu.agent.interposer.segment import Segment, SegmentError, SegmentStats

SWEEP_NS = 1_000_000_000
"""How often the agent reclaims the reservations of the workload's dead processes."""

DEFAULT_IDLE_NS = 50_000_000
"""A workload that has not launched for this long (and has nothing in flight or waiting) is
idle."""


@dataclass(frozen=True, slots=True)
class GateReading:
    """What one look at the segment tells the governor.

    Attributes:
        active: a process of the workload uses the driver through the interposer.
        busy: it launched within the idle delay, or has work in flight or waiting.
        gpu_time_ns: device time completed since the previous reading, ns.
        stats: the raw figures.
    """

    active: bool
    busy: bool
    gpu_time_ns: int
    stats: SegmentStats


class LaunchGate:
    """One workload's gate (module docstring).

    Args:
        segment: the workload's segment (the gate does not close it).
        idle_ns: see :data:`DEFAULT_IDLE_NS`.
        clock: ``CLOCK_MONOTONIC`` in ns, the interposer's clock.
    """

    def __init__(
        self,
        segment: Segment,
        *,
        idle_ns: int = DEFAULT_IDLE_NS,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.segment = segment
        self._idle_ns = idle_ns
        self._clock = clock
        self._seen_gpu_ns: int | None = None
        self._max_inflight: int | None = None
        self._swept_ns = 0

    @property
    def closed(self) -> bool:
        """Whether the segment was closed (its workload ended)."""
        return bool(self.segment.closed)

    def read(self) -> GateReading:
        """Look at the segment, renew the agent's heartbeat, reclaim the reservations of dead
        processes (every :data:`SWEEP_NS`), and say what changed.

        Raises:
            SegmentError: the segment was closed.
        """
        if self.segment.closed:
            raise SegmentError(f"{self.segment.path}: closed")
        self.segment.beat()
        now = self._clock()
        if now - self._swept_ns >= SWEEP_NS:
            self._swept_ns = now
            self.segment.sweep()  # kill -9'd processes give their memory back
        stats = self.segment.stats()
        total = stats.gpu_time_ns
        delta = 0 if self._seen_gpu_ns is None else max(0, total - self._seen_gpu_ns)
        self._seen_gpu_ns = total
        recent = stats.last_launch_ns > 0 and now - stats.last_launch_ns < self._idle_ns
        busy = recent or stats.inflight > 0 or stats.waiting > 0
        return GateReading(active=stats.processes > 0, busy=busy, gpu_time_ns=delta, stats=stats)

    def hold(self) -> None:
        """Close the gate: launches from now on wait."""
        self.segment.set_gate(closed=True)

    def release(self) -> None:
        """Open the gate and wake the waiters."""
        if not self.segment.closed:
            self.segment.set_gate(closed=False)

    def wait_drained(self, timeout_s: float, *, poll_s: float = 0.0002) -> bool:
        """Wait until nothing the workload launched is still in flight (after :meth:`hold`).

        Returns:
            True when drained, False when ``timeout_s`` passed first.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self.segment.stats().inflight == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)

    def set_max_inflight(self, value: int) -> None:
        """Bound each process's launches in flight (0: unbounded); writes only on change."""
        if value != self._max_inflight:
            self.segment.set_max_inflight(value)
            self._max_inflight = value


__all__ = ["DEFAULT_IDLE_NS", "SWEEP_NS", "GateReading", "LaunchGate"]

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
  environment before launch;
- the interposer (``native/interposer``, libfgpu) preloaded into each workload with its own
  segment (:mod:`fgpu.agent.interposer`): a hard memory cap per GPU (allocations over it get
  CUDA's out-of-memory error) and the governor's holds carried out at kernel launch. It is on
  for real GPUs (NVML), and for simulated GPUs when they run workloads against the fake CUDA
  driver (``fake_driver``); a workload whose environment says ``FGPU_INTERPOSER=off`` runs
  without it.

MIG workloads are not governed: their instance isolates them in hardware.

The service calls :meth:`Enforcement.sync` with every running workload after each launch,
exit and recovery, :meth:`Enforcement.before_signal` before it signals a workload, and
:meth:`Enforcement.close` when it stops (nothing is left frozen). Agent events (paused,
resumed, memory) are written to the store by a background writer, off the governor's thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fgpu import states
from fgpu.agent.backend import GpuBackend, GpuProcess, SimulatedBackend
from fgpu.agent.events import AgentEvent, EventLog
from fgpu.agent.governor.activity import HintListener
from fgpu.agent.governor.freezer import CgroupFreezer, cgroup2_mount, detect_freezer
from fgpu.agent.governor.plan import ComputeMode, GpuPolicy, PriorityPolicy
from fgpu.agent.governor.runtime import (
    GovernedWorkload,
    Governor,
    GovernorConfig,
    WorkloadView,
)
from fgpu.agent.governor.watchdog import WatchedFreezer
from fgpu.agent.interposer.preload import (
    SegmentDir,
    fake_driver_env,
    interposer_disabled,
    preload_env,
)
from fgpu.agent.interposer.segment import Segment, SegmentError
from fgpu.agent.limits import GpuGrant, MpsSettings, launch_env, mps_pipe_directory
from fgpu.agent.memguard import (
    DEFAULT_INTERVAL_S,
    GuardedWorkload,
    MemoryGuard,
    MemoryPolicy,
    MemoryViolation,
)
from fgpu.agent.process import ProcessHandle, group_pids
from fgpu.server.interposing import FakeDriver, InterposerMode
from fgpu.wire import EnforcementLayer

log = logging.getLogger("fgpu.server")

MIB = 1024 * 1024
GUARD_MARGIN_MIB = 1024
"""What the memory guard allows above the quota of a workload capped by the interposer: the
interposer counts every allocation call, but a CUDA context, loaded modules and libraries'
workspaces take device memory no call shows (a few hundred MiB per process on recent GPUs),
which NVML reports as the process's memory."""

FRESH_SEGMENT_S = 60.0
"""A segment made for a launch is kept this long before the workload is first seen running
(a launch that failed leaves it for the next sync after that to delete)."""


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
        interposer: when workloads get the interposer (:class:`InterposerMode`).
        max_inflight: launches a process held at launch may keep in flight while it shares
            a GPU.
    """

    compute_mode: ComputeMode = ComputeMode.FAIR
    priority_policy: PriorityPolicy = PriorityPolicy.PAUSE
    memory_policy: MemoryPolicy = MemoryPolicy.KILL
    memory_interval_s: float = DEFAULT_INTERVAL_S
    governor: bool = True
    interposer: InterposerMode = InterposerMode.AUTO
    max_inflight: int = 2


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
        squeezed_by: ids of the workloads that squeezed it (empty when not squeezed).
        borrowed: whether it runs beyond its queue's quota (:mod:`fgpu.sched.borrowing`).
    """

    workload_id: str
    handle: ProcessHandle
    gpu_uuids: tuple[str, ...]
    compute_milli: tuple[int, ...]
    memory_mib: tuple[int, ...]
    priority: int
    squeezed_by: tuple[str, ...] = ()
    borrowed: bool = False


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
        segments: the folder of the workloads' interposer segments; None: no interposer.
        interposer_off_reason: why there is none (``fgpu nodes`` shows it).
        lib_dir: the folder of ``libfgpu.so`` (default: :func:`fgpu.native.lib_dir`).
        fake_driver: workloads run against the fake CUDA driver (simulated GPUs), or None.
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
        segments: SegmentDir | None = None,
        lib_dir: Path | None = None,
        fake_driver: FakeDriver | None = None,
        interposer_off_reason: str = "off",
    ) -> None:
        self.config = config
        self.backend_kind = backend.kind
        self.segments = segments
        self.interposer_off_reason = interposer_off_reason
        self.fake_driver = fake_driver
        self._lib_dir = lib_dir
        self._segments: dict[str, Segment] = {}
        self._fresh: dict[str, float] = {}  # created for a launch, not yet seen running
        self._segments_lock = threading.Lock()
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
            # a killed service's frozen work is thawed by the watchdog it leaves behind (work
            # held at launch is let go by the interposer once the heartbeat stops)
            freezer=WatchedFreezer(
                detect_freezer(cgroup_root=Path(cgroup_name) if cgroup_name else None)
            ),
            listener=self.listener,
            backend=backend,
            events=self.events,
            config=GovernorConfig(gpu_policy=policy, max_inflight=config.max_inflight),
        )
        self.guard = MemoryGuard(
            backend,
            inside=_inside_workloads(self.governor.freezer),
            policy=config.memory_policy,
            interval_s=config.memory_interval_s,
            events=self.events,
            stop=self._over_quota,
            governor=self.governor,
            pids_of=self._pids,
        )
        self._started = False
        if isinstance(backend, SimulatedBackend) and config.governor:
            backend.estimate_utilization(self.estimated_utilization)

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
        self.governor.close()  # thaws all, opens every gate, closes the hint socket
        with self._segments_lock:
            running = bool(self._segments)
            for segment in self._segments.values():
                segment.close()  # the files stay: running workloads keep them mapped
            self._segments.clear()
        if self.segments is not None and not running:
            self.segments.remove_if_unused()  # nothing left for a next start to re-adopt
        if self._started:
            self._outbox.put(None)
            self._writer.join(timeout=5)

    # ---------------------------------------------------------------------- calls
    def sync(self, running: Sequence[Running], keep_segments: Collection[str] = ()) -> None:
        """Govern and guard exactly ``running`` (the service's running shared-GPU work).

        ``keep_segments``: workloads whose interposer segments stay although they are not
        running (suspended or being suspended: their processes live and map the segment,
        and a restore renames its GPUs); other segments of workloads not running go."""
        governed = []
        guarded = []
        segments = self._sync_segments({r.workload_id for r in running}, set(keep_segments))
        for r in running:
            if not r.gpu_uuids or any(u not in self._device_mib for u in r.gpu_uuids):
                continue
            margin = GUARD_MARGIN_MIB if r.workload_id in segments else 0
            guarded.append(
                GuardedWorkload(
                    workload_id=r.workload_id,
                    handle=r.handle,
                    quotas_mib={
                        u: m + margin for u, m in zip(r.gpu_uuids, r.memory_mib, strict=True)
                    },
                )
            )
            governed.append(
                GovernedWorkload(
                    workload_id=r.workload_id,
                    handle=r.handle,
                    gpu_uuids=r.gpu_uuids,
                    compute_milli=tuple(max(1, m) for m in r.compute_milli),
                    priority=r.priority,
                    squeezed_by=r.squeezed_by,
                    borrowed=r.borrowed,
                    segment=segments.get(r.workload_id),
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
        *,
        workload_id: str | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> dict[str, str]:
        """Variables that keep the workload within its quotas (merge them over ``env``):
        the framework limits, ``FGPU_AGENT_SOCKET`` when hints are received, and with the
        interposer a fresh segment for ``workload_id`` (owned by ``uid``/``gid``) and the
        variables that preload it; with the fake driver, the variables that select it.

        Raises:
            SegmentError: the segment cannot be written (the workload must not start
                without the caps it was promised).
        """
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
        mps = mps_pipe_directory()
        settings = (
            MpsSettings(pipe_directory=os.environ.get("CUDA_MPS_PIPE_DIRECTORY")) if mps else None
        )
        extra = launch_env(grants, env=env, mps=settings)
        if self.socket is not None:
            extra["FGPU_AGENT_SOCKET"] = str(self.socket)
        if self.fake_driver is not None:
            fake = self.fake_driver
            extra.update(fake_driver_env(fake.driver_dir, fake.state_file, fake.gpus, env))
        if (
            self.segments is not None
            and workload_id is not None
            and grants
            and not interposer_disabled(env)
        ):
            segment = self.segments.create(
                workload_id,
                [g.uuid for g in grants],
                [g.memory_mib for g in grants],
                max_inflight=self.config.max_inflight,
                uid=uid,
                gid=gid,
                gating=self.config.governor,
            )
            with self._segments_lock:
                old = self._segments.pop(workload_id, None)
                if old is not None:
                    old.close()
                self._segments[workload_id] = segment
                self._fresh[workload_id] = time.monotonic()
            extra.update(preload_env(self._native_dir(), segment.path, env))
        return extra

    def layers(self) -> list[EnforcementLayer]:
        """The enforcement mechanisms of the shared GPUs, strongest first, each with whether
        it is active and why (``fgpu nodes``; MIG GPUs are isolated by their instances)."""
        cfg = self.config
        if self.segments is not None:
            interposer = EnforcementLayer(
                name="interposer",
                active=True,
                why="libfgpu is preloaded into each workload: a hard memory cap per GPU "
                "(allocations over it get CUDA's out-of-memory error)"
                + (", holds at kernel launch, shares in device time" if cfg.governor else ""),
            )
        else:
            interposer = EnforcementLayer(
                name="interposer", active=False, why=self.interposer_off_reason
            )
        mps = mps_pipe_directory()
        layers = [
            interposer,
            EnforcementLayer(
                name="mps-limits",
                active=mps is not None,
                why=(
                    f"an MPS control daemon serves the GPUs ({mps}): CUDA_MPS_* limits per workload"
                    if mps is not None
                    else "no MPS control daemon (no control pipe in "
                    "$CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps)"
                ),
            ),
            EnforcementLayer(
                name="freezer",
                active=cfg.governor,
                why=(
                    f"{self.governor.freezer.kind}: time slices for workloads not held at "
                    "launch (no CUDA, or the interposer off)"
                    if cfg.governor
                    else "off: --no-governor"
                ),
            ),
        ]
        measured = self.backend_kind != "simulated" or self.fake_driver is not None
        guard_on = measured or cfg.governor
        margin = f" + {GUARD_MARGIN_MIB} MiB for contexts and modules" if self.segments else ""
        act = "stopped" if cfg.memory_policy == "kill" else "reported"
        layers.append(
            EnforcementLayer(
                name="memory-guard",
                active=guard_on,
                why=(
                    f"NVML per-process memory every {cfg.memory_interval_s:g} s; a workload "
                    f"over its quota{margin} is {act}; {self.guard.describe_bursts()}"
                    if measured
                    else "pretend memory reports (fgpu.sdk.report_memory)"
                    if guard_on
                    else "off: simulated GPUs report memory through the governor"
                ),
            )
        )
        return layers

    def move_gpus(self, workload_id: str, uuids: Sequence[str]) -> None:
        """A suspended workload is restored onto other GPUs: its interposer segment names
        ``uuids`` (in its GPUs' order) from now on; the memory guard and governor follow the
        allocation at the next sync. No segment (interposer off): nothing to do.

        Raises:
            ValueError, SegmentError: see :meth:`Segment.set_uuids`.
        """
        if self.segments is None:
            return
        with self._segments_lock:
            segment = self._segments.get(workload_id)
            if segment is None:
                segment = self.segments.open(workload_id)
                if segment is None:
                    return
                self._segments[workload_id] = segment
            segment.set_uuids(uuids)

    def describe(self, workload_id: str) -> list[str]:
        """How a running workload's grant is enforced now, one line per mechanism
        (``fgpu describe``); empty when it is not governed or guarded here."""
        lines: list[str] = []
        with self._segments_lock:
            segment = self._segments.get(workload_id)
        if segment is not None:
            with contextlib.suppress(SegmentError, ValueError):
                st = segment.stats()
                held = "launches held" if st.gate_closed else "launches allowed"
                lines.append(
                    f"interposer: {st.live_processes} process(es) using CUDA, {held}, "
                    f"{st.launches} launches ({st.gate_waits} waited)"
                )
                for g in st.gpus:
                    lines.append(
                        f"  {g.uuid}: {g.memory_reserved // MIB} of {g.memory_limit // MIB} MiB "
                        f"reserved (peak {g.memory_peak // MIB}), {g.oom_count} allocation(s) "
                        f"refused, {g.gpu_time_ns / 1e9:.1f} s of device time"
                    )
        view = self.views().get(workload_id)
        if view is not None:
            how = "at kernel launch" if view.enforcement == "interposer" else view.enforcement
            lines.append(
                f"governor: {states.governor_word(str(view.state))} ({', '.join(view.modes)}), "
                f"held {how}, "
                f"{'busy' if view.busy else 'idle'} ({view.activity}), achieved "
                f"{view.achieved_milli / 1000:.3f}"
            )
        return lines

    def _native_dir(self) -> Path:
        if self._lib_dir is None:
            from fgpu.native import lib_dir

            self._lib_dir = lib_dir()
        return self._lib_dir

    def _sync_segments(self, running: set[str], keep: set[str]) -> dict[str, Segment]:
        """Keep the segments of running workloads mapped (reopening them after a restart of
        the service) and those of ``keep``, and delete those of workloads that ended. Only
        the running workloads' segments are returned (the governor's)."""
        if self.segments is None:
            return {}
        with self._segments_lock:
            now = time.monotonic()
            for wid in list(self._fresh):
                if wid in running or now - self._fresh[wid] > FRESH_SEGMENT_S:
                    del self._fresh[wid]
            for wid in list(self._segments):
                if wid not in running and wid not in self._fresh and wid not in keep:
                    self._segments.pop(wid).remove()
            for wid in running:
                if wid not in self._segments:
                    found = self.segments.open(wid)
                    if found is not None:
                        self._segments[wid] = found
            self.segments.remove_stale(set(self._segments) | running | set(self._fresh) | keep)
            return {wid: seg for wid, seg in self._segments.items() if wid in running}

    def views(self) -> dict[str, WorkloadView]:
        """The governor's view of each governed workload, by id (for ``fgpu top``)."""
        if not self.config.governor:
            return {}
        return {v.workload_id: v for v in self.governor.snapshot().workloads}

    def estimated_utilization(self) -> dict[str, int]:
        """GPU uuid -> percent busy as the governor sees it: the run time its busy workloads
        received over the last minute, summed and capped at 100 (0 for an idle GPU). The
        figure simulated GPUs show, where nothing measures the device."""
        busy = dict.fromkeys(self._device_mib, 0)
        for view in self.governor.snapshot().workloads:
            for uuid in view.gpu_uuids:
                if uuid in busy:
                    busy[uuid] += view.achieved_milli
        return {uuid: min(100, milli // 10) for uuid, milli in busy.items()}

    def used_memory(
        self, handles: Mapping[str, ProcessHandle], procs: Sequence[GpuProcess]
    ) -> dict[tuple[str, str], int]:
        """(workload id, GPU uuid) -> MiB its processes hold there, for the running
        ``handles``, from the backend's ``procs`` (NVML per process; simulated GPUs: what
        the workloads reported)."""
        owner: dict[int, str] = {}
        for workload_id, handle in handles.items():
            for pid in self._pids(handle):
                owner[pid] = workload_id
        used: dict[tuple[str, str], int] = {}
        for proc in procs:
            found = owner.get(proc.pid)
            if found is not None:
                key = (found, proc.gpu_uuid)
                used[key] = used.get(key, 0) + proc.used_mib
        return used

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


def _inside_workloads(freezer: object) -> Callable[[int], bool] | None:
    """Whether a process is in a workload cgroup of this service (under the cgroup v2
    freezer's root, where every workload starts: :mod:`fgpu.agent.hostlimits`); None without
    such a root (then GPU memory outside workloads cannot be told, issue 27 point 1c). A
    process already gone counts as inside (nothing to report)."""
    inner = getattr(freezer, "inner", freezer)
    mount = cgroup2_mount()
    if not isinstance(inner, CgroupFreezer) or mount is None:
        return None
    try:
        prefix = "/" + str(inner.root.relative_to(mount)) + "/"
    except ValueError:
        return None

    def inside(pid: int) -> bool:
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8")
        except OSError:
            return True
        return any(line[3:].startswith(prefix) for line in text.splitlines() if line[:3] == "0::")

    return inside

"""The governor's executor: runs :func:`~fgpu.agent.governor.plan.plan` on real processes.

One :class:`Governor` per node agent governs all the node's GPUs: the planner decides per
GPU (each GPU has its own policy, budgets and priority holder) and grants one lease across
all GPUs of a multi-GPU workload, which is the coordination that lets such a workload run
only when every GPU's governor lets it (DESIGN.md section 7).

The service drives it with four calls (thread-safe):

- :meth:`Governor.update`: the full list of workloads placed on the node's GPUs, each with
  its process handle, shares, priority and modes (after every launch or exit);
- :meth:`Governor.before_signal`: thaw a workload and stop governing it, before it is sent
  SIGTERM (cancel, preemption), so that it can exit cleanly;
- :meth:`Governor.snapshot` and :attr:`Governor.events`: what ``fgpu top`` and
  ``fgpu describe`` show;
- :meth:`Governor.close`: thaw everything and stop (on agent exit).

Loop (one thread, :meth:`Governor.start`): read hints from the :class:`HintListener`,
charge each running busy workload the time it actually ran, plan, freeze (and wait until
the freeze is confirmed, so leases never overlap), thaw, then sleep until the plan's wake
time or the next hint. Sleeping is to absolute deadlines of a monotonic clock, and time is
charged as measured, so late wake-ups do not accumulate into drift.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fgpu.agent.backend import GpuBackend, ProcessUtilization, SimulatedBackend
from fgpu.agent.events import (
    FREEZE_SLOW,
    GATE_IGNORED,
    MEMORY_REFUSED,
    PAUSED,
    RESUMED,
    EventLog,
)
from fgpu.agent.governor.activity import Hint, HintListener
from fgpu.agent.governor.bypass import BYPASS_GRACE_S, Bypass, BypassWatch
from fgpu.agent.governor.freezer import Freezer, detect_freezer
from fgpu.agent.governor.gate import LaunchGate
from fgpu.agent.governor.plan import (
    MILLI,
    ComputeMode,
    Freeze,
    GpuPolicy,
    Lease,
    NodeState,
    Plan,
    PlannerConfig,
    PriorityPolicy,
    RunState,
    Thaw,
    WorkloadState,
    plan,
)
from fgpu.agent.interposer.segment import Segment, SegmentError, SegmentStats
from fgpu.agent.process import ProcessHandle

log = logging.getLogger(__name__)

ACHIEVED_SAMPLE_NS = 1_000_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class GovernedWorkload:
    """A workload placed on this node's GPUs, as the service describes it.

    Attributes:
        workload_id: its id (``FGPU_WORKLOAD_ID``).
        handle: its processes (from :meth:`fgpu.agent.launcher.Launcher.launch`).
        gpu_uuids: its GPUs, in ``CUDA_VISIBLE_DEVICES`` order.
        compute_milli: its compute share on each GPU, same order, milli-GPU (1-1000).
        priority: numeric priority (DESIGN.md section 5).
        mode: its compute mode, or None for each GPU's.
        priority_policy: ``pause``/``compress`` when a higher priority is busy, or None for
            each GPU's.
        squeezed_by: ids of the workloads that squeezed it (DESIGN.md section 5, squeeze
            before evict), empty when it is not squeezed: it is paused (or compressed) while
            one of them is busy on its GPU, and its share is lent to them (not counted in
            the GPU's 1000 milli).
        borrowed: whether it runs beyond its queue's quota, on capacity lent by other queues
            (:mod:`fgpu.sched.borrowing`): it then never pauses or compresses a workload that
            runs within its queue's quota, whatever their priorities.
        segment: its interposer segment, or None when it runs without the interposer. Once a
            process of it uses the driver through the interposer, it is held at launch
            (:mod:`fgpu.agent.governor.gate`) and charged device time; until then, and
            without a segment, it is frozen and charged wall time while busy.

    Raises:
        ValueError: no GPUs, lengths differ, a GPU twice, or a share outside 1-1000.
    """

    workload_id: str
    handle: ProcessHandle
    gpu_uuids: tuple[str, ...]
    compute_milli: tuple[int, ...]
    priority: int = 50
    mode: ComputeMode | None = None
    priority_policy: PriorityPolicy | None = None
    squeezed_by: tuple[str, ...] = ()
    borrowed: bool = False
    segment: Segment | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.gpu_uuids or len(self.gpu_uuids) != len(self.compute_milli):
            raise ValueError(
                f"workload {self.workload_id}: give one compute share per GPU "
                f"({len(self.gpu_uuids)} GPUs, {len(self.compute_milli)} shares)",
            )
        if len(set(self.gpu_uuids)) != len(self.gpu_uuids):
            raise ValueError(f"workload {self.workload_id}: a GPU is listed twice")
        for share in self.compute_milli:
            if not 0 < share <= MILLI:
                raise ValueError(f"workload {self.workload_id}: share {share} not in 1-1000")


@dataclass(frozen=True, slots=True, kw_only=True)
class GovernorConfig:
    """Settings of the executor.

    Attributes:
        planner: period, lease, minimum lease and hysteresis (see :class:`PlannerConfig`).
        gpu_policy: the policy of every GPU not in ``gpu_policies``.
        gpu_policies: GPU uuid -> its policy.
        confirm_timeout_s: how long to wait for a freeze to take effect before granting the
            next lease anyway (an event records it).
        realtime_priority: run the governor thread as ``SCHED_FIFO`` at this priority
            (1-99; needs root or CAP_SYS_NICE; ``SCHED_RESET_ON_FORK`` so nothing it starts
            inherits it); None keeps the normal policy. Pause latency under CPU load
            depends on it (``docs/governor.md``).
        cpu: pin the governor thread to this CPU, or None.
        nvml_busy_percent: without hints, a workload on a real GPU counts as busy when a
            process of it kept the GPU's SMs busy at least this percent of a sample.
        activity_poll_s: how often NVML per-process utilization is read.
        achieved_window_s: window of the achieved share in :meth:`Governor.snapshot`.
        max_inflight: gated launches each process of a workload held at launch may keep in
            flight while it shares a GPU (a hold takes effect within about this many
            kernels); a workload alone on a ``fair`` GPU is not bounded.
        launch_idle_s: a workload held at launch counts as idle once it has not launched
            for this long and has nothing in flight or waiting.
        obey_poll_s: how often the governor checks, with the backend's per-process GPU
            utilization (NVML; the fake driver's figures in its shape), that workloads held
            at launch run no kernels. A backend without per-process figures (pretend GPUs)
            is not checked.
        obey_grace_s: samples up to this long after a held workload's launches drained are
            not held against it (NVML averages over sample periods of about 1/6 s).
        obey_drain_s: a held workload whose segment still says launches are in flight this
            long after its gate closed is checked anyway (its segment is its own to write).
        obey_percent: SM utilization, percent of a sample, at which a held workload counts
            as running kernels.
        obey_window_s: the window over which the device time a workload held at launch
            reports in its segment is compared with what NVML measured for its processes.
        obey_busy_fraction: NVML must have seen it busy at least this part of the window for
            the comparison to count.
        obey_report_ratio: a workload that reported less than this part of the device time
            NVML measured under-reports (it wrote its own counter): it goes to the freezer.
        bypass_grace_s: a process of a workload held at launch that NVML lists on a GPU
            without an entry of the workload's segment this long uses the GPU without the
            interposer: the workload goes to the freezer (:mod:`fgpu.agent.governor.bypass`).
    """

    planner: PlannerConfig = field(default_factory=PlannerConfig)
    gpu_policy: GpuPolicy = field(default_factory=GpuPolicy)
    gpu_policies: Mapping[str, GpuPolicy] = field(default_factory=dict)
    confirm_timeout_s: float = 0.1
    realtime_priority: int | None = None
    cpu: int | None = None
    nvml_busy_percent: int = 5
    activity_poll_s: float = 0.5
    achieved_window_s: float = 60.0
    max_inflight: int = 2
    launch_idle_s: float = 0.05
    obey_poll_s: float = 0.1
    obey_grace_s: float = 0.3
    obey_drain_s: float = 5.0
    obey_percent: int = 1
    obey_window_s: float = 0.5
    obey_busy_fraction: float = 0.2
    obey_report_ratio: float = 0.25
    bypass_grace_s: float = BYPASS_GRACE_S


GATE_POLL_NS = 5_000_000
"""How often the loop looks at the segments of workloads held at launch (they announce
activity by launching, not by a message that would wake the loop)."""


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """One workload in :meth:`Governor.snapshot`.

    Attributes:
        workload_id: its id.
        gpu_uuids: its GPUs.
        compute_milli: its share on each GPU, milli-GPU.
        priority: its priority.
        modes: its effective compute mode on each GPU.
        state: running, frozen-by-share or frozen-by-priority.
        busy: whether it counts as busy now.
        activity: where ``busy`` comes from: ``interposer`` (its launches), ``hints``,
            ``nvml`` or ``assumed``.
        achieved_milli: its part of its GPU's time over the last ``achieved_window_s`` (or
            since it was first governed, if shorter), per mille: the run time it received
            while busy, split with the workloads that ran on the GPU at the same time, so
            that the parts on one GPU add up to at most 1000.
        blocker: why it is held back by priority, or None.
        enforcement: how it is held: ``interposer`` (at launch, device time) or the
            freezer's kind (``cgroup-v2``, ``signal``).
        paused_ns: time held frozen since it was first governed, ns: by share (time
            slicing) and by priority, in that order.
    """

    workload_id: str
    gpu_uuids: tuple[str, ...]
    compute_milli: tuple[int, ...]
    priority: int
    modes: tuple[str, ...]
    state: RunState
    busy: bool
    activity: str
    achieved_milli: int
    blocker: str | None
    enforcement: str = ""
    paused_ns: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class GovernorSnapshot:
    """What ``fgpu top`` shows of the governor.

    Attributes:
        time: wall-clock time of the snapshot.
        mechanism: ``cgroup-v2`` or ``signal``.
        period_ms, lease_ms, resume_after_ms: the planner's constants.
        workloads: one view per governed workload, by id.
        dropped_hints: datagrams refused (malformed, or from a process that is not the
            workload it names).
        freezes: freezes issued since the governor started (a lease switch is one).
    """

    time: float
    mechanism: str
    period_ms: int
    lease_ms: int
    resume_after_ms: int
    workloads: tuple[WorkloadView, ...]
    dropped_hints: int
    freezes: int


@dataclass(slots=True)
class _Record:
    spec: GovernedWorkload
    state: RunState = RunState.RUNNING
    busy: bool = True
    activity: str = "assumed"
    idle_since_ns: int | None = None
    used_ns: int = 0
    total_ns: int = 0
    mark_ns: int = 0
    samples: deque[tuple[int, int]] = field(default_factory=deque)  # (time, share_ns)
    share_ns: int = 0  # its part of its GPUs' time (see Governor._share_gpu_time)
    counted_ns: int = 0  # total_ns already counted into share_ns
    blocker: str | None = None
    slow_reported: bool = False
    held: bool = False  # paused or compressed by priority (between a paused and a resumed)
    gate: LaunchGate | None = None
    cuda: bool = False  # held at launch (a process of it uses the interposer)
    hint_busy: bool | None = None  # the last hint, for workloads held at launch
    gpu_pending_ns: int = 0  # device time read from the segment, not yet charged
    defiant: bool = False  # ran kernels past its closed gate: the freezer holds it for good
    held_us: int | None = None  # wall clock (us) its gate closed, while held at launch
    drained_us: int | None = None  # wall clock (us) its segment first showed none in flight
    reported_ns: int = 0  # device time its segment reported since window_us
    window_us: int | None = None  # wall clock (us) the device time comparison began
    steady: bool = False  # neither went busy nor idle since the period began
    oom_seen: dict[str, int] = field(default_factory=dict)  # refusals already reported
    frozen_ns: list[int] = field(default_factory=lambda: [0, 0])  # by share, by priority
    frozen_at: int = 0  # when the current frozen state began (while not running)

    def enter(self, state: RunState, now: int) -> None:
        """Change the run state at ``now``, adding a frozen spell that ends to its total."""
        if self.state is not RunState.RUNNING:
            spell = max(0, now - self.frozen_at)
            self.frozen_ns[self.state is RunState.FROZEN_BY_PRIORITY] += spell
        if state is not RunState.RUNNING:
            self.frozen_at = now
        self.state = state

    def paused_ns(self, now: int) -> tuple[int, int]:
        """Frozen time so far (by share, by priority), the current spell included."""
        share, priority = self.frozen_ns
        if self.state is RunState.FROZEN_BY_SHARE:
            share += max(0, now - self.frozen_at)
        elif self.state is RunState.FROZEN_BY_PRIORITY:
            priority += max(0, now - self.frozen_at)
        return share, priority

    def charge(self, now: int) -> None:
        """Count the running time since the last mark (when busy) and move the mark. A
        workload held at launch is charged the device time its segment reported instead."""
        if self.cuda:
            # device time, at most the wall time since the last charge (overlapping streams
            # of one workload each count their own time); the rest carries over, up to 1 s
            charged = min(self.gpu_pending_ns, max(0, now - self.mark_ns))
            self.used_ns += charged
            self.total_ns += charged
            self.gpu_pending_ns = min(self.gpu_pending_ns - charged, 1_000_000_000)
            self.mark_ns = max(self.mark_ns, now)
            return
        if self.state is RunState.RUNNING:
            if self.busy and now > self.mark_ns:
                self.used_ns += now - self.mark_ns
                self.total_ns += now - self.mark_ns
            self.mark_ns = max(self.mark_ns, now)


class Governor:
    """Freezes and thaws the node's workloads so that each GPU is shared as planned.

    Args:
        gpus: uuids of the GPUs to govern (a workload on another GPU is an error).
        config: settings.
        freezer: the mechanism (default: :func:`detect_freezer`).
        listener: the hint socket, owned (closed) by the governor; None: no hints.
        backend: GPU backend. Memory reports from workloads go to
            :meth:`SimulatedBackend.report_usage` when it is simulated; per-process
            utilization (NVML) decides activity for workloads without hints.
        events: where pause/resume events go (default: a new :class:`EventLog`).
        clock: monotonic clock, ns.
        wall: wall clock, seconds (event times).
    """

    def __init__(
        self,
        gpus: Iterable[str],
        *,
        config: GovernorConfig | None = None,
        freezer: Freezer | None = None,
        listener: HintListener | None = None,
        backend: GpuBackend | None = None,
        events: EventLog | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config or GovernorConfig()
        self._gpus = {
            uuid: self.config.gpu_policies.get(uuid, self.config.gpu_policy) for uuid in gpus
        }
        self.freezer = freezer if freezer is not None else detect_freezer()
        self.listener = listener
        self.backend = backend
        self.events = events if events is not None else EventLog()
        self._clock = clock
        self._wall = wall
        self._lock = threading.RLock()
        self._records: dict[str, _Record] = {}
        self._released: dict[str, ProcessHandle | None] = {}
        self._leases: dict[str, Lease] = {}
        self._period_start = clock()
        self._shared_at = self._period_start
        self._next_poll = 0
        self._next_obey = 0
        self._bypass = BypassWatch(self.config.bypass_grace_s)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        self._freezes = 0
        self.last_plan: Plan | None = None

    # -- the service's calls ---------------------------------------------------------------

    def update(self, workloads: Sequence[GovernedWorkload]) -> None:
        """Set the governed workloads to exactly ``workloads``.

        New ones are adopted by the freezer (and thawed, in case a previous agent left them
        frozen); ones no longer listed are thawed and released; changed ones (priority,
        modes, shares) take effect at the next plan. Workloads passed to
        :meth:`before_signal` stay ungoverned while they are listed with the same process
        handle (a relaunch under the same id, with a new handle, is governed again).

        Raises:
            ValueError: a workload on a GPU this governor does not govern, an id twice, or a
                GPU whose shares of workloads that are not squeezed add up to more than 1000
                milli (a squeezed workload's share is lent to its squeezers).
        """
        by_id: dict[str, GovernedWorkload] = {}
        load: dict[str, int] = {}
        for w in workloads:
            if w.workload_id in by_id:
                raise ValueError(f"workload {w.workload_id} given twice")
            by_id[w.workload_id] = w
            for uuid, share in zip(w.gpu_uuids, w.compute_milli, strict=True):
                if uuid not in self._gpus:
                    raise ValueError(f"workload {w.workload_id}: GPU {uuid} is not governed")
                if not w.squeezed_by:
                    load[uuid] = load.get(uuid, 0) + share
        for uuid, total in load.items():
            if total > MILLI:
                raise ValueError(
                    f"GPU {uuid}: shares of workloads that are not squeezed add up to "
                    f"{total} milli (over 1000)"
                )
        with self._lock:
            now = self._clock()
            for wid in list(self._records):
                record = self._records[wid]
                if wid not in by_id or by_id[wid].handle != record.spec.handle:
                    self._drop(record)
            self._released = {w: h for w, h in self._released.items() if w in by_id}
            for wid, spec in by_id.items():
                if wid in self._released and self._released[wid] in (None, spec.handle):
                    continue  # released by before_signal (a new process of it is governed)
                self._released.pop(wid, None)
                known = self._records.get(wid)
                if known is not None:
                    if spec.segment is not known.spec.segment:
                        known.gate = LaunchGate(spec.segment) if spec.segment else None
                    known.spec = spec
                    continue
                self.freezer.adopt(spec.handle)
                fresh = _Record(spec=spec, mark_ns=now)
                if spec.segment is not None:
                    fresh.gate = self._new_gate(spec.segment)
                fresh.samples.append((now, 0))
                self._records[wid] = fresh
        self._poke()

    def before_signal(self, workload_id: str) -> None:
        """Thaw ``workload_id`` now and stop governing it (until :meth:`update` no longer
        lists it), so that a SIGTERM that follows can be handled. Unknown ids are ignored."""
        with self._lock:
            record = self._records.get(workload_id)
            self._released[workload_id] = record.spec.handle if record is not None else None
            if record is not None:
                self._drop(record)
        self._poke()

    def snapshot(self) -> GovernorSnapshot:
        """The governed workloads now (see :class:`GovernorSnapshot`)."""
        with self._lock:
            now = self._clock()
            # each GPU's workloads are measured over one span, from the first of them
            since: dict[str, int] = {}
            for record in self._records.values():
                first = record.samples[0][0]
                for gpu in record.spec.gpu_uuids:
                    since[gpu] = min(since.get(gpu, first), first)
            views = [
                self._view(r, now, min(since[g] for g in r.spec.gpu_uuids))
                for _, r in sorted(self._records.items())
            ]
            dropped = self.listener.dropped if self.listener is not None else 0
        cfg = self.config.planner
        return GovernorSnapshot(
            time=self._wall(),
            mechanism=self.freezer.kind,
            period_ms=cfg.period_ns // 1_000_000,
            lease_ms=cfg.lease_ns // 1_000_000,
            resume_after_ms=cfg.resume_after_ns // 1_000_000,
            workloads=tuple(views),
            dropped_hints=dropped,
            freezes=self._freezes,
        )

    def pids(self, workload_id: str) -> list[int]:
        """The workload's live processes as the freezer sees them (empty when unknown)."""
        with self._lock:
            record = self._records.get(workload_id)
            return self.freezer.pids(record.spec.handle) if record is not None else []

    def start(self) -> None:
        """Run the loop in a daemon thread (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="fgpu-governor", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the loop, thaw every workload, release the freezer's resources and close the
        listener. No process the governor froze is left stopped. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._stopping = True
        self._poke()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for record in list(self._records.values()):
                self._drop(record)
            self.freezer.close()
            if self.listener is not None:
                self.listener.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._closed = True

    # -- the loop ----------------------------------------------------------------------------

    def step(self) -> Plan:
        """One round: hints, accounting, plan, freezes (confirmed), thaws. The loop calls it;
        tests may call it directly instead of :meth:`start`."""
        with self._lock:
            return self._step()

    def _run(self) -> None:
        self._setup_thread()
        while True:
            with self._lock:
                if self._stopping:
                    return
                try:
                    wake = self._step().wake_ns
                except Exception:
                    log.exception("governor step failed; retrying in 100 ms")
                    wake = self._clock() + 100_000_000
                if self._gates_to_watch():
                    wake = min(wake, self._clock() + GATE_POLL_NS)
            self._wait(wake)

    def _gates_to_watch(self) -> bool:
        """Whether a segment must be read every :data:`GATE_POLL_NS`: a workload's is while
        it is held (its launches at the closed gate are the news, and its gate needs the
        agent's heartbeat) and while it uses CUDA on a GPU where its device time counts (a
        strict share, or neighbours). Otherwise the period's wake-up (at most
        ``period_ns``) reads it soon enough: device time is charged as wall time until its
        first launch is seen, and an open gate needs no heartbeat. A loop that woke every
        5 ms for every running workload cost a core ~4 % per node doing nothing."""
        sharers = self._sharers()
        for record in self._records.values():
            if record.gate is None:
                continue
            if record.state is not RunState.RUNNING:
                return True
            if record.cuda and not self._alone_and_fair(record.spec, sharers):
                return True
        return False

    def _sharers(self) -> dict[str, int]:
        """GPU uuid -> how many governed workloads hold a share of it."""
        sharers: dict[str, int] = {}
        for record in self._records.values():
            for uuid in record.spec.gpu_uuids:
                sharers[uuid] = sharers.get(uuid, 0) + 1
        return sharers

    def _alone_and_fair(self, spec: GovernedWorkload, sharers: Mapping[str, int]) -> bool:
        """Whether ``spec`` is the only workload on each of its GPUs, each with a fair share
        (nothing to slice: its launches need no bound and no fast look)."""
        return all(sharers[u] == 1 for u in spec.gpu_uuids) and all(
            (spec.mode or self._gpus[u].mode) is ComputeMode.FAIR for u in spec.gpu_uuids
        )

    def _setup_thread(self) -> None:
        cfg = self.config
        if cfg.cpu is not None:
            try:
                os.sched_setaffinity(0, {cfg.cpu})
            except OSError as exc:
                log.warning("governor: cannot pin to CPU %d: %s", cfg.cpu, exc)
        if cfg.realtime_priority is not None:
            try:
                policy = os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0)
                os.sched_setscheduler(0, policy, os.sched_param(cfg.realtime_priority))
            except (OSError, AttributeError) as exc:
                log.warning("governor: cannot use SCHED_FIFO: %s", exc)

    def _wait(self, wake_ns: int) -> None:
        timeout = max(0, wake_ns - self._clock()) / 1e9
        fds = [self._wake_r]
        if self.listener is not None:
            fds.append(self.listener.fileno())
        poller = select.poll()  # not select(): it refuses descriptors above 1023
        for fd in fds:
            poller.register(fd, select.POLLIN)
        with contextlib.suppress(InterruptedError, OSError, ValueError):
            ready = {fd for fd, _ in poller.poll(timeout * 1000)}
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)

    def _poke(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _step(self) -> Plan:
        now = self._clock()
        if self.listener is not None:
            self._apply_hints(self.listener.receive(), now)
        self._poll_gates(now)
        if now >= self._next_obey:
            self._check_attached()
            self._check_obeyed()
            self._next_obey = now + int(self.config.obey_poll_s * 1e9)
        if now >= self._next_poll:
            self._poll_nvml(now)
            self._next_poll = now + int(self.config.activity_poll_s * 1e9)
        cfg = self.config.planner
        if now >= self._period_start + cfg.period_ns:
            boundary = now - (now - self._period_start) % cfg.period_ns
            for record in self._records.values():
                record.charge(boundary)
            carried = {wid: self._carried(r) for wid, r in self._records.items()}
            for wid, record in self._records.items():
                record.used_ns = carried[wid]
                record.steady = True
            self._period_start = boundary
        for record in self._records.values():
            record.charge(now)
        self._share_gpu_time(now)
        for record in self._records.values():
            if now - record.samples[-1][0] >= ACHIEVED_SAMPLE_NS:
                record.samples.append((now, record.share_ns))
                window = int(self.config.achieved_window_s * 1e9)
                while len(record.samples) > 2 and now - record.samples[1][0] >= window:
                    record.samples.popleft()
        state = NodeState(
            config=cfg,
            gpus=self._gpus,
            workloads=[self._planner_view(r) for r in self._records.values()],
            period_start_ns=self._period_start,
            leases=self._leases,
        )
        decided = plan(now, state)
        self._execute(decided)
        self._end_holds(decided)
        self._leases = dict(decided.leases)
        self.last_plan = decided
        return decided

    def _carried(self, record: _Record) -> int:
        """What a workload's new period starts with already used: nothing, except for a
        workload held at launch whose device time went past its budget (the work in flight
        when its gate closed, a late wake-up of this loop): that counts against its next
        period, so that in the long run it gets its share of the device time. The budget is
        the planner's (``plan.py``): in ``strict`` mode ``share * period / 1000``; in ``fair``
        mode its part of what the strict ones leave among the busy ones, which holds only while
        the same workloads stay busy, so a fair workload carries nothing after a period in
        which a neighbour went busy or idle (idle time is free to take). At most one period
        is carried."""
        if not record.cuda:
            return 0
        spec = record.spec
        period = self.config.planner.period_ns
        budgets = []
        for uuid, share in zip(spec.gpu_uuids, spec.compute_milli, strict=True):
            if (spec.mode or self._gpus[uuid].mode) is ComputeMode.STRICT:
                budgets.append(share * period // MILLI)
                continue
            s_strict = s_fair = 0
            for other in self._records.values():
                if uuid not in other.spec.gpu_uuids:
                    continue
                if not other.steady:
                    return 0
                if not other.busy:
                    continue
                theirs = other.spec.compute_milli[other.spec.gpu_uuids.index(uuid)]
                if (other.spec.mode or self._gpus[uuid].mode) is ComputeMode.STRICT:
                    s_strict += theirs
                else:
                    s_fair += theirs
            if s_fair == 0:  # itself idle all period: nothing past a budget to carry
                return 0
            budgets.append(share * period * max(0, MILLI - s_strict) // (MILLI * s_fair))
        return min(max(0, record.used_ns - min(budgets)), period)

    def _planner_view(self, record: _Record) -> WorkloadState:
        spec = record.spec
        return WorkloadState(
            workload_id=spec.workload_id,
            shares=dict(zip(spec.gpu_uuids, spec.compute_milli, strict=True)),
            priority=spec.priority,
            mode=spec.mode,
            priority_policy=spec.priority_policy,
            busy=record.busy,
            squeezed_by=frozenset(spec.squeezed_by),
            borrowed=spec.borrowed,
            idle_since_ns=record.idle_since_ns,
            state=record.state,
            used_ns=record.used_ns,
        )

    def _execute(self, decided: Plan) -> None:
        """Freezes first, each confirmed (or timed out) before any thaw, so that two leases
        never overlap; then thaws. Priority events carry the time the freeze took effect."""
        freezing: list[tuple[_Record, Freeze]] = []
        for action in decided.actions:
            if not isinstance(action, Freeze):
                continue
            record = self._records[action.workload_id]
            record.blocker = decided.blockers.get(action.workload_id)
            if record.state is RunState.RUNNING:
                self._hold(record)
                self._freezes += 1
                freezing.append((record, action))
            else:
                previous = record.state
                record.enter(action.reason, self._clock())
                self._note(record, previous, action.reason, action.message, self._clock())
        timeout = self.config.confirm_timeout_s
        for record, action in freezing:
            confirmed = self._wait_held(record, timeout)
            stopped = self._clock()
            record.charge(stopped)  # it ran until the freeze took effect
            record.enter(action.reason, stopped)
            self._note(record, RunState.RUNNING, action.reason, action.message, stopped)
            if confirmed:
                record.slow_reported = False
            elif not record.slow_reported:  # once until a freeze is confirmed again
                record.slow_reported = True
                self.events.add(
                    self._wall(),
                    stopped,
                    record.spec.workload_id,
                    FREEZE_SLOW,
                    "freeze not confirmed",
                    (
                        f"launches in flight did not finish within {timeout * 1000:.0f} ms"
                        if record.cuda
                        else f"not all processes stopped within {timeout * 1000:.0f} ms"
                    ),
                )
        for action in decided.actions:
            if not isinstance(action, Thaw):
                continue
            waking = self._records[action.workload_id]
            before: RunState = waking.state
            self._release(waking)
            thawed = self._clock()
            waking.enter(RunState.RUNNING, thawed)
            waking.mark_ns = thawed
            waking.blocker = None
            self._note(waking, before, RunState.RUNNING, action.message, thawed)

    def _note(
        self,
        record: _Record,
        before: RunState,
        after: RunState,
        message: str,
        stamp: int,
    ) -> None:
        """Record the start and the end of a priority hold: one ``paused`` when it begins,
        one ``resumed`` when it ends. Share-based switches, and the floor leases of a
        compressed workload inside its hold, are too many to record."""
        wid = record.spec.workload_id
        if after is RunState.FROZEN_BY_PRIORITY:
            if not record.held:
                record.held = True
                reason = "compress" if message.startswith("compressed") else "priority"
                self.events.add(self._wall(), stamp, wid, PAUSED, reason, message)
            return
        # the end of a hold is seen in the plan's blockers (see _end_holds), not here: a
        # compressed workload is thawed and frozen for its floor leases inside its hold

    def _end_holds(self, decided: Plan) -> None:
        """One ``resumed`` event for each workload whose priority hold ended in this plan."""
        for wid, record in self._records.items():
            if record.held and wid not in decided.blockers:
                record.held = False
                text = "resumed: no higher-priority workload is busy on its GPUs"
                self.events.add(self._wall(), self._clock(), wid, RESUMED, "priority", text)

    # -- holding: at launch (interposer) or by freezing ----------------------------------------

    def _new_gate(self, segment: Segment) -> LaunchGate:
        return LaunchGate(segment, idle_ns=int(self.config.launch_idle_s * 1e9))

    def _hold(self, record: _Record) -> None:
        if record.cuda and record.gate is not None:
            record.gate.hold()
            record.held_us = int(self._wall() * 1e6)
            record.drained_us = None
        else:
            self.freezer.freeze(record.spec.handle)

    def _wait_held(self, record: _Record, timeout_s: float) -> bool:
        if record.cuda and record.gate is not None:
            return record.gate.wait_drained(timeout_s)
        return self.freezer.wait_frozen(record.spec.handle, timeout_s)

    def _release(self, record: _Record) -> None:
        record.held_us = record.drained_us = None
        if record.gate is not None:
            with contextlib.suppress(SegmentError, ValueError):
                record.gate.release()
        self.freezer.thaw(record.spec.handle)

    def _poll_gates(self, now: int) -> None:
        """Read the segments: who uses the interposer, who launches, device time; keep the
        agent's heartbeat and each workload's bound on launches in flight."""
        sharers = self._sharers()
        for record in self._records.values():
            gate = record.gate
            if gate is None:
                continue
            try:
                reading = gate.read()
            except (SegmentError, ValueError) as exc:
                # closed: its workload ended and the service let its segment go before this
                # loop heard (a routine race, not worth a warning)
                level = logging.DEBUG if gate.closed else logging.WARNING
                wid = record.spec.workload_id
                log.log(level, "governor: %s: segment unreadable (%s)", wid, exc)
                record.gate = None
                record.cuda = False
                continue
            spec = record.spec
            self._report_refusals(record, reading.stats)
            if reading.active and not record.cuda and not record.defiant:
                record.charge(now)  # wall time until now; device time from here on
                record.cuda = True
                if record.state is not RunState.RUNNING:  # held: from the freezer to the gate
                    gate.hold()
                    self.freezer.thaw(spec.handle)
            if not record.cuda:
                continue
            record.gpu_pending_ns += reading.gpu_time_ns
            record.reported_ns += reading.gpu_time_ns
            busy = reading.busy or record.hint_busy is True
            self._set_busy(record, busy, now, "interposer")
            alone = self._alone_and_fair(spec, sharers)
            with contextlib.suppress(SegmentError, ValueError):
                gate.set_max_inflight(0 if alone else self.config.max_inflight)

    def _check_obeyed(self) -> None:
        """Freeze, for good, a workload held at launch whose processes run kernels that its
        segment does not show.

        The gate only holds, and the segment only shows, what goes through the interposer;
        a process that does not (an ``exec`` without ``LD_PRELOAD``, its own driver calls)
        keeps running, and looks idle, so the planner would even leave it thawed. So the
        backend's per-process utilization (NVML) of a workload held at launch must show
        nothing, :attr:`GovernorConfig.obey_grace_s` after

        - its launches drained, while its gate is closed (as its segment says, or
          :attr:`GovernorConfig.obey_drain_s` after the gate closed if it never does);
        - it went idle, while it runs and its segment says it is idle.

        A process seen at :attr:`GovernorConfig.obey_percent` or more makes the workload
        ``defiant``: a ``gate-ignored`` event, frozen at once if its gate was closed, and
        from then on held by the freezer whenever the plan holds it, counted busy (its hints
        and segment are no longer believed) and charged wall time.
        """
        read = getattr(self.backend, "process_utilization_since", None)
        if read is None:
            return
        cfg = self.config
        grace_us = int(cfg.obey_grace_s * 1e6)
        for record in list(self._records.values()):
            gate = record.gate
            if not record.cuda or record.defiant or gate is None:
                continue
            now_us = int(self._wall() * 1e6)
            if self._under_reports(record, read, now_us):
                continue
            if record.state is RunState.RUNNING:
                if record.busy or record.idle_since_ns is None:
                    continue
                idle_for_us = max(0, self._clock() - record.idle_since_ns) // 1000
                since_us = now_us - idle_for_us + grace_us
            else:
                held_us = record.held_us
                if held_us is None:
                    continue
                if record.drained_us is None:
                    try:
                        drained = gate.segment.stats().inflight == 0
                    except (SegmentError, ValueError):
                        drained = True
                    if drained or now_us - held_us >= int(cfg.obey_drain_s * 1e6):
                        record.drained_us = now_us
                    continue
                since_us = record.drained_us + grace_us
            if now_us <= since_us:
                continue
            try:
                samples = read(since_us)
            except Exception as exc:
                log.debug("governor: NVML utilization unavailable: %s", exc)
                return
            pids = set(self.freezer.pids(record.spec.handle))
            # held, it must run nothing; said idle, a launch may still be finishing in the
            # sample, so only a busy share counts (a workload that only looks idle between
            # launches is not flagged)
            floor = (
                cfg.obey_percent
                if record.state is not RunState.RUNNING
                else max(cfg.obey_percent, round(cfg.obey_busy_fraction * 100))
            )
            seen = [s for s in samples if s.pid in pids and s.sm_percent >= floor]
            if seen:
                self._defiant(record, seen[0].pid, seen[0].gpu_uuid, seen[0].sm_percent)

    def _under_reports(
        self, record: _Record, read: Callable[[int], list[ProcessUtilization]], now_us: int
    ) -> bool:
        """Compare, once per :attr:`GovernorConfig.obey_window_s`, the device time the
        workload's segment reported with NVML's utilization of its processes over the same
        window (the mean of the samples, per GPU, summed over its processes; the most on one
        GPU, as its device time is). A workload busy by NVML that reported too little wrote
        its own counter down to be charged less: it becomes ``defiant``. True when it did."""
        cfg = self.config
        if record.window_us is None:
            record.window_us, record.reported_ns = now_us, 0
            return False
        span_us = now_us - record.window_us
        if span_us < int(cfg.obey_window_s * 1e6):
            return False
        since_us, reported = record.window_us, record.reported_ns
        record.window_us, record.reported_ns = now_us, 0
        try:
            samples = read(since_us)
        except Exception as exc:
            log.debug("governor: NVML utilization unavailable: %s", exc)
            return False
        pids = set(self.freezer.pids(record.spec.handle))
        per_gpu: dict[str, int] = {}
        for s in samples:
            if s.pid in pids:
                per_gpu[s.gpu_uuid] = per_gpu.get(s.gpu_uuid, 0) + s.sm_percent
        if not per_gpu:
            return False
        uuid, percent = max(per_gpu.items(), key=lambda kv: kv[1])
        measured_ns = min(percent, 100) * span_us * 10  # percent of span_us, in ns
        if measured_ns < cfg.obey_busy_fraction * span_us * 1000:
            return False
        if reported >= cfg.obey_report_ratio * measured_ns:
            return False
        pid = next(s.pid for s in samples if s.pid in pids and s.gpu_uuid == uuid)
        self._defiant(
            record,
            pid,
            uuid,
            min(percent, 100),
            f"while its segment reported {reported / measured_ns:.0%} of that device time",
        )
        return True

    def _defiant(
        self,
        record: _Record,
        pid: int,
        uuid: str,
        percent: int,
        why: str | None = None,
        *,
        bypass: Bypass | None = None,
    ) -> None:
        now = self._clock()
        held = record.state is not RunState.RUNNING
        record.defiant = True
        record.cuda = False
        record.held_us = record.drained_us = record.window_us = None
        self._set_busy(record, True, now, "nvml")
        if held:
            self.freezer.freeze(record.spec.handle)
        self._bypass.forget(record.spec.workload_id)
        kind = self.freezer.kind
        log.warning(
            "governor: %s ran kernels past the interposer's account (pid %d, %s); frozen",
            record.spec.workload_id,
            pid,
            uuid,
        )
        if bypass is not None:
            reason = "interposer bypassed"
            text = (
                f"process {pid} used {uuid} ({bypass.used_mib} MiB there) for "
                f"{bypass.seen_s:.1f} s without the interposer (it holds no entry of the "
                f"workload's segment: started without LD_PRELOAD, or the driver loaded "
                f"another way), so its launches never met the gate"
            )
        else:
            reason = "launch gate ignored"
            when = why or (
                "while its launches were held" if held else "while its launches said idle"
            )
            text = (
                f"process {pid} kept {uuid} {percent}% busy {when}: it does not go through "
                f"the interposer or rewrites its counters"
            )
        self.events.add(
            self._wall(),
            now,
            record.spec.workload_id,
            GATE_IGNORED,
            reason,
            f"{text}; held by the freezer ({kind}) from now on",
        )

    def _check_attached(self) -> None:
        """Make ``defiant`` (as :meth:`_check_obeyed` does) a workload held at launch one of
        whose processes is on a GPU without holding an entry of its segment for
        :attr:`GovernorConfig.bypass_grace_s` (:mod:`fgpu.agent.governor.bypass`). Only
        backends with per-process figures (NVML, the fake driver) are looked at."""
        if getattr(self.backend, "process_utilization_since", None) is None:
            return
        records = [
            r for r in self._records.values() if r.cuda and not r.defiant and r.gate is not None
        ]
        if not records or self.backend is None:
            return
        try:
            usage = self.backend.process_memory()
        except Exception as exc:
            log.debug("governor: NVML process list unavailable: %s", exc)
            return
        now = self._clock()
        for record in records:
            wid = record.spec.workload_id
            pids = set(self.freezer.pids(record.spec.handle))
            mine = [p for p in usage if p.pid in pids]
            if not mine or record.gate is None:
                self._bypass.forget(wid)
                continue
            try:
                entries = record.gate.segment.processes()
            except (SegmentError, ValueError):
                continue
            found = self._bypass.look(wid, mine, entries, now)
            if found is not None:
                self._defiant(record, found.pid, found.gpu_uuid, 0, bypass=found)

    def _report_refusals(self, record: _Record, stats: SegmentStats) -> None:
        """One ``memory-refused`` event per look at the segment that found new refusals."""
        for gpu in stats.gpus:
            seen = record.oom_seen.get(gpu.uuid, 0)
            if gpu.oom_count <= seen:
                continue
            record.oom_seen[gpu.uuid] = gpu.oom_count
            count = gpu.oom_count - seen
            self.events.add(
                self._wall(),
                self._clock(),
                record.spec.workload_id,
                MEMORY_REFUSED,
                "memory quota",
                f"{count} allocation{'s' if count > 1 else ''} refused on {gpu.uuid} "
                f"(out of memory for the program): the last asked "
                f"{-(-gpu.oom_last_bytes // 2**20)} MiB; its quota is "
                f"{gpu.memory_limit // 2**20} MiB, the most it held {gpu.memory_peak // 2**20} MiB",
            )

    def _drop(self, record: _Record) -> None:
        record.charge(self._clock())
        if record.gate is not None:
            with contextlib.suppress(SegmentError, ValueError):
                record.gate.release()
        self.freezer.release(record.spec.handle)
        self._bypass.forget(record.spec.workload_id)
        del self._records[record.spec.workload_id]

    # -- activity ----------------------------------------------------------------------------

    def _apply_hints(self, hints: list[Hint], now: int) -> None:
        listener = self.listener
        for hint in hints:
            message = hint.message
            record = self._records.get(message.workload_id)
            if record is None or not self.freezer.owns(record.spec.handle, hint.pid):
                if listener is not None:
                    listener.dropped += 1
                continue
            if message.kind == "memory":
                self._memory_report(record, hint)
                continue
            if record.cuda:  # launches count too: merged at the next look at the segment
                record.hint_busy = message.kind == "busy"
                continue
            if record.defiant:  # counted busy: its word is no longer taken
                continue
            self._set_busy(record, message.kind == "busy", now, "hints")

    def _set_busy(self, record: _Record, busy: bool, now: int, source: str) -> None:
        record.activity = source
        if busy == record.busy:
            return
        record.steady = False
        record.charge(now)
        record.busy = busy
        record.idle_since_ns = None if busy else now

    def _memory_report(self, record: _Record, hint: Hint) -> None:
        backend = self.backend
        if not isinstance(backend, SimulatedBackend):
            return  # real GPUs: NVML measures memory
        gpus = record.spec.gpu_uuids
        gpu = hint.message.gpu
        if gpu is None:
            uuid = gpus[0]
        elif isinstance(gpu, int):
            if not 0 <= gpu < len(gpus):
                return
            uuid = gpus[gpu]
        else:
            if gpu not in gpus:
                return
            uuid = gpu
        backend.report_usage(hint.pid, uuid, hint.message.mib)

    def _poll_nvml(self, now: int) -> None:
        read = getattr(self.backend, "process_utilization", None)
        if read is None or isinstance(self.backend, SimulatedBackend):
            return
        try:
            samples = read()
        except Exception as exc:
            log.debug("governor: NVML utilization unavailable: %s", exc)
            return
        busy_pids = {s.pid for s in samples if s.sm_percent >= self.config.nvml_busy_percent}
        for record in self._records.values():
            if record.cuda or record.activity == "hints" or record.state is not RunState.RUNNING:
                continue  # launches and hints win; a frozen workload cannot be measured
            pids = self.freezer.pids(record.spec.handle)
            self._set_busy(record, any(p in busy_pids for p in pids), now, "nvml")

    def _share_gpu_time(self, now: int) -> None:
        """Add to each workload's ``share_ns`` its part of its GPUs' time since the last step.

        Its part is the run time it was charged since then (wall time running while busy,
        or the device time its interposer reported), except on a GPU whose workloads were
        charged more than the wall time that passed: they ran at once and split the GPU, so
        their times are scaled down in proportion until they add up to the time that
        passed (a workload on several GPUs takes the most crowded one's scale). So the
        achieved shares of one GPU's workloads never add up to more than 1.
        """
        span = now - self._shared_at
        self._shared_at = max(self._shared_at, now)
        charged: dict[str, int] = {}
        for wid, record in self._records.items():
            charged[wid] = max(0, record.total_ns - record.counted_ns)
            record.counted_ns = record.total_ns
        if span <= 0:
            return
        load: dict[str, int] = {}
        for wid, record in self._records.items():
            for gpu in record.spec.gpu_uuids:
                load[gpu] = load.get(gpu, 0) + charged[wid]
        for wid, record in self._records.items():
            part = charged[wid]
            crowded = max((load[g] for g in record.spec.gpu_uuids), default=0)
            record.share_ns += part if crowded <= span else part * span // crowded

    # -- views -------------------------------------------------------------------------------

    def _view(self, record: _Record, now: int, since: int | None = None) -> WorkloadView:
        """The governor's view of one workload; its achieved share is its part of the GPU's
        time from ``since`` (when the first of the GPU's workloads came, within the window)
        to the last step, so that the parts of one GPU's workloads add up to at most 1."""
        spec = record.spec
        end = self._shared_at  # share_ns is counted up to the last step
        window = int(self.config.achieved_window_s * 1e9)
        start = max(end - window, record.samples[0][0] if since is None else since)
        start_total = 0  # nothing before it was governed
        for stamp, value in record.samples:  # the last sample at or before the start
            if stamp > start:
                break
            start_total = value
        span = end - start
        achieved = (record.share_ns - start_total) * MILLI // span if span > 0 else 0
        modes = tuple(str(spec.mode or self._gpus[g].mode) for g in spec.gpu_uuids)
        return WorkloadView(
            workload_id=spec.workload_id,
            gpu_uuids=spec.gpu_uuids,
            compute_milli=spec.compute_milli,
            priority=spec.priority,
            modes=modes,
            state=record.state,
            busy=record.busy,
            activity=record.activity,
            achieved_milli=min(MILLI, achieved),
            blocker=record.blocker,
            enforcement="interposer" if record.cuda else self.freezer.kind,
            paused_ns=record.paused_ns(now),
        )


__all__ = [
    "GovernedWorkload",
    "Governor",
    "GovernorConfig",
    "GovernorSnapshot",
    "WorkloadView",
]

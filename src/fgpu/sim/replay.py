"""The dynamic simulator: arrivals and departures on a virtual clock, driving the decision core.

:func:`run_replay` is a shell around :class:`fgpu.sched.decide.Scheduler` (DESIGN.md
sections 1-2: the core decides, the shells execute). Time is virtual: nothing here reads a
clock. The loop:

1. take the earliest event time ``t`` and handle every event at ``t``: arrivals (the
   workload becomes pending), finishes (its allocation is released), victim exits (a
   preempted workload's grace period is over: its allocation is released and it returns
   to pending with its original submission time), ticks;
2. call ``decide(t, ...)`` once, with the real cluster state, every pending and running
   workload, and the holds of the previous round;
3. execute the actions: ``Place`` binds the allocation on the real state and schedules the
   finish ``duration_s`` later; ``Preempt`` marks the victim terminating and schedules its
   exit ``grace_s`` later; ``Wait`` records the reason;
4. record a timeline sample (allocated GPU and fair share per queue, pending count).

A preempted workload restarts from scratch: when placed again it needs its whole run time;
the work it had done is counted as wasted (``wasted_gpu_hours``: done seconds x its GPU
share). A victim whose own run ends within its grace period finishes normally.

**Squeezed work** (``Squeeze``/``Unsqueeze``, :mod:`fgpu.sched.squeeze`) keeps running with
its memory and progresses at the rate the node's governor gives it under the ``pause``
policy: it runs only while none of the workloads that squeezed it is busy. Each workload is
busy a fraction of the time, its *duty cycle* (:class:`DutyCycles`: the inference class,
priority ``critical``, is busy in bursts, ``inference_duty`` of the time; the training
classes are always busy, ``training_duty``), and bursts of different workloads are taken as
independent, so the rate is the product of ``1 - duty`` over its squeezers (0 under an
always-busy one). Workloads whose compute is granted progress at full rate (the replay
does not model the governor's pause among workloads whose compute fits together, as
before). The run stops at
the horizon; what is still pending or running then is unfinished.

**Suspended work** (``Suspend``/``Restore``, rule 9 of :mod:`fgpu.sched.decide`): with
``suspendable`` every workload can be checkpointed. A ``Suspend`` stops the victim's
progress at once and charges its host memory to its node's suspend budget; the victim keeps
its allocation while its GPU memory is copied to host at ``host_link_mib_s`` (the copy
time is its GPU memory over the bandwidth), then releases it and waits suspended with the
run time it had left. A ``Restore`` takes the allocation at once; progress resumes after
the copy back (the same bandwidth) and the budget is freed then. A suspended workload is
never dropped: it waits until it is restored or the run ends.

**Goodput** (the measure of preemption policy, DESIGN.md section 5): GPU-seconds allocated
minus the work lost to evictions (``wasted``) minus the GPU-seconds held while copying to or
from host memory (``copy``), over the fleet's GPU-seconds; ``ReplayResult`` keeps the
lost parts per queue and :func:`fgpu.sim.replay_report.summarize_replay` computes it.

:func:`parse_gpus` turns ``--gpus 64xA100-80GB`` into nodes; :func:`tenant_queues` builds
the equal-quota tenants of ``fgpu sim replay``.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from fgpu.model.catalog import UnknownGpuModelError, gpu_model
from fgpu.model.types import Allocation, InvalidRequestError, Node, Request
from fgpu.plugins import create_policy
from fgpu.sched.decide import Decision, Scheduler, SchedulerConfig
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.placer import seeded_rank
from fgpu.sched.policy import PlacementPolicy
from fgpu.sched.squeeze import check_squeeze_invariants, execute_squeeze, held_allocation
from fgpu.sched.state import ClusterState, check_invariants
from fgpu.sched.workload import (
    PRIORITY_CLASSES,
    Hold,
    Holds,
    Place,
    Preempt,
    QueueSpec,
    QueueTree,
    Resources,
    Restore,
    Squeeze,
    Suspend,
    Unsqueeze,
    Wait,
    Workload,
)
from fgpu.sim.workloads import SimWorkload

GPUS_PER_NODE = 8
"""GPUs per simulated node; a count that is not a multiple makes one smaller node."""

CPU_MILLI_PER_GPU = 16_000
"""Host CPU per simulated GPU: 128 cores per 8-GPU node (a DGX A100-class server)."""

MEMORY_MIB_PER_GPU = 128 * 1024
"""Host memory per simulated GPU: 1 TiB per 8-GPU node."""

MAX_ROUNDS_AT_ONE_TIME = 1000
"""Decision rounds allowed at one virtual time before the run is stopped as a loop."""

_GPU_PART = re.compile(r"^\s*(\d+)\s*[xX]\s*(\S+?)\s*$")

_ARRIVE, _FINISH, _EXIT, _TICK, _SUSPENDED, _RESTORED = 0, 1, 2, 3, 4, 5

HOST_LINK_MIB_S = 25_000 * 10**6 // 2**20
"""Default host-link bandwidth of the suspend copy: 25 GB/s (a PCIe 4.0 x16 link's order of
magnitude) in MiB per second."""
"""Event kinds; at one time they are handled in this order (all before the round)."""


@dataclass(frozen=True, slots=True)
class DutyCycles:
    """Fractions of the time workloads are busy on their GPU (the replay's activity model).

    Attributes:
        inference_duty: the inference class (priority ``critical`` and above): busy in
            bursts, this fraction of the time (default 0.3).
        training_duty: every other class (training, batch): default 1.0, always busy.

    Raises:
        ValueError: a value outside [0, 1].
    """

    inference_duty: float = 0.3
    training_duty: float = 1.0

    def __post_init__(self) -> None:
        for name in ("inference_duty", "training_duty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"{name} must be a number in 0..1, got {value}")

    def of(self, priority: int) -> float:
        """The duty cycle of a workload of ``priority``."""
        if priority >= PRIORITY_CLASSES["critical"]:
            return self.inference_duty
        return self.training_duty


class GpuSpecError(ValueError):
    """A ``--gpus`` value that cannot be read; the message names the option."""


class ReplayError(RuntimeError):
    """The decision core broke its contract (an impossible action, a loop); says which."""


class DecisionCore(Protocol):
    """What the engine needs of a scheduler: :class:`fgpu.sched.decide.Scheduler` fits."""

    @property
    def policy(self) -> PlacementPolicy: ...

    def decide(
        self,
        now: float,
        state: ClusterState,
        queues: QueueTree,
        workloads: Sequence[Workload],
        holds: Holds | None = None,
    ) -> Decision: ...


# ----------------------------------------------------------------------------- setup
def parse_gpus(text: str) -> list[Node]:
    """Nodes from ``--gpus``: ``"64xA100-80GB"`` or ``"2xA100-40GB,1xH100-80GB"``.

    Each ``COUNTxMODEL`` part becomes ``COUNT // 8`` nodes of :data:`GPUS_PER_NODE` GPUs
    and, for a remainder, one node with the rest. Every node has
    :data:`CPU_MILLI_PER_GPU` and :data:`MEMORY_MIB_PER_GPU` per GPU (128 cores and 1 TiB
    per 8-GPU node). Nodes are named ``<model>-<n>`` in lower case, numbered per model
    from 1 across all parts (``a100-80gb-1``).

    Raises:
        GpuSpecError: an empty value, a part that is not ``COUNTxMODEL``, a count below 1,
            or a model not in the catalog (the message lists the known ones).
    """
    if not text.strip():
        raise GpuSpecError("--gpus: empty; expected COUNTxMODEL, e.g. 64xA100-80GB")
    nodes: list[Node] = []
    numbers: dict[str, int] = {}
    for part in text.split(","):
        match = _GPU_PART.match(part)
        if match is None:
            raise GpuSpecError(
                f"--gpus: {part.strip()!r} is not COUNTxMODEL (e.g. 64xA100-80GB or "
                "2xA100-40GB,1xH100-80GB)"
            )
        count, name = int(match.group(1)), match.group(2)
        if count < 1:
            raise GpuSpecError(f"--gpus: {part.strip()!r}: the GPU count must be at least 1")
        try:
            model = gpu_model(name)
        except UnknownGpuModelError as exc:
            reason = str(exc).removeprefix("gpu_model: ")
            raise GpuSpecError(f"--gpus: {reason}") from None
        sizes = [GPUS_PER_NODE] * (count // GPUS_PER_NODE)
        if count % GPUS_PER_NODE:
            sizes.append(count % GPUS_PER_NODE)
        for size in sizes:
            numbers[model.name] = numbers.get(model.name, 0) + 1
            nodes.append(
                Node(
                    name=f"{model.name.lower()}-{numbers[model.name]}",
                    cpu_milli=CPU_MILLI_PER_GPU * size,
                    memory_mib=MEMORY_MIB_PER_GPU * size,
                    gpu_count=size,
                    gpu_model=model.name,
                    gpu_memory_mib=model.memory_mib,
                )
            )
    return nodes


def tenant_queues(names: Sequence[str], nodes: Sequence[Node]) -> QueueTree:
    """Top-level queues with equal quotas: each gets 1/len(names) of every resource.

    Quotas are floored to integer units (64 GPUs over 3 tenants: 21333 milli each); weight 1,
    priority 0, no limit.

    Raises:
        ValueError: no names.
        InvalidRequestError: duplicate names.
    """
    if not names:
        raise ValueError("at least one queue is needed")
    n = len(names)
    gpu = sum(node.gpu_count for node in nodes) * 1000 // n
    cpu = sum(node.cpu_milli for node in nodes) // n
    memory = sum(node.memory_mib for node in nodes) // n
    quota = Resources(gpu_milli=gpu, cpu_milli=cpu, memory_mib=memory)
    return QueueTree(QueueSpec(name, quota=quota) for name in names)


def build_scheduler(
    policy: str,
    nodes: Sequence[Node],
    shapes: Sequence[Request],
    config: SchedulerConfig,
    rng: np.random.Generator,
) -> Scheduler:
    """The decision core for a replay: ``policy`` with a target workload and a seeded rank.

    The target workload of fragmentation-aware policies is built from ``shapes`` (the pod
    list, or the workload file's requests; requests whose share is derived from GPU memory
    are left out, the measure needs explicit shares). The tie-break rank of the nodes is a
    seeded permutation (:func:`fgpu.sched.placer.seeded_rank`); both draw from ``rng``.

    Raises:
        UnknownPolicyError: ``policy`` is not registered.
        ValueError: the policy needs a target workload and no shape has an explicit share.
    """
    explicit = [r for r in shapes if not (r.gpu_count and r.gpu_milli is None)]
    target = TargetWorkload.from_requests(explicit) if explicit else None
    placement = create_policy(policy, target=target, rng=rng)
    rank = seeded_rank([n.name for n in nodes], rng)
    return Scheduler(placement, config, rank)


# ----------------------------------------------------------------------------- results
@dataclass(slots=True)
class WorkloadRecord:
    """What happened to one workload.

    Attributes:
        id, queue, priority, submit_s, duration_s: from the input.
        gpu_milli: its GPU request summed over its GPUs (0 when derived from memory).
        starts: every start time, in order (several after preemptions).
        finish_s: when it finished (None: unfinished at the horizon, or never arrived).
        evictions: how often it was stopped as a victim (preemption or reclaim) and exited.
        wait_reason: the last reason the core gave for keeping it waiting ("" if none).
        squeezes: how often it was squeezed (a first squeeze; changes of squeezers and
            releases are not counted).
        wasted_s: run seconds (at full rate) lost to its evictions.
        gpu_count: how many GPUs it asks for (0: CPU only).
        suspends: how often it was suspended (and its copy to host completed or began).
        restores: how often it was restored.
    """

    id: str
    queue: str
    priority: int
    submit_s: float
    duration_s: float
    gpu_milli: int
    starts: list[float] = field(default_factory=list)
    finish_s: float | None = None
    evictions: int = 0
    wait_reason: str = ""
    squeezes: int = 0
    wasted_s: float = 0.0
    gpu_count: int = 0
    suspends: int = 0
    restores: int = 0

    @property
    def first_start_s(self) -> float | None:
        """When it first started, or None."""
        return self.starts[0] if self.starts else None


@dataclass(frozen=True, slots=True)
class Eviction:
    """One Preempt action of the core, as the replay executed it.

    Attributes:
        time_s: virtual time of the round that decided it.
        kind: ``preemption`` (inside a queue) or ``reclaim`` (across queues).
        preemptor, victim: workload ids.
    """

    time_s: float
    kind: str
    preemptor: str
    victim: str


@dataclass(frozen=True, slots=True)
class TimelineSample:
    """The cluster after one decision round (per-queue values in ``ReplayResult.queues``
    order, GPU milli)."""

    time_s: float
    allocated_milli: tuple[int, ...]
    fair_share_milli: tuple[int, ...]
    pending: int
    running: int


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Everything a replay recorded.

    Attributes:
        horizon_s: simulated time in seconds.
        capacity_gpu_milli: cluster GPU capacity.
        queues: leaf queue names, the order of the timeline's per-queue tuples.
        records: one per input workload, in input order (arrived or not).
        timeline: one sample at time 0 and one after every decision round.
        preemptions: Preempt actions of kind ``preemption`` (inside a queue).
        reclaims: Preempt actions of kind ``reclaim`` (across queues).
        evictions: all Preempt actions (suspensions are not evictions).
        squeezes: Squeeze actions that squeezed a workload not squeezed before.
        wasted_gpu_hours: work lost by evictions, GPU-hours (done seconds x GPU share).
        eviction_log: every Preempt action, in order (``evictions`` entries).
        rounds: decision rounds.
        warnings: distinct configuration warnings of the core, in first-seen order.
        suspends: Suspend actions; restores: Restore actions.
        wasted_gpu_hours_by_queue: ``wasted_gpu_hours`` per queue (``queues`` order).
        copy_gpu_hours: GPU-hours held while copying suspended work to or from host memory.
        copy_gpu_hours_by_queue: the same per queue (``queues`` order).
    """

    horizon_s: float
    capacity_gpu_milli: int
    queues: tuple[str, ...]
    records: tuple[WorkloadRecord, ...]
    timeline: tuple[TimelineSample, ...]
    preemptions: int
    reclaims: int
    evictions: int
    rounds: int
    warnings: tuple[str, ...]
    squeezes: int = 0
    wasted_gpu_hours: float = 0.0
    eviction_log: tuple[Eviction, ...] = ()
    suspends: int = 0
    restores: int = 0
    wasted_gpu_hours_by_queue: tuple[float, ...] = ()
    copy_gpu_hours: float = 0.0
    copy_gpu_hours_by_queue: tuple[float, ...] = ()


# ----------------------------------------------------------------------------- engine
class _Engine:
    """Mutable state of one replay; :func:`run_replay` is the public face."""

    def __init__(
        self,
        nodes: Sequence[Node],
        queues: QueueTree,
        workloads: Sequence[SimWorkload],
        scheduler: DecisionCore,
        horizon_s: float,
        grace_s: float,
        tick_s: float | None,
        debug: bool,
        duty: DutyCycles,
        suspendable: bool = False,
        host_link_mib_s: float = HOST_LINK_MIB_S,
    ) -> None:
        self.state = ClusterState(nodes)
        self.duty = duty
        self.suspendable = suspendable
        self.host_link_mib_s = host_link_mib_s
        self.run_epoch: dict[str, int] = {}
        """id -> number of its Place and Restore actions (stale exits and copies ignored)."""
        self.suspends = 0
        self.restores = 0
        # progress of running workloads: id -> [remaining run seconds, rate, since]
        self.progress: dict[str, list[float]] = {}
        self.remaining: dict[str, float] = {}
        """id -> run seconds a suspended workload has left."""
        self.suspending: dict[str, int] = {}
        """id -> host MiB charged for a victim whose copy to host is under way."""
        self.restoring: dict[str, int] = {}
        """id -> host MiB still charged for a workload whose copy back is under way."""
        self.finish_version: dict[str, int] = {}
        self.squeezes = 0
        self.wasted_milli_s = 0.0
        self.queues = queues
        self.queue_names = tuple(queues.leaves)
        self.wasted_by_queue = [0.0] * len(self.queue_names)
        self.copy_by_queue = [0.0] * len(self.queue_names)
        self.queue_pos = {name: i for i, name in enumerate(self.queue_names)}
        self.scheduler = scheduler
        self.horizon_s = horizon_s
        self.grace_s = grace_s
        self.tick_s = tick_s
        self.debug = debug
        self.inputs = {w.id: w for w in workloads}
        self.records = {
            w.id: WorkloadRecord(
                w.id,
                w.queue,
                w.priority,
                w.submit_s,
                w.duration_s,
                w.request.total_gpu_milli,
                gpu_count=w.request.gpu_count,
            )
            for w in workloads
        }
        # Pending and running workloads, as the core sees them, in arrival order.
        self.live: dict[str, Workload] = {}
        self.pending = 0
        self.allocated = [0] * len(self.queue_names)
        self.holds: dict[str, Hold] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        self.tick_at: float | None = None
        self.now = 0.0
        self.timeline: list[TimelineSample] = [
            TimelineSample(0.0, (0,) * len(self.queue_names), (0,) * len(self.queue_names), 0, 0)
        ]
        self.preemptions = 0
        self.reclaims = 0
        self.evictions = 0
        self.eviction_log: list[Eviction] = []
        self.rounds = 0
        self.warnings: dict[str, None] = {}
        for w in workloads:
            self.push(w.submit_s, _ARRIVE, w.id, 0)

    def push(self, time_s: float, kind: int, wid: str, epoch: int) -> None:
        heapq.heappush(self.events, (time_s, kind, self.seq, wid, epoch))
        self.seq += 1

    # -------------------------------------------------------------- events
    def handle(self, kind: int, wid: str, epoch: int) -> None:
        if kind == _TICK:
            self.tick_at = None
            return
        if kind == _ARRIVE:
            w = self.inputs[wid]
            self.live[wid] = Workload(
                id=wid,
                queue=w.queue,
                request=w.request,
                priority=w.priority,
                submitted_at=w.submit_s,
                suspendable=self.suspendable,
                user=w.user,
            )
            self.pending += 1
            return
        current = self.live.get(wid)
        if current is None or current.allocation is None:
            return
        if kind == _FINISH:
            # a finish planned before the workload's rate changed (or an earlier run) is stale
            if epoch != self.finish_version.get(wid):
                return
            self.release(current)
            del self.live[wid]
            del self.progress[wid]
            self.records[wid].finish_s = self.now
            return
        # _EXIT (or a copy) of an earlier run (before a preemption) is stale
        if epoch != self.run_epoch.get(wid, 0):
            return
        if kind == _SUSPENDED:
            self.suspended(current)
            return
        if kind == _RESTORED:
            self.set_rate(wid, self.squeezed_rate(current) if current.squeezed else 1.0)
            self.state.free_suspended(current.allocation.node, self.restoring.pop(wid))
            return
        # _EXIT: the victim's grace period is over; it starts over later.
        remaining, rate, since = self.progress.pop(wid)
        done = self.inputs[wid].duration_s - (remaining - rate * (self.now - since))
        record = self.records[wid]
        record.wasted_s += done
        self.wasted_milli_s += done * record.gpu_milli
        self.wasted_by_queue[self.queue_pos[record.queue]] += done * record.gpu_milli
        if wid in self.restoring:  # evicted while its memory came back: the copy is gone
            self.state.free_suspended(current.allocation.node, self.restoring.pop(wid))
        self.finish_version[wid] = self.finish_version.get(wid, 0) + 1
        self.release(current)
        record.evictions += 1
        self.live[wid] = replace(
            current,
            allocation=None,
            started_at=None,
            terminating=False,
            squeezed=False,
            squeezed_by=(),
        )
        self.pending += 1

    def copy_s(self, allocation: Allocation) -> float:
        """Seconds to copy ``allocation``'s GPU memory over the host link."""
        return sum(allocation.gpu_memory_mib) / self.host_link_mib_s

    def suspended(self, w: Workload) -> None:
        """The copy to host is done: release the allocation; wait suspended, progress kept."""
        assert w.allocation is not None
        remaining, rate, since = self.progress.pop(w.id)
        self.remaining[w.id] = max(0.0, remaining - rate * (self.now - since))
        self.finish_version[w.id] = self.finish_version.get(w.id, 0) + 1
        self.release(w)
        host = self.suspending.pop(w.id)
        self.live[w.id] = replace(
            w,
            allocation=None,
            started_at=None,
            terminating=False,
            squeezed=False,
            squeezed_by=(),
            suspended_on=w.allocation.node_name,
            suspended_host_mib=host,
            suspended_gpus=w.allocation.gpus,
        )
        self.pending += 1

    def release(self, w: Workload) -> None:
        assert w.allocation is not None
        held = held_allocation(w)
        self.state.release(held)
        self.scheduler.policy.on_release(self.state, w.allocation)
        self.allocated[self.queue_pos[w.queue]] -= sum(held.gpu_milli)

    def set_rate(self, wid: str, rate: float) -> None:
        """Change a running workload's progress rate from now on and plan its finish."""
        entry = self.progress[wid]
        remaining, old, since = entry
        remaining = max(0.0, remaining - old * (self.now - since))
        self.progress[wid] = [remaining, rate, self.now]
        version = self.finish_version.get(wid, 0) + 1
        self.finish_version[wid] = version
        if rate > 0:
            self.push(self.now + remaining / rate, _FINISH, wid, version)

    def squeezed_rate(self, w: Workload) -> float:
        """The governor's rate for squeezed ``w``: runs while none of its squeezers is busy."""
        rate = 1.0
        for b in w.squeezed_by:
            other = self.live.get(b)
            if other is not None and other.allocation is not None:
                rate *= 1.0 - self.duty.of(other.priority)
        return rate

    # -------------------------------------------------------------- actions
    def execute(self, now: float, decision: Decision) -> None:
        self.touched: set[str] = set()
        for action in decision.actions:
            if isinstance(action, Place):
                self.place(now, action)
            elif isinstance(action, Preempt):
                self.preempt(now, action)
            elif isinstance(action, Suspend):
                self.suspend(now, action)
            elif isinstance(action, Restore):
                self.restore(now, action)
            elif isinstance(action, Squeeze | Unsqueeze):
                self.squeeze(now, action)
            elif isinstance(action, Wait):
                record = self.records.get(action.workload)
                if record is not None:
                    record.wait_reason = action.reason
        for wid in sorted(self.touched):  # after the round's placements: squeezers run now
            w = self.live[wid]
            if w.allocation is not None:
                self.set_rate(wid, self.squeezed_rate(w) if w.squeezed else 1.0)
        self.holds = dict(decision.holds)
        for warning in decision.warnings:
            self.warnings.setdefault(warning, None)

    def place(self, now: float, action: Place) -> None:
        w = self.live.get(action.workload)
        if w is None or w.allocation is not None:
            state = "unknown" if w is None else "already running"
            raise ReplayError(f"t={now}: Place of {action.workload}, which is {state}")
        try:
            alloc: Allocation = self.state.allocate(
                w.request, action.allocation.node, action.allocation.gpus
            )
        except InvalidRequestError as exc:
            raise ReplayError(
                f"t={now}: Place of {w.id} ({w.request}) on node {action.allocation.node} "
                f"GPUs {action.allocation.gpus} does not fit the real state: {exc}"
            ) from None
        self.scheduler.policy.on_allocate(self.state, alloc)
        self.live[w.id] = replace(w, allocation=alloc, started_at=now)
        self.pending -= 1
        self.allocated[self.queue_pos[w.queue]] += sum(alloc.gpu_milli)
        self.run_epoch[w.id] = self.run_epoch.get(w.id, 0) + 1
        record = self.records[w.id]
        record.starts.append(now)
        record.wait_reason = ""
        duration = self.inputs[w.id].duration_s
        self.progress[w.id] = [duration, 1.0, now]
        self.set_rate(w.id, 1.0)

    def squeeze(self, now: float, action: Squeeze | Unsqueeze) -> None:
        w = self.live.get(action.workload)
        try:
            if w is None:
                raise ValueError("unknown")
            before = w.squeezed
            after = execute_squeeze(self.state, w, action)
        except (ValueError, InvalidRequestError) as exc:
            raise ReplayError(
                f"t={now}: {type(action).__name__} of {action.workload}: {exc}"
            ) from None
        assert w is not None
        assert w.allocation is not None
        self.live[w.id] = after
        milli = sum(w.allocation.gpu_milli)
        pos = self.queue_pos[w.queue]
        if after.squeezed and not before:
            self.squeezes += 1
            self.records[w.id].squeezes += 1
            self.allocated[pos] -= milli
        elif before and not after.squeezed:
            self.allocated[pos] += milli
        self.touched.add(w.id)

    def preempt(self, now: float, action: Preempt) -> None:
        w = self.live.get(action.victim)
        if w is None or w.allocation is None or w.terminating:
            state = "unknown" if w is None else "pending" if w.allocation is None else "terminating"
            raise ReplayError(
                f"t={now}: Preempt of {action.victim} for {action.preemptor}, which is {state}"
            )
        self.live[w.id] = replace(w, terminating=True)
        self.evictions += 1
        self.eviction_log.append(Eviction(now, action.kind, action.preemptor, w.id))
        if action.kind == "preemption":
            self.preemptions += 1
        elif action.kind == "reclaim":
            self.reclaims += 1
        self.run_epoch[w.id] += 1  # a copy back under way is stale from now on
        self.push(now + self.grace_s, _EXIT, w.id, self.run_epoch[w.id])

    def suspend(self, now: float, action: Suspend) -> None:
        w = self.live.get(action.victim)
        if w is None or w.allocation is None or w.terminating:
            state = "unknown" if w is None else "pending" if w.allocation is None else "terminating"
            raise ReplayError(
                f"t={now}: Suspend of {action.victim} for {action.preemptor}, which is {state}"
            )
        try:
            self.state.hold_suspended(w.allocation.node, action.host_memory_mib)
        except InvalidRequestError as exc:
            raise ReplayError(f"t={now}: Suspend of {w.id}: {exc}") from None
        if w.id in self.restoring:  # suspended again while its memory came back
            self.state.free_suspended(w.allocation.node, self.restoring.pop(w.id))
        self.live[w.id] = replace(w, terminating=True)
        self.set_rate(w.id, 0.0)  # locked: no progress from now on
        self.suspending[w.id] = action.host_memory_mib
        copy = self.copy_s(w.allocation)
        self.count_copy(w, copy)
        self.suspends += 1
        self.records[w.id].suspends += 1
        self.run_epoch[w.id] += 1  # a copy back under way is stale from now on
        self.push(now + copy, _SUSPENDED, w.id, self.run_epoch[w.id])

    def restore(self, now: float, action: Restore) -> None:
        w = self.live.get(action.workload)
        if w is None or w.suspended_on is None:
            raise ReplayError(f"t={now}: Restore of {action.workload}, which is not suspended")
        if action.allocation.node_name != w.suspended_on:
            raise ReplayError(
                f"t={now}: Restore of {w.id} on {action.allocation.node_name}; it is suspended "
                f"on {w.suspended_on}"
            )
        try:
            alloc = self.state.allocate(w.request, action.allocation.node, action.allocation.gpus)
        except InvalidRequestError as exc:
            raise ReplayError(f"t={now}: Restore of {w.id} does not fit: {exc}") from None
        self.scheduler.policy.on_allocate(self.state, alloc)
        self.live[w.id] = replace(
            w,
            allocation=alloc,
            started_at=now,
            suspended_on=None,
            suspended_host_mib=0,
            suspended_gpus=(),
        )
        self.pending -= 1
        self.allocated[self.queue_pos[w.queue]] += sum(alloc.gpu_milli)
        self.run_epoch[w.id] = self.run_epoch.get(w.id, 0) + 1
        self.restores += 1
        record = self.records[w.id]
        record.restores += 1
        record.wait_reason = ""
        copy = self.copy_s(alloc)
        self.count_copy(self.live[w.id], copy)
        self.restoring[w.id] = w.suspended_host_mib
        self.progress[w.id] = [self.remaining.pop(w.id), 0.0, now]
        self.finish_version[w.id] = self.finish_version.get(w.id, 0) + 1
        self.push(now + copy, _RESTORED, w.id, self.run_epoch[w.id])

    def count_copy(self, w: Workload, copy_s: float) -> None:
        """Count ``copy_s`` seconds of ``w``'s GPU share as spent copying (not goodput)."""
        assert w.allocation is not None
        milli = 0 if w.squeezed else sum(w.allocation.gpu_milli)
        self.copy_by_queue[self.queue_pos[w.queue]] += copy_s * milli

    # -------------------------------------------------------------- checks
    def check(self, now: float, decision: Decision) -> None:
        """Debug mode: state invariants and the shell's own ledger after a round."""
        try:
            check_invariants(self.state)
            check_squeeze_invariants(self.state, list(self.live.values()))
        except AssertionError as exc:
            raise ReplayError(f"t={now}: invariant broken: {exc}") from None
        budget = self.state.suspend_capacity.copy()
        for w in self.live.values():
            if w.suspended_on is not None:
                budget[self.state.node_index[w.suspended_on]] -= w.suspended_host_mib
        for charged in (self.suspending, self.restoring):
            for wid, mib in charged.items():
                a = self.live[wid].allocation
                assert a is not None
                budget[a.node] -= mib
        if (budget != self.state.suspend_free).any():
            raise ReplayError(
                f"t={now}: suspend budget left {self.state.suspend_free.tolist()} differs from "
                f"the suspended workloads' {budget.tolist()}"
            )
        expected = [0] * len(self.queue_names)
        for w in self.live.values():
            if w.allocation is not None and not w.squeezed:
                expected[self.queue_pos[w.queue]] += sum(w.allocation.gpu_milli)
        if expected != self.allocated or sum(expected) != self.state.gpu_allocated_milli:
            raise ReplayError(
                f"t={now}: allocated GPU per queue {self.allocated} differs from the running "
                f"workloads' {expected} or the state's total {self.state.gpu_allocated_milli}"
            )
        answered = {a.workload for a in decision.actions if isinstance(a, Place | Wait)}
        silent = [w.id for w in self.live.values() if w.allocation is None and w.id not in answered]
        if silent:
            raise ReplayError(
                f"t={now}: the core gave no Place or Wait for pending workload(s) "
                f"{', '.join(silent[:5])}{' ...' if len(silent) > 5 else ''}"
            )

    # -------------------------------------------------------------- loop
    def run(self, on_round: Callable[[float], None] | None) -> ReplayResult:
        last_time = -math.inf
        rounds_here = 0
        while self.events and self.events[0][0] < self.horizon_s:
            now = self.now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, kind, _, wid, epoch = heapq.heappop(self.events)
                self.handle(kind, wid, epoch)
            rounds_here = rounds_here + 1 if now == last_time else 1
            last_time = now
            if rounds_here > MAX_ROUNDS_AT_ONE_TIME:
                raise ReplayError(
                    f"t={now}: more than {MAX_ROUNDS_AT_ONE_TIME} decision rounds at one time "
                    "(a preempt/place loop?)"
                )
            decision = self.scheduler.decide(
                now, self.state, self.queues, list(self.live.values()), self.holds
            )
            self.rounds += 1
            self.execute(now, decision)
            if self.debug:
                self.check(now, decision)
            share = tuple(
                decision.fair_share[q].gpu_milli if q in decision.fair_share else 0
                for q in self.queue_names
            )
            self.timeline.append(
                TimelineSample(
                    now, tuple(self.allocated), share, self.pending, len(self.live) - self.pending
                )
            )
            if self.tick_s and self.pending and self.tick_at is None:
                self.tick_at = now + self.tick_s
                self.push(self.tick_at, _TICK, "", 0)
            if on_round is not None:
                on_round(now)
        return ReplayResult(
            horizon_s=self.horizon_s,
            capacity_gpu_milli=self.state.gpu_capacity_milli,
            queues=self.queue_names,
            records=tuple(self.records.values()),
            timeline=tuple(self.timeline),
            preemptions=self.preemptions,
            reclaims=self.reclaims,
            evictions=self.evictions,
            rounds=self.rounds,
            warnings=tuple(self.warnings),
            squeezes=self.squeezes,
            wasted_gpu_hours=self.wasted_milli_s / 1000.0 / 3600.0,
            eviction_log=tuple(self.eviction_log),
            suspends=self.suspends,
            restores=self.restores,
            wasted_gpu_hours_by_queue=tuple(x / 3.6e6 for x in self.wasted_by_queue),
            copy_gpu_hours=sum(self.copy_by_queue) / 3.6e6,
            copy_gpu_hours_by_queue=tuple(x / 3.6e6 for x in self.copy_by_queue),
        )


def run_replay(
    nodes: Sequence[Node],
    queues: QueueTree,
    workloads: Sequence[SimWorkload],
    scheduler: DecisionCore,
    hours: float,
    grace_s: float = 30.0,
    *,
    tick_s: float | None = None,
    debug: bool = False,
    on_round: Callable[[float], None] | None = None,
    duty: DutyCycles | None = None,
    suspendable: bool = False,
    host_link_mib_s: float = HOST_LINK_MIB_S,
) -> ReplayResult:
    """Replay ``workloads`` on ``nodes`` for ``hours`` of virtual time (see the module doc).

    Args:
        nodes: the cluster (e.g. from :func:`parse_gpus`).
        queues: the queue tree; every workload's queue must be one of its leaves.
        workloads: what arrives, in any order; ids unique.
        scheduler: the decision core (its ``policy`` gets the on_allocate/on_release hooks).
        hours: horizon; events at or after it are not handled.
        grace_s: seconds between a Preempt action and the victim's exit (>= 0).
        tick_s: with a value, a decision round at least every ``tick_s`` seconds while
            something is pending, as a server loop would run (time-dependent rules such as
            aging, reservation and ``min_runtime`` then act without waiting for an event).
            None: rounds only at events.
        debug: after every round check the state invariants, the per-queue ledger, and
            that every pending workload got a Place or a Wait; a failure raises
            :class:`ReplayError`.
        on_round: called with the virtual time after every round (progress display).
        duty: the activity model of squeezed work's progress (default :class:`DutyCycles`).
        suspendable: every workload can be suspended (the core suspends it where a node's
            ``suspend_host_memory_mib`` has room); False: none can.
        host_link_mib_s: bandwidth of the suspend and restore copies, MiB/s (> 0).

    Returns:
        A :class:`ReplayResult`.

    Raises:
        ValueError: a non-positive horizon, a negative grace or tick, duplicate workload ids,
            or a workload whose queue is not a leaf of ``queues``.
        ReplayError: the core placed something that does not fit, preempted a workload that
            is not running, or looped at one time; or a debug check failed.
    """
    if not (math.isfinite(hours) and hours > 0):
        raise ValueError(f"hours must be a positive number, got {hours}")
    if not (math.isfinite(grace_s) and grace_s >= 0):
        raise ValueError(f"grace_s must be a number >= 0, got {grace_s}")
    if tick_s is not None and not (math.isfinite(tick_s) and tick_s >= 0):
        raise ValueError(f"tick_s must be a number >= 0, got {tick_s}")
    if not (math.isfinite(host_link_mib_s) and host_link_mib_s > 0):
        raise ValueError(f"host_link_mib_s must be a positive number, got {host_link_mib_s}")
    ids: set[str] = set()
    leaves = set(queues.leaves)
    for w in workloads:
        if w.id in ids:
            raise ValueError(f"duplicate workload id {w.id!r}")
        ids.add(w.id)
        if w.queue not in leaves:
            raise ValueError(
                f"workload {w.id}: queue {w.queue!r} is not a leaf queue "
                f"(leaves: {', '.join(sorted(leaves))})"
            )
    engine = _Engine(
        nodes,
        queues,
        workloads,
        scheduler,
        hours * 3600.0,
        grace_s,
        tick_s,
        debug,
        duty or DutyCycles(),
        suspendable,
        host_link_mib_s,
    )
    return engine.run(on_round)

"""Queues (tenants), workloads and the actions of the decision core (DESIGN.md section 5).

Amounts are integer resource vectors ``[gpu_milli, cpu_milli, memory_mib]``
(:data:`RESOURCES`). Constructors validate and raise :class:`InvalidRequestError` naming the
field; :class:`QueueTree` checks the tree as a whole (unknown parent, cycle, duplicate).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fgpu.model.types import Allocation, InvalidRequestError, Request

RESOURCES = ("gpu_milli", "cpu_milli", "memory_mib")
"""Resource dimensions of fair share, in this order."""

PRIORITY_CLASSES: dict[str, int] = {
    "very-low": 25,
    "low": 40,
    "normal": 50,
    "high": 100,
    "critical": 125,
}
"""Named priorities (DESIGN.md section 5); 100 and above are non-preemptible by default."""

NON_PREEMPTIBLE_FROM = 100
MAX_WEIGHT = 1e6
"""Largest over-quota weight (ratios beyond it add nothing and overflow floats)."""


@dataclass(frozen=True, slots=True)
class Resources:
    """A resource vector in integer units: milli-GPU, milli-cores, MiB."""

    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0

    def as_tuple(self) -> tuple[int, int, int]:
        """``(gpu_milli, cpu_milli, memory_mib)``."""
        return (self.gpu_milli, self.cpu_milli, self.memory_mib)


def parse_priority(value: int | str, field_name: str = "priority") -> int:
    """A priority number or class name (``"high"``) -> int.

    Raises:
        InvalidRequestError: an unknown class name (the valid ones are listed) or a negative
            number.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise InvalidRequestError(field_name, "must not be negative")
        return value
    text = str(value).strip()
    if text.isascii() and text.isdigit():
        if len(text) > 12:
            raise InvalidRequestError(field_name, f"{text[:20]}... is not a usable priority")
        return int(text)
    if text in PRIORITY_CLASSES:
        return PRIORITY_CLASSES[text]
    names = ", ".join(f"{k} ({v})" for k, v in PRIORITY_CLASSES.items())
    if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
        raise InvalidRequestError(field_name, "must not be negative")
    shown = repr(value) if len(str(value)) <= 40 else f"{str(value)[:40]!r}..."
    raise InvalidRequestError(field_name, f"unknown priority {shown}; use a number or {names}")


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """One queue (tenant).

    Attributes:
        name: unique name.
        quota: guaranteed resources (GPU fractions allowed: 1.5 GPUs is 1500 milli).
        limit: hard cap per resource, or None for no cap. A dimension of the limit that is
            0 while the quota's is 0 means "no cap" for that dimension only when the whole
            limit is None; otherwise it is a real cap.
        over_quota_weight: share of the surplus relative to sibling queues (>= 0). Weight 0
            queues keep their quota but get surplus only when no weighted queue wants more.
        priority: queue priority (higher gets surplus first, then reclaim ordering).
        parent: parent queue name, or None for a top-level queue.
        squeeze: squeeze before evict for preemption inside this queue (DESIGN.md section
            5, :mod:`fgpu.sched.squeeze`): True on, False off (evict as before), None
            (default) as the scheduler's :attr:`SchedulerConfig.squeeze`.
        preempt_delay_s: seconds a preemptor of this queue below the scheduler's
            ``preempt_wait_below`` priority waits for capacity to free by itself before it
            suspends or evicts anyone (wait before evict, :mod:`fgpu.sched.decide`); None
            (default) as the scheduler's :attr:`SchedulerConfig.preempt_delay_s`, 0: at once.

    Raises:
        InvalidRequestError: negative quota or weight, a limit below the quota, an empty
            name, a queue that is its own parent, or a ``preempt_delay_s`` that is not a
            number of seconds in 0..1e9.
    """

    name: str
    quota: Resources = field(default_factory=Resources)
    limit: Resources | None = None
    over_quota_weight: float = 1.0
    priority: int = 0
    parent: str | None = None
    squeeze: bool | None = None
    preempt_delay_s: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequestError("name", "a queue needs a name")
        delay = self.preempt_delay_s
        if delay is not None and not (
            isinstance(delay, int | float) and not isinstance(delay, bool) and 0 <= delay <= 1e9
        ):
            raise InvalidRequestError(
                "preempt_delay_s",
                f"queue {self.name}: {delay!r} is not a number of seconds in 0..1e9",
            )
        for dim, value in zip(RESOURCES, self.quota.as_tuple(), strict=True):
            if value < 0:
                raise InvalidRequestError(
                    f"quota.{dim}", f"queue {self.name}: must not be negative"
                )
        if self.limit is not None:
            for dim, lim, quota in zip(
                RESOURCES, self.limit.as_tuple(), self.quota.as_tuple(), strict=True
            ):
                if lim < quota:
                    raise InvalidRequestError(
                        f"limit.{dim}",
                        f"queue {self.name}: limit {lim} is below quota {quota}",
                    )
        if not 0 <= self.over_quota_weight <= MAX_WEIGHT:  # also rejects NaN
            raise InvalidRequestError(
                "over_quota_weight", f"queue {self.name}: must be a number in 0..{MAX_WEIGHT:g}"
            )
        if self.parent == self.name:
            raise InvalidRequestError("parent", f"queue {self.name} cannot be its own parent")


class QueueTree:
    """A validated forest of queues; work is submitted to leaves.

    Args:
        queues: the queue specs.

    Raises:
        InvalidRequestError: duplicate names, an unknown parent, a cycle, or children whose
            quotas add up to more than their parent's quota (when the parent has one).
    """

    def __init__(self, queues: Iterable[QueueSpec]) -> None:
        specs = list(queues)
        by_name: dict[str, QueueSpec] = {}
        for q in specs:
            if q.name in by_name:
                raise InvalidRequestError("name", f"duplicate queue name {q.name!r}")
            by_name[q.name] = q
        for q in specs:
            if q.parent is not None and q.parent not in by_name:
                raise InvalidRequestError(
                    "parent", f"queue {q.name}: unknown parent queue {q.parent!r}"
                )
        for q in specs:
            seen = [q.name]
            parent = q.parent
            while parent is not None:
                if parent in seen:
                    cycle = " -> ".join([*seen, parent])
                    raise InvalidRequestError("parent", f"queue cycle: {cycle}")
                seen.append(parent)
                parent = by_name[parent].parent
        self.specs: dict[str, QueueSpec] = by_name
        self.children: dict[str | None, list[str]] = {}
        for q in specs:
            self.children.setdefault(q.parent, []).append(q.name)
        for parent, kids in self.children.items():
            if parent is None:
                continue
            pq = by_name[parent].quota.as_tuple()
            total = [sum(by_name[k].quota.as_tuple()[i] for k in kids) for i in range(3)]
            for dim, t, p in zip(RESOURCES, total, pq, strict=True):
                if p and t > p:
                    raise InvalidRequestError(
                        f"quota.{dim}",
                        f"children of {parent} have quotas summing to {t}, above its {p}",
                    )

    @property
    def leaves(self) -> list[str]:
        """Queues without children, where workloads are submitted."""
        return [name for name in self.specs if name not in self.children]

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def __getitem__(self, name: str) -> QueueSpec:
        return self.specs[name]

    def with_queue(self, spec: QueueSpec) -> QueueTree:
        """A new tree with ``spec`` added or replaced (validated as a whole)."""
        specs = dict(self.specs)
        specs[spec.name] = spec
        return QueueTree(specs.values())

    @classmethod
    def single(cls, name: str = "default") -> QueueTree:
        """One queue owning everything (the single-machine default)."""
        return cls([QueueSpec(name)])


@dataclass(frozen=True, slots=True)
class Workload:
    """A workload as the decision core sees it.

    Attributes:
        id: unique id.
        queue: leaf queue name.
        request: what it asks for.
        priority: numeric priority (higher wins).
        submitted_at: submission time in seconds (virtual or wall clock).
        preemptible: None means the default: priority below 100.
        allocation: where it runs (None while pending).
        started_at: when it started, for running workloads.
        terminating: a running workload already told to stop (a victim on its way out).
        nodes: the names of the nodes it may use (its node constraints: on Kubernetes the
            pod's node selector, required node affinity and tolerated taints); None: any
            node. A frozenset of names; names of no node are ignored.
        squeezed: a running workload whose compute a higher-priority workload of its queue
            took instead of evicting it (:mod:`fgpu.sched.squeeze`): it keeps its processes,
            memory and CPU; the cluster state counts none of its compute.
        squeezed_by: the ids of the workloads that took its compute (may be empty while it
            waits for its compute after they ended).
        suspendable: the shell says the workload can be suspended to host memory (its
            processes run CUDA on a driver with the checkpoint API, and the shell can freeze
            them); False: a victim is evicted as before.
        suspended_on: the node name where a suspended workload waits (its device memory in
            that node's host memory, its processes frozen there); None when not suspended.
            A suspended workload has no ``allocation``; it is pending for the core, which
            may only :class:`Restore` it on that node.
        suspended_host_mib: host memory (MiB) a suspended workload holds on
            ``suspended_on``, charged to that node's ``suspend_host_memory_mib`` budget
            (the :attr:`Suspend.host_memory_mib` it was suspended with); 0 otherwise.
        user: who submitted it, an opaque name (the Unix uid on one machine, the namespace
            on Kubernetes, the trace's user in the simulator; "" when unknown). Inside a
            queue, at equal priority, the user with less allocated goes first
            (:mod:`fgpu.sched.queueorder`).
        suspended_gpus: the GPU indices on ``suspended_on`` its device memory was
            checkpointed from (its allocation's ``gpus`` when it was suspended): a
            :class:`Restore` goes back onto them unless the node's driver can restore onto
            other GPUs (``Node.restore_other_gpus``). Empty: not known (or no GPUs), any GPUs
            of that node.

    Raises:
        InvalidRequestError: ``nodes`` that is not a frozenset or None (field ``nodes``);
            a running workload with ``suspended_on`` set, or ``suspended_host_mib`` negative
            or set without ``suspended_on`` (field ``suspended_on``/``suspended_host_mib``);
            ``suspended_gpus`` without ``suspended_on``, or not ``request.gpu_count``
            distinct indices (field ``suspended_gpus``).
    """

    id: str
    queue: str
    request: Request
    priority: int = PRIORITY_CLASSES["normal"]
    submitted_at: float = 0.0
    preemptible: bool | None = None
    allocation: Allocation | None = None
    started_at: float | None = None
    terminating: bool = False
    nodes: frozenset[str] | None = None
    squeezed: bool = False
    squeezed_by: tuple[str, ...] = ()
    suspendable: bool = False
    suspended_on: str | None = None
    suspended_host_mib: int = 0
    user: str = ""
    suspended_gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        nodes: object = self.nodes
        if nodes is not None and type(nodes) is not frozenset:  # elements: names, unchecked
            raise InvalidRequestError(
                "nodes", f"must be a frozenset of node names or None (got {type(nodes).__name__})"
            )
        if self.suspended_on is not None and self.allocation is not None:
            raise InvalidRequestError(
                "suspended_on",
                f"workload {self.id} is running on {self.allocation.node_name} and suspended on "
                f"{self.suspended_on}; a suspended workload holds no allocation",
            )
        if self.suspended_host_mib < 0 or (self.suspended_host_mib and self.suspended_on is None):
            raise InvalidRequestError(
                "suspended_host_mib",
                f"workload {self.id}: {self.suspended_host_mib} MiB; must be >= 0, and 0 unless "
                "suspended_on names a node",
            )
        gpus = self.suspended_gpus
        if gpus and (
            self.suspended_on is None
            or len(gpus) != self.request.gpu_count
            or len(set(gpus)) != len(gpus)
            or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus)
        ):
            raise InvalidRequestError(
                "suspended_gpus",
                f"workload {self.id}: {list(gpus)}; must be {self.request.gpu_count} distinct "
                "GPU indices of the node named by suspended_on, or empty",
            )

    @property
    def is_preemptible(self) -> bool:
        """Whether the workload may be a victim (default: priority below 100)."""
        if self.preemptible is not None:
            return self.preemptible
        return self.priority < NON_PREEMPTIBLE_FROM

    @property
    def is_running(self) -> bool:
        """True when it holds an allocation."""
        return self.allocation is not None

    @property
    def is_suspended(self) -> bool:
        """True when it waits suspended on a node (``suspended_on``) for a :class:`Restore`."""
        return self.suspended_on is not None


# ------------------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class Place:
    """Start ``workload`` on ``allocation``."""

    workload: str
    allocation: Allocation
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop ``victim`` so that ``preemptor`` can run; ``kind`` is preemption or reclaim."""

    victim: str
    preemptor: str
    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class Suspend:
    """Suspend ``victim`` so that ``preemptor`` can run; ``kind`` is preemption or reclaim.

    The shell checkpoints the victim (locks it, copies its device memory to host memory and
    releases its GPU memory; freezes its processes), then releases its allocation; the
    victim is terminating until then, like an evicted one. It then waits suspended on its
    node (``Workload.suspended_on``) holding ``host_memory_mib`` of that node's suspend
    budget until a :class:`Restore` (or until it is cancelled: it is simply ended). A shell
    whose checkpoint fails evicts the victim instead.

    Attributes:
        victim, preemptor: workload ids.
        kind: ``preemption`` (inside a queue) or ``reclaim`` (across queues).
        reason: for users and events.
        host_memory_mib: host memory the suspended victim holds on its node, MiB: its GPU
            memory (the sum of its allocation's ``gpu_memory_mib``) plus its allocation's
            host ``memory_mib`` (its frozen processes keep their memory).
    """

    victim: str
    preemptor: str
    kind: str
    reason: str
    host_memory_mib: int


@dataclass(frozen=True, slots=True)
class Restore:
    """Restore suspended ``workload`` on ``allocation`` (on the node it is suspended on, on
    the GPUs it was checkpointed from, ``Workload.suspended_gpus``, unless that node's driver
    can restore onto other GPUs of the same model): the shell takes the allocation, copies
    its device memory back onto those GPUs, thaws its processes, and releases its host
    memory charge."""

    workload: str
    allocation: Allocation
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Squeeze:
    """``workload`` is squeezed (or stays squeezed) by ``by``: it keeps running with its
    memory, but its compute is lent to them (:mod:`fgpu.sched.squeeze`). Also sent when the
    set of squeezers changes."""

    workload: str
    by: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Unsqueeze:
    """``workload`` gets its compute back (the release of a squeeze)."""

    workload: str
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """``workload`` stays pending; ``reason`` says why, for users."""

    workload: str
    reason: str


Action = Place | Preempt | Suspend | Restore | Squeeze | Unsqueeze | Wait


@dataclass(frozen=True, slots=True)
class Hold:
    """Capacity held for a workload: freed by preemption, or reserved against starvation.

    Attributes:
        workload: the pending workload it is held for.
        node: node name (names stay valid when nodes are added or removed).
        gpus: GPU indices on that node (empty: the whole node is reserved).
        victims: ids of the workloads stopped for it (empty for a reservation).
        since: when the hold was made (seconds).
    """

    workload: str
    node: str
    gpus: tuple[int, ...]
    victims: tuple[str, ...] = ()
    since: float = 0.0

    @property
    def is_reservation(self) -> bool:
        """A reservation against starvation rather than capacity freed by preemption."""
        return not self.victims


Holds = Mapping[str, Hold]

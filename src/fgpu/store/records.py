"""What the store returns and accepts: frozen records, detached from any database session.

Records carry fgpu's integer units (milli-GPU, milli-cores, MiB) and times in seconds since
the epoch. :func:`to_core` turns a workload record into the decision core's
:class:`fgpu.sched.workload.Workload`; :meth:`QueueRecord.to_spec` does the same for queues.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fgpu.model.types import MODEL_SEPARATOR, Allocation, Request
from fgpu.sched.workload import PRIORITY_CLASSES, QueueSpec, Resources, Workload

PENDING = "pending"
RUNNING = "running"
PAUSED = "paused"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"

ACTIVE_PHASES = frozenset({PENDING, RUNNING, PAUSED})
"""Phases of a workload that is not done yet."""

HOLDING_PHASES = frozenset({RUNNING, PAUSED})
"""Phases in which a workload holds its allocation (and has, or is getting, a process)."""

FINAL_PHASES = frozenset({SUCCEEDED, FAILED, CANCELLED})
"""Phases a workload ends in."""

EVERYONE = "*"
"""The queue member that stands for every user."""

LOST_REASON = "lost while the service was down"
"""Reason of a running workload whose process was gone when the service came back."""

UNCAPPED = 2**62
"""Stands for "no cap" in a dimension of :attr:`QueueSpec.limit` (the core's limit is one
vector or None; the store keeps a cap per dimension)."""


# ----------------------------------------------------------------------------- queues
@dataclass(frozen=True, slots=True)
class QueueLimit:
    """Hard caps of a queue per dimension; None means no cap in that dimension."""

    gpu_milli: int | None = None
    cpu_milli: int | None = None
    memory_mib: int | None = None

    def as_tuple(self) -> tuple[int | None, int | None, int | None]:
        """``(gpu_milli, cpu_milli, memory_mib)``."""
        return (self.gpu_milli, self.cpu_milli, self.memory_mib)

    @property
    def is_none(self) -> bool:
        """True when no dimension is capped."""
        return self.as_tuple() == (None, None, None)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """A queue as a user configures it (``fgpu queue create|set``).

    Attributes:
        name: unique name, 1..128 characters.
        parent: parent queue, or None at the top.
        quota: guaranteed resources (1.5 GPUs is ``gpu_milli=1500``).
        limit: hard caps, per dimension.
        over_quota_weight: share of the surplus among sibling queues (>= 0).
        priority: queue priority (>= 0; higher gets surplus first).
        members: who may submit to it besides admins (DESIGN.md section 5): a user name or
            uid, ``@group`` (a Unix group name or gid), or ``*`` for everyone; empty: admins
            only.
        max_priority: the highest workload priority its non-admin members may submit with
            (default ``normal``, 50).
        nonpreemptible: whether its non-admin members may submit non-preemptible work (a
            priority class at or above ``high``, or ``preemptible: false``).
        squeeze: squeeze before evict for preemption inside this queue: True, False (evict
            only), or None (the service's setting, ``fgpu serve --squeeze/--no-squeeze``).
        default_time_s: time limit of a run of its workloads submitted without ``--time``,
            seconds; None: none.
        max_time_s: the longest ``--time`` its workloads may ask for, seconds (a longer one
            is refused at submission); None: no maximum.
        default_for: whose default queue it is (``fgpu queue set Q --default-for
            alice,@team``): user names or uids and ``@group`` entries (as in ``members``, but
            not ``*``); a submission without a queue goes here. One user or group is the
            default of at most one queue (the store refuses a second, naming both).
        max_active_per_user: most active (pending, running, paused) workloads one user may
            have in this queue; None: only the machine's limit (``fgpu serve
            --max-active-per-user``) over all queues.
        max_stored_bytes: most bytes of commands and environments one user's workloads of
            this queue may store (active ones and finished ones not yet pruned); None: only
            the machine's limit (``fgpu serve --max-stored-bytes``) over all queues.
        max_output_bytes: most bytes of output (logs) one user's workloads of this queue may
            keep (active ones and finished ones not yet pruned); past it their output is
            dropped (:mod:`fgpu.server.output_limits`); None: only the machine's limit
            (``fgpu serve --max-output-bytes``).
        max_running_per_user: most workloads one user may have running (or paused, or
            suspended in place) in this queue at once; the scheduler keeps more waiting
            pending. None: only the machine's limit (``fgpu serve --max-running-per-user``)
            over all queues.
        preempt_delay_s: seconds a preemptor of this queue below priority 100 waits for
            capacity to free by itself before it suspends or evicts anyone (wait before
            evict, :mod:`fgpu.sched.decide` rule 10), 0..1e9; None (default): the service's
            setting (``fgpu serve --preempt-delay``, 300 s unless set).
    """

    name: str
    parent: str | None = None
    quota: Resources = field(default_factory=Resources)
    limit: QueueLimit = field(default_factory=QueueLimit)
    over_quota_weight: float = 1.0
    priority: int = 0
    members: tuple[str, ...] = ()
    max_priority: int = PRIORITY_CLASSES["normal"]
    nonpreemptible: bool = False
    squeeze: bool | None = None
    default_time_s: float | None = None
    max_time_s: float | None = None
    default_for: tuple[str, ...] = ()
    max_active_per_user: int | None = None
    max_stored_bytes: int | None = None
    preempt_delay_s: float | None = None
    max_output_bytes: int | None = None
    max_running_per_user: int | None = None

    def to_spec(self) -> QueueSpec:
        """The decision core's :class:`QueueSpec` (uncapped dimensions become
        :data:`UNCAPPED`; a queue without any cap gets ``limit=None``).

        Raises:
            InvalidRequestError: a negative quota or weight, a limit below the quota.
        """
        limit = None
        if not self.limit.is_none:
            limit = Resources(*(UNCAPPED if v is None else v for v in self.limit.as_tuple()))
        return QueueSpec(
            name=self.name,
            quota=self.quota,
            limit=limit,
            over_quota_weight=self.over_quota_weight,
            priority=self.priority,
            parent=self.parent,
            squeeze=self.squeeze,
            preempt_delay_s=self.preempt_delay_s,
        )


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """A stored queue: its configuration and when it was created and last changed."""

    config: QueueConfig
    created_at: float
    updated_at: float

    @property
    def name(self) -> str:
        """The queue's name."""
        return self.config.name

    def to_spec(self) -> QueueSpec:
        """See :meth:`QueueConfig.to_spec`."""
        return self.config.to_spec()


# -------------------------------------------------------------------------- workloads
@dataclass(frozen=True, slots=True)
class StoredMigRequest:
    """What a MIG workload asks for: exactly one of a profile or a memory size.

    Attributes:
        profile: a MIG profile name, lower case (``--mig-profile 3g.40gb``).
        memory_mib: device memory in MiB (``--isolation mig --gpu-memory 18GiB``): the
            smallest profile of the GPU's model that has at least this much.
    """

    profile: str | None = None
    memory_mib: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in ``workloads.mig_request``."""
        if self.profile is not None:
            return {"profile": self.profile}
        return {"memory_mib": self.memory_mib}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoredMigRequest:
        """Inverse of :meth:`to_json`."""
        profile = data.get("profile")
        memory = data.get("memory_mib")
        return cls(
            None if profile is None else str(profile), None if memory is None else int(memory)
        )


@dataclass(frozen=True, slots=True)
class StoredMigInstance:
    """The MIG instance a workload runs on.

    Attributes:
        gpu_index: the GPU's index on the machine (as NVML numbers it).
        gpu_uuid: the GPU's UUID (``GPU-...``).
        profile: profile name.
        start: first memory slice of the instance.
        uuid: the instance's MIG device UUID (``MIG-...``), what ``CUDA_VISIBLE_DEVICES`` gets.
    """

    gpu_index: int
    gpu_uuid: str
    profile: str
    start: int
    uuid: str

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored under ``"mig"`` in ``workloads.allocation``."""
        return {
            "gpu_index": self.gpu_index,
            "gpu_uuid": self.gpu_uuid,
            "profile": self.profile,
            "start": self.start,
            "uuid": self.uuid,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoredMigInstance:
        """Inverse of :meth:`to_json`."""
        return cls(
            int(data["gpu_index"]),
            str(data["gpu_uuid"]),
            str(data["profile"]),
            int(data["start"]),
            str(data["uuid"]),
        )


@dataclass(frozen=True, slots=True)
class StoredAllocation:
    """Where a workload runs, as stored.

    Attributes:
        node_name: the node's name.
        node_index: the node's index in the cluster state the allocation was made on.
        gpus: GPU indices on the node, ascending.
        gpu_uuids: the GPUs' UUIDs (same order; empty when not known).
        gpu_milli: compute share on each GPU (milli-GPU).
        gpu_memory_mib: memory quota on each GPU (MiB).
        cpu_milli: CPU granted (milli-cores).
        memory_mib: host memory granted (MiB).
        mig: the MIG instance, for a workload placed on one (its one GPU is the instance's
            GPU, its compute share the instance's compute slices as milli-GPU, its memory the
            instance's); None otherwise.
    """

    node_name: str
    node_index: int
    gpus: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    gpu_milli: tuple[int, ...]
    gpu_memory_mib: tuple[int, ...]
    cpu_milli: int
    memory_mib: int
    mig: StoredMigInstance | None = None

    @classmethod
    def from_core(
        cls,
        allocation: Allocation,
        gpu_uuids: tuple[str, ...] = (),
        mig: StoredMigInstance | None = None,
    ) -> StoredAllocation:
        """From the decision core's allocation plus the GPUs' UUIDs (and the MIG instance)."""
        return cls(
            node_name=allocation.node_name,
            node_index=allocation.node,
            gpus=tuple(allocation.gpus),
            gpu_uuids=tuple(gpu_uuids),
            gpu_milli=tuple(allocation.gpu_milli),
            gpu_memory_mib=tuple(allocation.gpu_memory_mib),
            cpu_milli=allocation.cpu_milli,
            memory_mib=allocation.memory_mib,
            mig=mig,
        )

    def to_core(self, node_index: Mapping[str, int] | None = None) -> Allocation:
        """The decision core's :class:`Allocation`.

        Args:
            node_index: node name -> index in the current cluster state, when it may differ
                from the one the allocation was made on (after a restart); None keeps the
                stored index.

        Raises:
            KeyError: ``node_index`` given and without this node.
        """
        index = self.node_index if node_index is None else node_index[self.node_name]
        return Allocation(
            node=index,
            node_name=self.node_name,
            gpus=self.gpus,
            gpu_milli=self.gpu_milli,
            gpu_memory_mib=self.gpu_memory_mib,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in ``workloads.allocation`` (``"mig"`` only when set)."""
        data: dict[str, Any] = {
            "node_index": self.node_index,
            "gpus": list(self.gpus),
            "gpu_uuids": list(self.gpu_uuids),
            "gpu_milli": list(self.gpu_milli),
            "gpu_memory_mib": list(self.gpu_memory_mib),
            "cpu_milli": self.cpu_milli,
            "memory_mib": self.memory_mib,
        }
        if self.mig is not None:
            data["mig"] = self.mig.to_json()
        return data

    @classmethod
    def from_json(cls, node_name: str, data: Mapping[str, Any]) -> StoredAllocation:
        """Inverse of :meth:`to_json`."""
        return cls(
            node_name=node_name,
            node_index=int(data["node_index"]),
            gpus=tuple(int(g) for g in data["gpus"]),
            gpu_uuids=tuple(str(u) for u in data["gpu_uuids"]),
            gpu_milli=tuple(int(m) for m in data["gpu_milli"]),
            gpu_memory_mib=tuple(int(m) for m in data["gpu_memory_mib"]),
            cpu_milli=int(data["cpu_milli"]),
            memory_mib=int(data["memory_mib"]),
            mig=StoredMigInstance.from_json(data["mig"]) if data.get("mig") else None,
        )


@dataclass(frozen=True, slots=True)
class StoredArrayTask:
    """A task of an array (``--array 0-99%N``, :mod:`fgpu.rules.slurm`).

    Attributes:
        id: the array's id (drawn like a workload id, and none of its tasks' ids).
        name: the array's name (its tasks are named ``NAME_INDEX``).
        index: this task's index (``FGPU_ARRAY_INDEX``).
        size: how many tasks the array has.
        throttle: at most this many of its tasks run at once; None: no cap.
    """

    id: str
    name: str
    index: int
    size: int
    throttle: int | None = None


@dataclass(frozen=True, slots=True)
class ArrayPlan:
    """A task of an array about to be stored (:meth:`fgpu.store.store.Store.submit_tasks`):
    the fields of :class:`StoredArrayTask`, with ``array_id`` empty for "a fresh id"."""

    name: str
    index: int
    size: int
    throttle: int | None = None
    array_id: str = ""


@dataclass(frozen=True, slots=True)
class WorkloadRecord:
    """A stored workload.

    Attributes:
        id: short unique id (8 hex digits by default).
        name: display name.
        owner_uid: uid of the submitting user.
        queue: leaf queue it was submitted to.
        phase: one of pending, running, paused, succeeded, failed, cancelled.
        priority: numeric priority (higher wins).
        preemptible: None means the default (priority below 100).
        request: what it asks for.
        argv: the command; with ``shell`` it is one shell command line in ``argv[0]``
            (the launcher's convention, not the store's).
        shell: run through a shell.
        cwd: working directory.
        env: environment of the submitter, to start it with.
        grace_s: seconds between SIGTERM and SIGKILL when it is stopped.
        submitted_at, started_at, finished_at: times (seconds); started_at is the latest
            start, None while it has never run since its last return to pending.
        exit_code: exit status once finished (None if unknown).
        reason: the latest reason given for its phase.
        restarts: how many times it was preempted back to pending.
        stop_requested_at: when it was told to stop (cancel or preemption under way).
        cancelled_by: uid that cancelled it, when cancelled.
        pid, create_time: its process while it runs (create_time as psutil reports it).
        stdout_path, stderr_path: its log files.
        allocation: where it runs (kept after it finishes; None while pending).
        mig_request: for a MIG workload, the instance it asks for (its ``request`` is then
            one GPU with the memory it expects, for listings only); None otherwise.
        squeezed_by: while it is squeezed (:mod:`fgpu.sched.squeeze`: it runs with its
            memory but its compute was lent to higher-priority work), the ids of the
            workloads that took it (possibly empty); None while it is not squeezed.
        suspended_on: while it is suspended to host memory (pending, its processes kept:
            checkpointed by the CUDA driver and frozen, :mod:`fgpu.server.suspending`), the
            node it waits on to be restored; None otherwise. ``pid`` and ``allocation`` then
            still name its process and the GPUs its memory comes back to.
        suspended_host_mib: host memory it holds on ``suspended_on`` while suspended, MiB.
        time_limit_s: the longest a run of it may last (from its latest start), seconds;
            None: no limit.
        dependency: conditions that must hold before it may start, ``(type, workload id)``
            pairs (types of :data:`fgpu.rules.slurm.DEPENDENCY_TYPES`).
        array: the array it is a task of; None for a plain workload.
        preempted_by: pending again after the decision core stopped it for another
            workload, and not run since: that workload's id (None when not known, or not
            preempted).
        preempted_kind: with ``preempted_by``: ``preemption`` (same queue) or ``reclaim``
            (across queues); None otherwise.
    """

    id: str
    name: str
    owner_uid: int
    queue: str
    phase: str
    priority: int
    preemptible: bool | None
    request: Request
    argv: tuple[str, ...]
    shell: bool
    cwd: str
    env: Mapping[str, str]
    grace_s: float
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    exit_code: int | None
    reason: str
    restarts: int
    stop_requested_at: float | None
    cancelled_by: int | None
    pid: int | None
    create_time: float | None
    stdout_path: str | None
    stderr_path: str | None
    allocation: StoredAllocation | None
    mig_request: StoredMigRequest | None = None
    squeezed_by: tuple[str, ...] | None = None
    suspended_on: str | None = None
    suspended_host_mib: int = 0
    time_limit_s: float | None = None
    dependency: tuple[tuple[str, str], ...] = ()
    array: StoredArrayTask | None = None
    preempted_by: str | None = None
    preempted_kind: str | None = None

    @property
    def is_suspended(self) -> bool:
        """True while pending and suspended to host memory (see ``suspended_on``)."""
        return self.phase == PENDING and self.suspended_on is not None

    @property
    def is_active(self) -> bool:
        """True while pending, running or paused."""
        return self.phase in ACTIVE_PHASES

    @property
    def holds_allocation(self) -> bool:
        """True while running or paused."""
        return self.phase in HOLDING_PHASES

    def to_core(self, node_index: Mapping[str, int] | None = None) -> Workload:
        """See :func:`to_core`."""
        return to_core(self, node_index)


def to_core(record: WorkloadRecord, node_index: Mapping[str, int] | None = None) -> Workload:
    """The decision core's view of a stored workload.

    The allocation is given only while the workload holds it (running or paused); a workload
    told to stop is ``terminating``.

    Args:
        record: the stored workload.
        node_index: see :meth:`StoredAllocation.to_core`.
    """
    holding = record.holds_allocation and record.allocation is not None
    return Workload(
        id=record.id,
        queue=record.queue,
        request=record.request,
        priority=record.priority,
        submitted_at=record.submitted_at,
        preemptible=record.preemptible,
        allocation=record.allocation.to_core(node_index)
        if holding and record.allocation is not None
        else None,
        started_at=record.started_at if holding else None,
        terminating=holding and record.stop_requested_at is not None,
        squeezed=holding and record.squeezed_by is not None,
        squeezed_by=record.squeezed_by or () if holding else (),
        suspended_on=record.suspended_on if record.is_suspended else None,
        suspended_host_mib=record.suspended_host_mib if record.is_suspended else 0,
        user=str(record.owner_uid),
        suspended_gpus=(
            record.allocation.gpus if record.is_suspended and record.allocation is not None else ()
        ),
    )


def models_to_text(models: frozenset[str]) -> str:
    """``gpu_models`` as stored: sorted names joined by ``|`` (empty: any model)."""
    return MODEL_SEPARATOR.join(sorted(models))


def models_from_text(text: str) -> frozenset[str]:
    """Inverse of :func:`models_to_text`."""
    return frozenset(m for m in text.split(MODEL_SEPARATOR) if m)


# ----------------------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class EventRecord:
    """Something that happened.

    Attributes:
        id: increasing id (use it as a cursor: ``events(after_id=...)``).
        workload_id: the workload concerned, or None (queue and node events).
        time: when (seconds).
        kind: what happened: ``submitted``, ``started``, ``process``, ``paused``,
            ``resumed``, ``stopping``, ``cancel-requested``, ``preempted``, ``succeeded``,
            ``failed``, ``cancelled``, ``queue-created``, ``queue-updated``,
            ``queue-deleted``, ``node-updated``, ``node-removed``.
        reason: why, in a few words.
        message: a sentence for users.
        count: how many like events (same workload and kind) this one stands for: they were
            coalesced into it (``Store.record_event(coalesce_s=...)``); 1 for most.
        last_time: when the last of them happened (``time`` when ``count`` is 1).
    """

    id: int
    workload_id: str | None
    time: float
    kind: str
    reason: str
    message: str
    count: int = 1
    last_time: float | None = None


# -------------------------------------------------------------------------- inventory
@dataclass(frozen=True, slots=True)
class GpuRecord:
    """A GPU of the inventory.

    Attributes:
        index: index on its node (as NVML numbers it).
        uuid: the GPU's UUID (``GPU-...``).
        model: model name (catalog name where the catalog knows it).
        memory_mib: total memory in MiB.
        mig_enabled: MIG mode on.
    """

    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_enabled: bool = False


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node of the inventory with its GPUs (ordered by index).

    Attributes:
        name: node name.
        cpu_milli: allocatable CPU (milli-cores).
        memory_mib: allocatable host memory (MiB).
        gpus: its GPUs.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuRecord, ...] = ()

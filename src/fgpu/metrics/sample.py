"""What one scrape reads: plain dataclasses each exporting process fills from its own state.

Units are fgpu's own (milli-GPU, MiB, seconds); :mod:`fgpu.metrics.collector` converts to
the exposition's (ratios, bytes, GPUs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fgpu.sched.frag import FragmentationMeasure, TargetWorkload
from fgpu.sched.state import CONSTRAINED, ClusterState


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU: identity, what is granted on it, and live figures (None: unknown).

    ``index`` is the GPU's index on its node; memory in MiB; ``utilization_pct`` 0-100.
    """

    node: str
    index: int
    uuid: str
    model: str
    memory_mib: int
    allocated_milli: int
    allocated_memory_mib: int
    used_memory_mib: int | None = None
    utilization_pct: int | None = None


@dataclass(frozen=True, slots=True)
class WorkloadSample:
    """A running workload's share of one GPU (a workload on several GPUs has one each).

    Attributes:
        workload, name, queue, user: the workload's id, name, queue and owner (a user name
            or uid on one machine, the namespace on Kubernetes).
        node, gpu: where (the GPU's index on the node).
        compute_milli, memory_mib: what it was granted on that GPU.
        used_memory_mib: what its processes use there (None: unknown).
        achieved_milli: run time received while busy over the last minute, per mille
            (None: not governed).
        paused_s: seconds held frozen so far, by reason (``share``, ``priority``).
        paused: held back by a higher priority now (paused or compressed).
    """

    workload: str
    name: str
    queue: str
    user: str
    node: str
    gpu: int
    compute_milli: int
    memory_mib: int
    used_memory_mib: int | None = None
    achieved_milli: int | None = None
    paused_s: Mapping[str, float] = field(default_factory=dict)
    paused: bool = False


@dataclass(frozen=True, slots=True)
class QueueSample:
    """A queue: quota, fair share and allocation in milli-GPU, and its pending workloads
    counted by :func:`pending_reason`."""

    name: str
    quota_milli: int
    fair_share_milli: int
    allocated_milli: int
    pending: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetSample:
    """Everything one scrape shows; ``fragmentation`` None when it is not known here."""

    gpus: Sequence[GpuSample] = ()
    workloads: Sequence[WorkloadSample] = ()
    queues: Sequence[QueueSample] = ()
    fragmentation: float | None = None


_REASON_WORDS: tuple[tuple[str, str], ...] = (
    ("preempted workload", "preemption"),
    ("reserved node", "reservation"),
    ("would exceed its limit", "quota"),
    ("within the quota", "quota"),
    ("unknown queue", "queue"),
    ("not admitted", "queue"),
    (CONSTRAINED, "constraints"),
    ("fit", "capacity"),
    ("insufficient", "capacity"),
    ("no free", "capacity"),
    ("MIG", "capacity"),
)


def pending_reason(reason: str | None) -> str:
    """The small fixed class of a pending workload's reason (the ``reason`` label of
    ``fgpu_queue_pending_workloads``; :data:`fgpu.metrics.names.PENDING_REASONS`).

    None, an empty reason or ``submitted`` (no round has looked at it yet) ->
    ``scheduling``; a reason
    naming preempted workloads -> ``preemption``; a reserved node -> ``reservation``; a
    queue limit or the non-preemptible quota -> ``quota``; an unknown queue -> ``queue``;
    node constraints -> ``constraints``; a placement that does not fit -> ``capacity``;
    anything else -> ``other``.
    """
    if not reason or reason == "submitted":
        return "scheduling"
    for words, label in _REASON_WORDS:
        if words in reason:
            return label
    return "other"


def fleet_fragmentation(state: ClusterState, target: TargetWorkload) -> float:
    """FGD's fragmentation of ``state`` against ``target``, as a share of GPU capacity (0..1).

    The expected milli-GPU that the target's task types could not use, summed over nodes
    (Weng et al., "Beware of Fragmentation", USENIX ATC '23, section 3), divided by the
    fleet's milli-GPU; 0 for a fleet without GPUs.
    """
    capacity = int(state.gpu_milli_capacity.sum())
    if capacity == 0 or state.num_nodes == 0:
        return 0.0
    measure = FragmentationMeasure(state.model_names, target)
    weighted = measure.node_fragment(state.gpu_free_milli, state.cpu_free, state.node_model)
    return float(weighted.sum()) / measure.total_weight / capacity

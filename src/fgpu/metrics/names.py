"""The fixed ``fgpu_*`` series: name -> (type, labels, help).

Names are as Prometheus stores them: a counter's name ends in ``_total``; a histogram
``NAME`` is stored as ``NAME_bucket``, ``NAME_sum`` and ``NAME_count``. Ratios are 0..1,
memory in bytes, time in seconds (Prometheus naming conventions,
https://prometheus.io/docs/practices/naming/).
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Series(NamedTuple):
    """One series family: its type (gauge, counter, histogram), label names and help."""

    type: str
    labels: tuple[str, ...]
    help: str


GPU_LABELS: Final = ("node", "gpu", "uuid", "model")
WORKLOAD_LABELS: Final = ("workload", "name", "queue", "user", "node", "gpu")

SERIES: Final[dict[str, Series]] = {
    # per GPU
    "fgpu_gpu_compute_allocated_ratio": Series(
        "gauge", GPU_LABELS, "Compute granted on the GPU, 1.0 = the whole GPU."
    ),
    "fgpu_gpu_memory_allocated_bytes": Series(
        "gauge", GPU_LABELS, "GPU memory granted to workloads (their quotas), bytes."
    ),
    "fgpu_gpu_memory_total_bytes": Series("gauge", GPU_LABELS, "GPU memory, bytes."),
    "fgpu_gpu_memory_used_bytes": Series(
        "gauge",
        GPU_LABELS,
        "GPU memory in use by processes, bytes (NVML; simulated GPUs: what workloads report).",
    ),
    "fgpu_gpu_utilization_ratio": Series(
        "gauge",
        GPU_LABELS,
        "Share of the last sample period the GPU was busy (NVML; simulated GPUs: the run time "
        "its busy workloads received).",
    ),
    # per running workload and GPU
    "fgpu_workload_compute_share_ratio": Series(
        "gauge", WORKLOAD_LABELS, "Compute share granted on the GPU, 1.0 = the whole GPU."
    ),
    "fgpu_workload_compute_achieved_ratio": Series(
        "gauge",
        WORKLOAD_LABELS,
        "Run time received while busy over the last minute, 1.0 = ran all the time.",
    ),
    "fgpu_workload_gpu_memory_limit_bytes": Series(
        "gauge", WORKLOAD_LABELS, "GPU memory quota on the GPU, bytes."
    ),
    "fgpu_workload_gpu_memory_used_bytes": Series(
        "gauge", WORKLOAD_LABELS, "GPU memory the workload's processes use on the GPU, bytes."
    ),
    "fgpu_workload_paused_seconds_total": Series(
        "counter",
        (*WORKLOAD_LABELS, "reason"),
        "Time held frozen by the governor, seconds; reason share (time slicing) or priority.",
    ),
    "fgpu_workload_paused": Series(
        "gauge",
        WORKLOAD_LABELS,
        "1 while a higher priority on its GPU holds the workload back (paused or compressed).",
    ),
    # per queue
    "fgpu_queue_quota_gpus": Series("gauge", ("queue",), "Guaranteed GPUs of the queue."),
    "fgpu_queue_fair_share_gpus": Series(
        "gauge", ("queue",), "Fair share of the queue in the last scheduling round, GPUs."
    ),
    "fgpu_queue_allocated_gpus": Series(
        "gauge", ("queue",), "GPUs held by the queue's running workloads."
    ),
    "fgpu_queue_pending_workloads": Series(
        "gauge",
        ("queue", "reason"),
        "Pending workloads of the queue by why they wait (reason: capacity, quota, "
        "preemption, reservation, constraints, queue, scheduling or other; 0 when none).",
    ),
    # fleet
    "fgpu_fragmentation_ratio": Series(
        "gauge",
        (),
        "FGD fragmentation of the fleet against its recent requests, as a share of its GPU "
        "capacity (Weng et al., ATC '23).",
    ),
    # events
    "fgpu_workloads_total": Series("counter", ("phase",), "Workloads that ended, by phase."),
    "fgpu_preemptions_total": Series(
        "counter", ("kind",), "Victims stopped: preempt (same queue) or reclaim (across queues)."
    ),
    "fgpu_gpu_seconds_lost_total": Series(
        "counter",
        ("queue", "reason"),
        "GPU-seconds of work lost: evicted runs since their latest start (reason preempt, "
        "reclaim) and time copying device memory to and from host memory (suspend, restore).",
    ),
    "fgpu_memory_violations_total": Series(
        "counter", (), "Workloads found over their GPU memory quota by the memory guard."
    ),
    "fgpu_scheduling_round_seconds": Series(
        "histogram", (), "Duration of one scheduling round, seconds."
    ),
    "fgpu_submission_to_start_seconds": Series(
        "histogram", ("queue", "priority"), "From submission to start, seconds."
    ),
}

PENDING_REASONS: Final = (
    "capacity",
    "quota",
    "preemption",
    "reservation",
    "constraints",
    "queue",
    "scheduling",
    "other",
)
"""The ``reason`` values of ``fgpu_queue_pending_workloads`` (:func:`pending_reason`)."""


def exposed_names() -> frozenset[str]:
    """Every sample name the exposition can hold (histograms with their three suffixes)."""
    names: set[str] = set()
    for name, series in SERIES.items():
        if series.type == "histogram":
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return frozenset(names)

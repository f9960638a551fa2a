"""The memory guard's arithmetic: per workload and GPU, summed over its processes."""

from __future__ import annotations

from fgpu.agent.backend import GpuProcess
from fgpu.agent.memguard import (
    NOT_GRANTED_MIB,
    MemoryViolation,
    find_peak_violations,
    find_violations,
)

G0, G1 = "GPU-0", "GPU-1"


def test_sums_processes_per_workload_and_gpu() -> None:
    usage = [
        GpuProcess(10, G0, 3000),
        GpuProcess(11, G0, 1500),  # same workload: 4500 > 4096
        GpuProcess(20, G0, 4096),  # at quota: fine
        GpuProcess(10, G1, 100),
        GpuProcess(99, G0, 80000),  # nobody's
    ]
    owners = {10: "a", 11: "a", 20: "b"}
    quotas = {"a": {G0: 4096, G1: 50}, "b": {G0: 4096}}

    assert find_violations(usage, owners, quotas) == [
        MemoryViolation("a", G0, 4500, 4096, (10, 11)),
        MemoryViolation("a", G1, 100, 50, (10,)),
    ]


def test_a_gpu_not_given_allows_only_a_context() -> None:
    """A workload holds memory on a GPU it was not given: up to NOT_GRANTED_MIB (a context
    of a process that peeks) is let be, more is a violation that says so."""
    peek = [GpuProcess(10, G1, NOT_GRANTED_MIB)]
    assert find_violations(peek, {10: "a"}, {"a": {G0: 1}}) == []
    usage = [GpuProcess(10, G1, 9000)]
    [v] = find_violations(usage, {10: "a"}, {"a": {G0: 1}})
    assert v == MemoryViolation("a", G1, 9000, NOT_GRANTED_MIB, (10,), granted=False)
    assert v.message == (
        "GPU memory over quota on GPU-1, a GPU it was not given: used 9000 MiB, allowed 1024 MiB"
    )


def test_message_names_used_and_allowed() -> None:
    v = MemoryViolation("a", G0, 5000, 4096, (1,))
    assert v.message == "GPU memory over quota on GPU-0: used 5000 MiB, allowed 4096 MiB"


def test_a_peak_over_quota_is_a_violation_named_by_its_process() -> None:
    """Peaks are high-water marks per process: the highest one of a workload on a GPU is
    compared with its quota (never their sum: two processes' peaks need not come at once)."""
    peaks = [
        GpuProcess(10, G0, 3000),
        GpuProcess(11, G0, 3000),  # 6000 together, but each under 4096: not a violation
        GpuProcess(20, G0, 7680),  # over
        GpuProcess(21, G0, 5000),
        GpuProcess(20, G1, 2000),  # a GPU it was not given: over NOT_GRANTED_MIB
        GpuProcess(99, G0, 80000),  # nobody's
    ]
    owners = {10: "a", 11: "a", 20: "b", 21: "b"}
    quotas = {"a": {G0: 4096}, "b": {G0: 4096}}
    found = find_peak_violations(peaks, owners, quotas)
    assert found == [
        MemoryViolation("b", G0, 7680, 4096, (20,), True, True),
        MemoryViolation("b", G1, 2000, NOT_GRANTED_MIB, (20,), False, True),
    ]
    assert found[0].message == (
        "GPU memory over quota on GPU-0: process 20 peaked at 7680 MiB (the driver's "
        "high-water mark, a burst between two looks), allowed 4096 MiB"
    )

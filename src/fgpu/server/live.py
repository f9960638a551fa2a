"""What the devices and the governor report now, read once for one listing (``fgpu
nodes``/``top``, a ``/metrics`` scrape, a dashboard refresh)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

from fgpu.agent.backend import GpuBackend, GpuProcess, SimulatedBackend
from fgpu.agent.governor.runtime import WorkloadView as GovernorView
from fgpu.agent.process import ProcessHandle
from fgpu.server.enforcement import Enforcement


@dataclass(frozen=True, slots=True)
class LiveFigures:
    """Live figures, each missing where unknown.

    Attributes:
        gpu_used_mib: GPU uuid -> MiB its processes hold (simulated GPUs: what workloads
            reported, 0 when none did).
        utilization: GPU uuid -> percent busy (0-100).
        governed: workload id -> the governor's view of it.
        holder_used_mib: (workload id, GPU uuid) -> MiB its processes hold there.
    """

    gpu_used_mib: dict[str, int]
    utilization: dict[str, int]
    governed: dict[str, GovernorView]
    holder_used_mib: dict[tuple[str, str], int]


def read_live(
    backend: GpuBackend, enforcement: Enforcement, handles: Mapping[str, ProcessHandle]
) -> LiveFigures:
    """One read of the backend (processes' memory, utilization) and of the governor, for
    the running workloads' ``handles``. A backend error leaves its figures unknown."""
    usage: dict[str, int] = {}
    if isinstance(backend, SimulatedBackend):  # nothing reported: nothing used
        usage = {d.uuid: 0 for d in backend.gpus() if not d.mig_enabled}
    procs: list[GpuProcess] = []
    known = False
    with contextlib.suppress(Exception):
        procs = backend.process_memory()
        known = True
    for proc in procs:
        usage[proc.gpu_uuid] = usage.get(proc.gpu_uuid, 0) + proc.used_mib
    util: dict[str, int] = {}
    with contextlib.suppress(Exception):
        util = backend.utilization()
    used = enforcement.used_memory(handles, procs) if known else {}
    return LiveFigures(usage, util, enforcement.views(), used)

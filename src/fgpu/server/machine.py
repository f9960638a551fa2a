"""This machine's GPUs as cluster nodes.

The decision core gives every node one GPU model. A machine whose GPUs are all one model is
one node named after the host; a machine with several models (``--simulate-gpus
2xA100-40GB,1xH100-80GB``) becomes one node per model, ``HOST/MODEL``, and the host's CPU and
memory are divided among them in proportion to their GPU count (a documented limit of the
single-machine shape: a CPU-heavy request cannot use CPUs that belong to the other model's
node).

GPUs in MIG mode are not shared in fractions (a process on a MIG GPU sees only a MIG
instance): they leave the nodes and form the MIG pool (:attr:`Machine.mig_gpus`, shown as the
node ``HOST/mig``; :mod:`fgpu.server.mig_pool`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import psutil

from fgpu.agent.backend import GpuBackend, GpuDevice
from fgpu.model.types import Node


@dataclass(frozen=True, slots=True)
class Machine:
    """Nodes of this machine and which physical GPU each node GPU index is.

    Attributes:
        nodes: the nodes for the cluster state (GPUs in MIG mode left out).
        devices: node name -> the node's GPUs, index i being the node's GPU i.
        mig_gpus: the GPUs in MIG mode, by index.
        mig_node: the name MIG placements and views use for them (``HOST/mig``).
    """

    nodes: tuple[Node, ...]
    devices: dict[str, tuple[GpuDevice, ...]]
    mig_gpus: tuple[GpuDevice, ...] = ()
    mig_node: str = "mig"

    def uuids(self, node: str, gpus: tuple[int, ...]) -> list[str]:
        """The UUIDs of a node's GPUs."""
        return [self.devices[node][g].uuid for g in gpus]


def discover(
    backend: GpuBackend,
    host: str | None = None,
    cpu_milli: int | None = None,
    memory_mib: int | None = None,
    *,
    suspend_host_memory_mib: int = 0,
) -> Machine:
    """Build the machine's nodes from the backend's GPUs.

    Args:
        backend: GPU backend (NVML or simulated).
        host: node name (default: the host name).
        cpu_milli: allocatable CPU (default: all CPUs).
        memory_mib: allocatable host memory (default: all of it).
        suspend_host_memory_mib: host memory for suspended work (MiB), divided among the
            nodes like the memory.
    """
    host = host or socket.gethostname() or "localhost"
    cpu = cpu_milli if cpu_milli is not None else (os.cpu_count() or 1) * 1000
    mem = memory_mib if memory_mib is not None else psutil.virtual_memory().total // 2**20
    groups: dict[str, list[GpuDevice]] = {}
    mig: list[GpuDevice] = []
    for device in sorted(backend.gpus(), key=lambda d: d.index):
        if device.mig_enabled:
            mig.append(device)
        else:
            groups.setdefault(device.model, []).append(device)
    mig_node = f"{host}/mig"
    if not groups:
        return Machine((Node(host, cpu, mem, 0, None, 0),), {host: ()}, tuple(mig), mig_node)
    total = sum(len(g) for g in groups.values())
    nodes: list[Node] = []
    devices: dict[str, tuple[GpuDevice, ...]] = {}
    for model, gpus in sorted(groups.items()):
        name = host if len(groups) == 1 else f"{host}/{model}"
        share = len(gpus) / total
        memory = min(d.memory_mib for d in gpus)
        nodes.append(
            Node(
                name,
                int(cpu * share),
                int(mem * share),
                len(gpus),
                model,
                memory,
                suspend_host_memory_mib=int(suspend_host_memory_mib * share),
            )
        )
        devices[name] = tuple(gpus)
    return Machine(tuple(nodes), devices, tuple(mig), mig_node)

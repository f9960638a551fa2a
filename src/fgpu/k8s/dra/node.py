"""The node agent's DRA part: which GPUs it may publish, and what it says when it has none.

A DRA driver publishes only devices it can prepare, so unlike ``fgpu serve`` the node agent
never falls back to a simulated GPU: without NVML (or without a GPU) it publishes nothing
(no ResourceSlice, no inventory) and writes the reason on its Node
(:data:`AGENT_STATUS`), unless ``--simulate-gpus`` asks for simulated GPUs on purpose
(demos, tests).
"""

from __future__ import annotations

import logging
from typing import Any

from fgpu.agent.backend import GpuBackend, SimulatedBackend
from fgpu.k8s import wire
from fgpu.k8s.dra.slices import SlicePublisher
from fgpu.k8s.kube import KubeApi

log = logging.getLogger("fgpu.k8s.dra.node")

AGENT_STATUS = "fgpu.io/agent-status"
"""Node annotation: why the agent publishes no GPUs (absent when it publishes some)."""


def real_backend(simulate: str | None, host: str, nvml: Any = None) -> GpuBackend | str:
    """The backend the agent may publish: simulated GPUs when asked for, else NVML with at
    least one GPU; otherwise the reason there is none (no fallback).

    Args:
        simulate: the ``--simulate-gpus`` value, or None.
        host: the node's name (simulated uuids).
        nvml: stand-in for the ``pynvml`` module (tests); None uses the real one.

    Raises:
        ValueError: ``simulate`` is not a valid spec.
    """
    if simulate is not None:
        return SimulatedBackend(simulate, host)
    from fgpu.agent.nvml import NvmlBackend, NvmlUnavailableError

    try:
        backend = NvmlBackend(nvml)
    except NvmlUnavailableError as exc:
        return f"NVML is unavailable ({exc}); publishing no GPUs (--simulate-gpus for a demo)"
    if not backend.gpus():
        backend.close()
        return "NVML reports no GPUs; publishing no GPUs"
    return backend


def publish_nothing(api: KubeApi, slices: SlicePublisher, node: str, reason: str) -> None:
    """Withdraw this node's ResourceSlice and inventory and say why on the Node.

    Raises:
        KubeError: the API refused.
    """
    slices.withdraw()
    api.patch_node(
        node,
        {
            "metadata": {
                "labels": {wire.MANAGED_LABEL: "false", wire.COUNT_LABEL: "0"},
                "annotations": {wire.INVENTORY: None, AGENT_STATUS: reason},
            }
        },
    )
    log.warning("node %s: %s", node, reason)


__all__ = ["AGENT_STATUS", "publish_nothing", "real_backend"]

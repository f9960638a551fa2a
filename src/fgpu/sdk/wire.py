"""Datagrams between workloads (:mod:`fgpu.sdk`) and the node agent's listener.

One datagram is one UTF-8 JSON object, at most :data:`MAX_DATAGRAM` bytes::

    {"v": 1, "w": "<workload id>", "k": "busy"}
    {"v": 1, "w": "<workload id>", "k": "idle"}
    {"v": 1, "w": "<workload id>", "k": "memory", "mib": 5120, "gpu": 0}

``gpu`` is an index into the workload's visible GPUs (``CUDA_VISIBLE_DEVICES`` order), a GPU
uuid, or null for its first GPU. The agent trusts the workload id only when the sender's
kernel-reported pid belongs to that workload (``SO_PASSCRED``), so one workload cannot speak
for another. Standard library only: workloads import this.
"""

from __future__ import annotations

import json
from typing import NamedTuple

VERSION = 1
MAX_DATAGRAM = 1024
KINDS = ("busy", "idle", "memory")


class Message(NamedTuple):
    """A decoded datagram.

    Attributes:
        workload_id: the id the sender claims (``FGPU_WORKLOAD_ID``).
        kind: ``busy``, ``idle`` or ``memory``.
        mib: for ``memory``: device memory in use, MiB (>= 0).
        gpu: for ``memory``: index into the workload's GPUs, a uuid, or None (the first).
    """

    workload_id: str
    kind: str
    mib: int = 0
    gpu: int | str | None = None


def encode(message: Message) -> bytes:
    """The datagram for ``message``."""
    body: dict[str, object] = {"v": VERSION, "w": message.workload_id, "k": message.kind}
    if message.kind == "memory":
        body["mib"] = message.mib
        body["gpu"] = message.gpu
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: bytes) -> Message | None:
    """The message in ``data``, or None when it is not a valid datagram of this version
    (too long, not JSON, unknown kind, bad field types)."""
    if len(data) > MAX_DATAGRAM:
        return None
    try:
        body = json.loads(data)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        return None
    workload_id, kind = body.get("w"), body.get("k")
    if not isinstance(workload_id, str) or not workload_id or kind not in KINDS:
        return None
    if kind != "memory":
        return Message(workload_id, kind)
    mib, gpu = body.get("mib"), body.get("gpu")
    if not isinstance(mib, int) or isinstance(mib, bool) or mib < 0:
        return None
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int | str)):
        return None
    return Message(workload_id, kind, mib, gpu)

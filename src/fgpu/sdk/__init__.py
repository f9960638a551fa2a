"""What workloads import: activity hints and (on simulated GPUs) memory reports.

Usage::

    import fgpu.sdk

    with fgpu.sdk.busy():          # the GPU is in use inside the block
        train_step()

    fgpu.sdk.mark_idle()           # waiting for requests: lower-priority work may run
    fgpu.sdk.mark_busy()

Hints tell the node agent's governor when the workload uses its GPU, so that in ``fair``
mode its unused time goes to others, and so that a high-priority workload pauses
lower-priority ones only while it is busy (DESIGN.md section 7). Without hints a workload
counts as busy (or, on real GPUs, as busy when NVML sees it use the GPU).

Messages are datagrams to the Unix socket named by ``FGPU_AGENT_SOCKET``, sent with the id
in ``FGPU_WORKLOAD_ID`` (both set by the agent at launch). Sending never blocks and never
raises: without an agent (variables unset, no socket, queue full) a call does nothing.
``busy()`` blocks nest (and may be used from several threads): the hint ``busy`` goes out
when the first opens and ``idle`` when the last closes.

This package imports only the standard library (``json``, ``os``, ``socket``,
``threading``), so importing it costs a workload nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

from fgpu.sdk.wire import Message, encode

PYTHONPATH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pythonpath")
"""Put first on each workload's ``PYTHONPATH`` by the launcher: ``import fgpu.sdk`` then
works in whatever Python the workload runs, fgpu installed there or not (a stand-in ``fgpu``
package that looks its modules up in this installation)."""

SOCKET_ENV = "FGPU_AGENT_SOCKET"
WORKLOAD_ENV = "FGPU_WORKLOAD_ID"

_lock = threading.Lock()
_depth = 0
_sock: socket.socket | None = None
_sock_pid = 0


def _send(message_kind: str, mib: int = 0, gpu: int | str | None = None) -> bool:
    """Send one datagram; True when the kernel took it (for tests), False otherwise."""
    global _sock, _sock_pid
    path = os.environ.get(SOCKET_ENV, "")
    workload_id = os.environ.get(WORKLOAD_ENV, "")
    if not path or not workload_id:
        return False
    data = encode(Message(workload_id, message_kind, mib, gpu))
    try:
        if _sock is None or _sock_pid != os.getpid():
            _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            _sock.setblocking(False)
            _sock_pid = os.getpid()
        _sock.sendto(data, path)
    except OSError:  # no agent, queue full, permission: hints are best effort
        return False
    return True


def mark_busy() -> bool:
    """Tell the agent the workload is using its GPU now. Returns whether it was sent."""
    return _send("busy")


def mark_idle() -> bool:
    """Tell the agent the workload is not using its GPU now. Returns whether it was sent."""
    return _send("idle")


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Mark the workload busy for the block (nesting and threads allowed; see the module)."""
    global _depth
    with _lock:
        _depth += 1
        first = _depth == 1
    if first:
        mark_busy()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            last = _depth == 0
        if last:
            mark_idle()


def report_memory(mib: int, gpu: int | str | None = None) -> bool:
    """Report device memory in use (MiB) on one of the workload's GPUs.

    The agent uses these reports only on simulated GPUs, where nothing else measures memory
    (on real GPUs NVML does); they let tests and demos exercise the memory guard.

    Args:
        mib: memory in use, MiB (>= 0).
        gpu: index into the workload's GPUs (``CUDA_VISIBLE_DEVICES`` order), a GPU uuid, or
            None for the first.

    Returns:
        Whether the datagram was sent.

    Raises:
        ValueError: ``mib`` is negative.
    """
    if mib < 0:
        raise ValueError(f"report_memory: mib must be >= 0, got {mib}")
    return _send("memory", mib, gpu)


__all__ = ["busy", "mark_busy", "mark_idle", "report_memory"]

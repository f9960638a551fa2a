"""The node agent's enforcement: the governor and the memory guard over this node's fgpu pods.

:class:`GovernorEnforcer` is the :class:`~fgpu.k8s.agent.Enforcer` that
``fgpu k8s node-agent`` uses when cgroup v2 is usable. On every :meth:`~GovernorEnforcer.sync`
(each report interval) it takes the fgpu pods bound to the node and:

- governs them with a :class:`~fgpu.agent.governor.runtime.Governor` over the agent's GPUs:
  each pod's compute share and priority come from its ``fgpu.io/assignment`` (what was
  granted, not the editable annotations); a pod is frozen and thawed through its own cgroup
  (:class:`~fgpu.k8s.podcgroup.PodCgroupFreezer`). Activity: the pods' :mod:`fgpu.sdk`
  hints, received on the agent socket (below); a pod that has sent none is busy, on NVML
  GPUs, while one of its processes (host pids from the pod's cgroup) keeps the GPU's SMs
  busy, and on simulated GPUs always;
- guards their GPU memory with a :class:`~fgpu.agent.memguard.MemoryGuard`: the quota on
  each GPU UUID is the assignment's ``gpu_memory_mib``, the pod's processes are those in its
  cgroup. Policy ``warn`` (default) only records it; ``kill`` thaws the pod and asks the API
  for its eviction (PodDisruptionBudgets apply, and the uid precondition keeps a pod that was
  recreated under the same name safe). The agent never signals a pod's processes itself: a
  SIGKILL from outside leaves the kubelet to restart the container in place (the pod keeps
  its GPUs and goes over quota again) and records nothing on the pod.

Pods whose cgroup is not found yet (not started) or whose GPUs this agent does not own are
left alone until a later sync. Events (paused, resumed, memory) go to the log.

Activity hints from pods: the agent binds the hint socket
(:class:`~fgpu.agent.governor.activity.HintListener`, ``SO_PASSCRED``) at ``agent_socket``,
in the host directory ``/run/fgpu`` that the admission webhook mounts (read only) into every
fgpu pod, where ``FGPU_AGENT_SOCKET`` names it. The kernel attaches each sender's pid, in
the agent's pid namespace (the host's: the enforcing DaemonSet has ``hostPID``). The
governor (the same code as on one machine) takes a hint only when that pid is in the
cgroup of the pod the hint names (``cgroup.procs`` of the pod cgroup and its container
cgroups: :meth:`PodCgroupFreezer.owns`), so a pod speaks only for itself; a hint from any
other process (no pod, another pod, a pod not governed here) is dropped and counted
(:attr:`GovernorEnforcer.dropped_hints`, logged at each sync when it grows). Once a pod has
sent a hint, hints decide its activity instead of NVML or "always busy".

MIG pods (an assignment with ``mig``) are never governed or guarded: their instance's
compute and memory are isolated in hardware.

Restart safety: :meth:`GovernorEnforcer.start` thaws every pod cgroup it finds frozen (left
by an agent that died holding a lease) and touches nothing else; :meth:`close` thaws what it
froze. Processes are never moved or signalled.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fgpu.agent.backend import GpuBackend
from fgpu.agent.events import AgentEvent, EventLog
from fgpu.agent.governor.activity import HintListener
from fgpu.agent.governor.freezer import cgroup2_mount
from fgpu.agent.governor.plan import ComputeMode, GpuPolicy, PriorityPolicy
from fgpu.agent.governor.runtime import GovernedWorkload, Governor, GovernorConfig
from fgpu.agent.memguard import (
    DEFAULT_INTERVAL_S,
    GuardedWorkload,
    MemoryGuard,
    MemoryPolicy,
    MemoryViolation,
)
from fgpu.k8s.kube import KubeApi, KubeError
from fgpu.k8s.podcgroup import PodCgroupFreezer, pod_handle

if TYPE_CHECKING:
    from fgpu.k8s.agent import PlacedContainer

log = logging.getLogger("fgpu.k8s.enforce")


class GovernorEnforcer:
    """The governor and the memory guard over this node's fgpu pods (module docstring).

    Args:
        backend: the node's GPU backend (NVML activity and memory figures).
        gpus: uuids of the GPUs this agent owns (pods on other GPUs are not governed).
        freezer: the pod cgroup freezer (its ``root`` holds ``kubepods``).
        api: the Kubernetes API (evictions under ``memory_policy=kill``); None with ``warn``.
        compute_mode: ``fair`` or ``strict`` on every GPU.
        priority_policy: ``pause`` or ``compress`` lower priorities while a higher one is
            busy.
        memory_policy: ``warn`` (default) or ``kill`` (evict).
        memory_interval_s: seconds between two looks at per-process GPU memory.
        config: governor settings other than the GPU policy (default: the governor's).
        agent_socket: where to receive the pods' activity hints (``/run/fgpu/agent.sock``
            on a node: the pods' ``FGPU_AGENT_SOCKET``), or None for none. Its directory is
            made if missing; a socket that cannot be bound is logged and enforcement goes
            on without hints.

    Raises:
        ValueError: ``memory_policy=kill`` without an ``api``.
    """

    def __init__(
        self,
        backend: GpuBackend,
        gpus: Iterable[str],
        freezer: PodCgroupFreezer,
        *,
        api: KubeApi | None = None,
        compute_mode: ComputeMode = ComputeMode.FAIR,
        priority_policy: PriorityPolicy = PriorityPolicy.PAUSE,
        memory_policy: MemoryPolicy = MemoryPolicy.WARN,
        memory_interval_s: float = DEFAULT_INTERVAL_S,
        config: GovernorConfig | None = None,
        agent_socket: Path | None = None,
    ) -> None:
        if memory_policy is MemoryPolicy.KILL and api is None:
            raise ValueError("memory policy kill evicts through the API: pass api")
        self.listener = _bind_hints(agent_socket) if agent_socket is not None else None
        self.gpus = frozenset(gpus)
        self.freezer = freezer
        self.api = api
        self.events = EventLog()
        self.events.subscribe(_log_event)
        policy = GpuPolicy(mode=compute_mode, priority_policy=priority_policy)
        base = config or GovernorConfig()
        self.governor = Governor(
            sorted(self.gpus),
            config=GovernorConfig(
                planner=base.planner,
                gpu_policy=policy,
                confirm_timeout_s=base.confirm_timeout_s,
                realtime_priority=base.realtime_priority,
                cpu=base.cpu,
                nvml_busy_percent=base.nvml_busy_percent,
                activity_poll_s=base.activity_poll_s,
                achieved_window_s=base.achieved_window_s,
            ),
            freezer=freezer,
            listener=self.listener,
            backend=backend,
            events=self.events,
        )
        self.guard = MemoryGuard(
            backend,
            policy=memory_policy,
            interval_s=memory_interval_s,
            events=self.events,
            stop=self._evict,
            governor=self.governor,
            pids_of=freezer.pids,
        )
        self._uids: dict[str, str] = {}
        self._last: list[GovernedWorkload] = []
        self._dropped_logged = 0
        self._started = False

    @property
    def dropped_hints(self) -> int:
        """Hints refused since the start: malformed, without credentials, or from a process
        that is not in the cgroup of the governed pod the hint names."""
        return self.listener.dropped if self.listener is not None else 0

    def start(self) -> list[Path]:
        """Thaw pod cgroups a previous agent left frozen, then start the governor's loop and
        the guard's polling. Returns the cgroups thawed. Idempotent."""
        if self._started:
            return []
        self._started = True
        thawed = self.freezer.recover()
        for group in thawed:
            log.warning("thawed %s: left frozen by a previous agent", group)
        self.governor.start()
        self.guard.start()
        return thawed

    def sync(self, placed: Sequence[PlacedContainer]) -> None:
        """Govern and guard exactly the pods in ``placed`` that have a cgroup here and sit on
        this agent's GPUs. A pod recreated under the same name (new uid) is released and
        adopted afresh."""
        current: dict[str, PlacedContainer] = {}
        for p in placed:
            a = p.assignment
            if a.mig is not None:
                continue  # a MIG instance: isolated in hardware, nothing to time-slice or guard
            if not a.uuids or any(u not in self.gpus for u in a.uuids):
                continue
            current[p.workload_id] = p
        replaced = {w for w, p in current.items() if self._uids.get(w, p.uid) != p.uid}
        if replaced:  # release the old pods under their old cgroups first
            kept = [w for w in self._last if w.workload_id not in replaced]
            self._update(kept, [])
        governed: list[GovernedWorkload] = []
        guarded: list[GuardedWorkload] = []
        self._uids = {}
        for wid, p in sorted(current.items()):
            if self.freezer.bind(wid, p.uid) is None:
                log.debug("pod %s (uid %s) has no cgroup here yet", wid, p.uid)
                continue
            self._uids[wid] = p.uid
            a = p.assignment
            handle = pod_handle(wid)
            governed.append(
                GovernedWorkload(
                    workload_id=wid,
                    handle=handle,
                    gpu_uuids=a.uuids,
                    compute_milli=tuple(min(1000, max(1, m)) for m in a.gpu_milli),
                    priority=a.priority,
                    squeezed_by=p.squeezed_by,
                )
            )
            guarded.append(
                GuardedWorkload(
                    workload_id=wid,
                    handle=handle,
                    quotas_mib=dict(zip(a.uuids, a.gpu_memory_mib, strict=True)),
                )
            )
        self._update(governed, guarded)
        dropped = self.dropped_hints
        if dropped > self._dropped_logged:
            log.info(
                "%d activity hint(s) dropped since the last sync (%d in all): not from a "
                "process of the governed pod they name, or malformed",
                dropped - self._dropped_logged,
                dropped,
            )
            self._dropped_logged = dropped

    def close(self) -> None:
        """Stop the guard and the governor; every pod it froze is thawed. Idempotent."""
        with contextlib.suppress(Exception):
            self.guard.close()
        self.governor.close()

    # ------------------------------------------------------------------ private
    def _update(self, governed: list[GovernedWorkload], guarded: list[GuardedWorkload]) -> None:
        try:
            self.governor.update(governed)
        except ValueError as exc:  # e.g. shares over 1000 on a GPU: log, keep the last set
            log.error("governor: %s", exc)
        else:
            self._last = governed
        self.guard.update(guarded)

    def _evict(self, workload: GuardedWorkload, violation: MemoryViolation) -> None:
        wid = workload.workload_id
        namespace, _, name = wid.partition("/")
        self.governor.before_signal(wid)  # a frozen pod cannot shut down
        uid = self._uids.get(wid, "")
        if self.api is None:  # refused in __init__
            return
        try:
            self.api.evict(namespace, name, uid)
        except KubeError as exc:
            log.error("evicting %s (%s) failed: %s", wid, violation.message, exc)
        else:
            log.warning("evicted %s: %s", wid, violation.message)


def pod_freezer(cgroup_root: Path | None = None) -> PodCgroupFreezer:
    """The pod cgroup freezer for this node.

    Args:
        cgroup_root: the cgroup v2 directory holding ``kubepods`` (default: where cgroup v2
            is mounted, e.g. ``/sys/fs/cgroup``).

    Raises:
        OSError: no cgroup v2 mounted, ``cgroup_root`` is not a cgroup v2 directory, or the
            kernel has no ``cgroup.freeze``; the message says which.
    """
    root = cgroup_root
    if root is None:
        root = cgroup2_mount()
        if root is None:
            raise OSError(errno.ENOENT, "no cgroup v2 hierarchy is mounted")
    freezer = PodCgroupFreezer(root)
    if not os.access(root, os.W_OK):
        raise OSError(errno.EACCES, f"{root} is not writable (run privileged, as root)")
    return freezer


def _bind_hints(path: Path) -> HintListener | None:
    """The hint socket at ``path`` (its directory made if missing), or None with a warning
    (enforcement goes on without hints)."""
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        listener = HintListener(path)
    except OSError as exc:
        log.warning("no activity hints from pods: cannot bind %s: %s", path, exc)
        return None
    log.info("activity hints from pods on %s", path)
    return listener


def _log_event(event: AgentEvent) -> None:
    log.info("%s %s: %s", event.workload_id, event.kind, event.message)


__all__ = ["GovernorEnforcer", "pod_freezer"]

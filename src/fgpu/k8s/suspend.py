"""Suspend a pod to host memory and restore it, on its node (issue 28; the node agent's part).

:class:`PodSuspender` does for a pod what :mod:`fgpu.server.suspending` does for a workload
of ``fgpu serve``: every CUDA process in the pod's cgroup is locked and checkpointed through
the CUDA driver's checkpoint API (:class:`fgpu.agent.checkpoint.Suspender`: device memory to
host memory, its GPU memory released), then the pod's cgroup is frozen
(:class:`~fgpu.k8s.podcgroup.PodCgroupFreezer`, ``cgroup.freeze``); restore thaws the cgroup,
restores and unlocks the processes. A pod that is suspended is left out of the governor by the
caller (the governor would thaw it). Processes are never signalled or moved: the cgroup
freezer and the driver's lock keep them off the GPU.

:class:`Suspensions` is the node agent's loop over them: a pod annotated ``fgpu.io/suspend:
"true"`` is suspended (after the governor let go of it, so that it does not thaw it), and
``fgpu.io/suspended`` says so (pids, copy seconds) with an event ``Suspended``; when the
annotation goes, the pod is restored (event ``Restored``; ``fgpu.io/suspended`` removed and
``fgpu.io/restored`` written with the copy seconds, in one patch) and governed again. A failed
suspend is an event ``SuspendFailed`` and ``fgpu.io/suspended: {"error": ...}``; the pod
keeps running. An agent that restarts takes a pod with ``fgpu.io/suspended`` (no error) as
suspended.

``fgpu k8s node-agent`` turns it on where it enforces through pod cgroups on NVML GPUs whose
driver has the checkpoint API, and publishes the node's suspend budget
(``--suspend-host-memory``) in its inventory; the scheduler asks for suspends and restores
(:mod:`fgpu.k8s.suspending`). The annotations are fgpu's: the webhook lets only the
scheduler write ``fgpu.io/suspend`` and only the node agent (and the scheduler) the agent's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fgpu.agent.checkpoint import CheckpointDriver, CheckpointError, Suspender, SuspendReport
from fgpu.k8s import wire
from fgpu.k8s.kube import KubeApi
from fgpu.k8s.podcgroup import PodCgroupFreezer, pod_handle
from fgpu.k8s.writes import annotate, post_event

if TYPE_CHECKING:
    from fgpu.k8s.agent import PlacedContainer

log = logging.getLogger("fgpu.k8s.suspend")

FREEZE_TIMEOUT_S = 30.0
"""How long a suspended pod's cgroup gets to report ``frozen 1``."""


class PodNotFoundError(LookupError):
    """The pod has no cgroup on this node (not started here, or gone)."""


class PodSuspender:
    """Suspends and restores pods of this node (module docstring).

    Args:
        driver: the checkpoint API of the node's CUDA driver.
        freezer: the pod cgroup freezer (the governor's, or one of its own on the same root).
    """

    def __init__(self, driver: CheckpointDriver, freezer: PodCgroupFreezer) -> None:
        self.freezer = freezer
        self._suspender = Suspender(driver, freeze=self._freeze, thaw=self._thaw)

    def _freeze(self, workload_id: str) -> None:
        handle = pod_handle(workload_id)
        self.freezer.freeze(handle)
        if not self.freezer.wait_frozen(handle, FREEZE_TIMEOUT_S):
            log.warning("pod %s: its cgroup did not report frozen", workload_id)

    def _thaw(self, workload_id: str) -> None:
        self.freezer.thaw(pod_handle(workload_id))

    def _pids(self, workload_id: str, uid: str) -> list[int]:
        if self.freezer.bind(workload_id, uid) is None:
            raise PodNotFoundError(f"pod {workload_id} (uid {uid}) has no cgroup on this node")
        return self.freezer.pids(pod_handle(workload_id))

    def suspend(self, workload_id: str, uid: str) -> SuspendReport:
        """Checkpoint every CUDA process of pod ``workload_id`` (``namespace/name``, cgroup
        found by ``uid``), then freeze its cgroup.

        Raises:
            PodNotFoundError: no cgroup for the pod here.
            ValueError: no CUDA process in it (nothing to checkpoint).
            fgpu.agent.checkpoint.CheckpointError: the driver refused (nothing stays
                locked: a partial suspend is undone).
        """
        return self._suspender.suspend(workload_id, self._pids(workload_id, uid))

    def restore(self, workload_id: str, uid: str) -> SuspendReport:
        """Thaw pod ``workload_id``'s cgroup, restore and unlock its checkpointed processes.

        Raises:
            PodNotFoundError: no cgroup for the pod here.
            fgpu.agent.checkpoint.CheckpointError: the driver refused (``out_of_memory``: its
                GPU lacks room; the pod is checkpointed and frozen again).
        """
        return self._suspender.restore(workload_id, self._pids(workload_id, uid))


class Suspensions:
    """The node agent's suspends and restores, from the pods' ``fgpu.io/suspend``.

    Args:
        pods: the suspender (its freezer on the same cgroup root as the governor's).
        api: the Kubernetes API (annotations, events).
    """

    def __init__(self, pods: PodSuspender, api: KubeApi) -> None:
        self.pods = pods
        self.api = api
        self.suspended: dict[str, str] = {}  # pod key -> uid, while suspended by this node

    def governed(
        self, placed: Sequence[PlacedContainer], objects: Mapping[str, Any]
    ) -> list[PlacedContainer]:
        """Restore the suspended pods no longer asked to be suspended; returns the pods the
        governor may govern (neither asked nor suspended)."""
        for p in placed:
            note = wire.annotations_of(objects.get(p.workload_id) or {}).get(wire.SUSPENDED)
            if note and p.workload_id not in self.suspended and '"error"' not in note:
                self.suspended[p.workload_id] = p.uid  # an earlier agent's suspend
        for p in placed:
            if p.workload_id in self.suspended and not p.suspend:
                self._restore(p, objects.get(p.workload_id))
        placed_keys = {p.workload_id for p in placed}
        for gone in set(self.suspended) - placed_keys:
            del self.suspended[gone]
        return [p for p in placed if not p.suspend and p.workload_id not in self.suspended]

    def suspend_asked(self, placed: Sequence[PlacedContainer], objects: Mapping[str, Any]) -> None:
        """Suspend the pods newly asked to be (after the governor let go of them)."""
        for p in placed:
            pod = objects.get(p.workload_id)
            if not p.suspend or p.workload_id in self.suspended or pod is None:
                continue
            if wire.annotations_of(pod).get(wire.SUSPENDED):
                continue  # failed before: asked again only after the annotation is cleared
            try:
                report = self.pods.suspend(p.workload_id, p.uid)
            except (PodNotFoundError, ValueError, CheckpointError, OSError) as exc:
                log.warning("pod %s: suspend failed: %s", p.workload_id, exc)
                annotate(self.api, pod, {wire.SUSPENDED: json.dumps({"error": str(exc)})})
                post_event(self.api, pod, "Warning", "SuspendFailed", str(exc))
                continue
            self.suspended[p.workload_id] = p.uid
            note = {"pids": list(report.pids), "copy_s": round(report.copy_s, 6)}
            annotate(self.api, pod, {wire.SUSPENDED: json.dumps(note)})
            post_event(
                self.api,
                pod,
                "Normal",
                "Suspended",
                f"suspended to host memory: device-to-host copy {report.copy_s:.3f} s",
            )

    def _restore(self, p: PlacedContainer, pod: Any) -> None:
        try:
            report = self.pods.restore(p.workload_id, p.uid)
        except (PodNotFoundError, CheckpointError, OSError) as exc:
            log.warning("pod %s: restore failed: %s", p.workload_id, exc)
            if pod is not None:
                post_event(self.api, pod, "Warning", "RestoreFailed", str(exc))
            return
        del self.suspended[p.workload_id]
        if pod is not None:
            restored = json.dumps({"copy_s": round(report.copy_s, 6)})
            annotate(self.api, pod, {wire.SUSPENDED: None, wire.RESTORED: restored})
            post_event(
                self.api,
                pod,
                "Normal",
                "Restored",
                f"restored from host memory: host-to-device copy {report.copy_s:.3f} s",
            )


__all__ = ["FREEZE_TIMEOUT_S", "PodNotFoundError", "PodSuspender", "Suspensions"]

"""``fgpu k8s node-agent``: the per-node agent (a DaemonSet).

It discovers the node's GPUs (NVML, or the simulated backend where there is none), and
publishes them on its Node: label ``fgpu.io/managed=true``, labels ``fgpu.io/gpu-model``
and ``fgpu.io/gpu-count``, and the annotation ``fgpu.io/inventory`` the scheduler reads.
Every ``interval_s`` (and at once when its Node or its pods change) it measures per-GPU use
and passes its fgpu pods to the enforcer.

API load: the agent learns its Node and its pods from watches narrowed to this node
(:class:`fgpu.k8s.nodeview.NodeView`), not from a list every interval; and it writes its
usage (``fgpu.io/usage``: memory in use and utilization by GPU UUID, and the time measured)
only when it moved by a step (:data:`USAGE_MEMORY_STEP_MIB`, :data:`USAGE_UTILIZATION_STEP`)
since the last write, not on a timer. Every write of a Node is sent to every watcher of
Nodes in the cluster (the scheduler, the kubelet's peers, controllers): the load that made
the kubelet move its heartbeat from Node status to a Lease (KEP-589).

Restart safety: the agent keeps no state and never moves or signals pods' processes. It
patches its own Node's labels and annotations, and the inventory it publishes is keyed by
GPU UUID, which the scheduler uses to find a running pod's GPUs; a restart that renumbers
GPUs moves nobody. With ``--gpus`` it owns a subset of the GPUs (the rest stay with the
NVIDIA device plugin on the same node).

GPUs in MIG mode are published with their instances (``mig`` in the inventory), for MIG
pods only. The agent lays them out as the scheduler asks (:meth:`NodeAgent.reconcile_mig`):
the scheduler writes the whole layout it wants on idle MIG GPUs into the Node's
``fgpu.io/mig-request`` with a new generation; the agent sees it through its watch of the
Node (and acts at once), and for each GPU named, if no fgpu pod bound to this node holds an
instance of that GPU, destroys the instances the layout does not keep and creates the missing
ones (:func:`fgpu.mig.device.apply_plan`, which also refuses to destroy an instance with
processes on it). Then it publishes the inventory and ``fgpu.io/mig-status`` (the generation,
and per GPU the error when it did not change it) in one patch. Applying a request twice
changes nothing the second time, so an agent that dies in between does no harm.

Enforcement (the governor and memory guard, DESIGN.md section 7) is called through
:class:`Enforcer`: ``fgpu k8s node-agent`` passes
:class:`~fgpu.k8s.enforce.GovernorEnforcer` where pod cgroups are usable (it thaws pods a
dead agent left frozen when it starts), and :class:`LogOnlyEnforcer` otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fgpu.agent.backend import GpuBackend, GpuDevice, mig_devices_of
from fgpu.k8s import wire
from fgpu.k8s.kube import KubeApi, KubeError
from fgpu.k8s.nodeview import NodeView
from fgpu.mig.device import MigDevice, apply_plan
from fgpu.mig.inventory import MigInputError
from fgpu.mig.layout import Placement
from fgpu.mig.planner import GpuPlan

if TYPE_CHECKING:
    from fgpu.k8s.suspend import Suspensions

log = logging.getLogger("fgpu.k8s.agent")

USAGE_MEMORY_STEP_MIB = 256
"""A GPU's memory in use must move this much (MiB) from the last written value to be
written again."""
USAGE_UTILIZATION_STEP = 10
"""A GPU's utilization must move this many percentage points to be written again."""
STALL_S = 300.0
"""A report loop that has not begun a pass for this long (or ten intervals, if longer) fails
:meth:`NodeAgent.live` (seconds): a report stuck in the GPU driver or the API."""


def usage_moved(last: Any, now: Any) -> bool:
    """Whether usage ``now`` differs from ``last`` (both the ``fgpu.io/usage`` JSON shape:
    ``memory_mib`` and ``utilization`` by GPU UUID) enough to be written: other GPUs, or one
    GPU's memory by :data:`USAGE_MEMORY_STEP_MIB` or utilization by
    :data:`USAGE_UTILIZATION_STEP` or more. ``last`` None or unreadable: moved."""
    try:
        for name, step in (
            ("memory_mib", USAGE_MEMORY_STEP_MIB),
            ("utilization", USAGE_UTILIZATION_STEP),
        ):
            a, b = last[name], now[name]
            if set(a) != set(b):
                return True
            if any(abs(int(a[u]) - int(b[u])) >= step for u in b):
                return True
    except (KeyError, TypeError, ValueError):
        return True
    return False


@dataclass(frozen=True, slots=True)
class PlacedContainer:
    """What the enforcer is told about one fgpu pod on this node.

    Attributes:
        workload_id: ``namespace/name``.
        uid: the pod's uid (its cgroup is named after it).
        assignment: what it was granted (GPU UUIDs, compute milli, memory MiB).
        squeezed_by: the keys of the pods that squeezed it (its ``fgpu.io/squeezed-by``
            annotation; empty when it is not squeezed).
        suspend: its ``fgpu.io/suspend`` is ``"true"``: it is to be suspended to host memory
            (:mod:`fgpu.k8s.suspend`).
    """

    workload_id: str
    uid: str
    assignment: wire.Assignment
    squeezed_by: tuple[str, ...] = ()
    suspend: bool = False


class Enforcer(Protocol):
    """What enforces the pods' shares on the node (:class:`~fgpu.k8s.enforce.GovernorEnforcer`,
    or :class:`LogOnlyEnforcer`)."""

    def sync(self, placed: Sequence[PlacedContainer]) -> None:
        """The fgpu pods now on this node; called every interval."""
        ...


class LogOnlyEnforcer:
    """Enforces nothing, logs the pods it sees (``--no-enforce``, or no usable cgroup v2)."""

    def __init__(self) -> None:
        self._seen: frozenset[str] = frozenset()

    def sync(self, placed: Sequence[PlacedContainer]) -> None:
        """Log the pods to govern when they change."""
        ids = frozenset(p.workload_id for p in placed)
        if ids != self._seen:
            self._seen = ids
            log.info("not enforcing (log only): %d fgpu pod(s) here", len(ids))


def select_gpus(devices: Sequence[GpuDevice], spec: str | None) -> list[GpuDevice]:
    """The GPUs fgpu owns: all, or those in ``spec`` (``"0-3,6"``, by index).

    Raises:
        ValueError: a malformed spec or an index the node does not have.
    """
    if not spec:
        return list(devices)
    wanted: set[int] = set()
    empty: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    empty.append(part)  # said below, outside this try
                wanted.update(range(lo, hi + 1))
            else:
                wanted.add(int(part))
        except ValueError:
            raise ValueError(f"--gpus: {part!r} is not an index or a range like 0-3") from None
    if empty:
        raise ValueError(f"--gpus: {empty[0]!r} is an empty range (low above high)")
    have = {d.index for d in devices}
    missing = sorted(wanted - have)
    if missing:
        raise ValueError(f"--gpus: no GPU {missing[0]} here (indices {sorted(have)})")
    return [d for d in devices if d.index in wanted]


class NodeAgent:
    """Publishes a node's GPUs and usage; calls the enforcer.

    Args:
        api: the Kubernetes API.
        node: this node's name (the DaemonSet passes ``spec.nodeName``).
        backend: GPU backend.
        gpus: the ``--gpus`` spec (None: all).
        enforcer: what enforces the pods' shares (default: :class:`LogOnlyEnforcer`).
        on_publish: called with the inventory after every publication (the DRA driver's
            ResourceSlice, :class:`fgpu.k8s.dra.slices.SlicePublisher`).
        suspensions: suspends and restores pods asked to be (``fgpu.io/suspend``;
            :class:`fgpu.k8s.suspend.Suspensions`); None: none.
        suspend_host_memory_mib: host memory (MiB) kept for suspended pods, published in
            the inventory as the node's suspend budget (only with ``suspensions``; else 0:
            the scheduler evicts victims here).
        suspend_note: why pods are not suspended here, published when ``suspensions`` is
            None (e.g. the driver has no checkpoint API).
    """

    def __init__(
        self,
        api: KubeApi,
        node: str,
        backend: GpuBackend,
        gpus: str | None = None,
        enforcer: Enforcer | None = None,
        on_publish: Callable[[wire.Inventory], Any] | None = None,
        suspensions: Suspensions | None = None,
        suspend_host_memory_mib: int = 0,
        suspend_note: str = "",
    ) -> None:
        if suspend_host_memory_mib < 0:
            raise ValueError(f"suspend_host_memory_mib: {suspend_host_memory_mib} MiB is negative")
        self.api = api
        self.suspensions = suspensions
        self.suspend_host_memory_mib = suspend_host_memory_mib if suspensions else 0
        self.suspend_note = "" if suspensions else suspend_note
        self.node = node
        self.backend = backend
        owned = select_gpus(backend.gpus(), gpus)
        by_index = {d.index: d for d in mig_devices_of(backend)}
        self.mig: dict[str, MigDevice] = {}
        """GPU uuid -> its MIG device, for the owned GPUs in MIG mode."""
        self.devices: list[GpuDevice] = []
        for d in owned:
            if d.mig_enabled:
                device = by_index.get(d.index)
                if device is None:
                    log.warning(
                        "GPU %d (%s, %s) is in MIG mode but fgpu cannot lay out its MIG "
                        "instances; it is not published",
                        d.index,
                        d.model,
                        d.uuid,
                    )
                    continue
                self.mig[d.uuid] = device
            self.devices.append(d)
        self.enforcer = enforcer or LogOnlyEnforcer()
        self.on_publish = on_publish
        self._stop = threading.Event()
        self.last_placed: list[PlacedContainer] = []
        self._wake = threading.Event()
        self._published: str | None = None
        self.view = NodeView(api, node, on_change=self._wake.set)
        self._usage: Any = None  # as last written (or found on the Node)
        self.usage_writes = 0
        """Writes of ``fgpu.io/usage`` by this agent."""
        self.reports = 0
        """Reports done (measurements, whether written or not)."""
        self._started = threading.Event()  # published, and its Node and pods listed
        self._start_error = ""
        self._phase = "new"  # of run(): new, running, ended
        self._interval_s = 10.0
        self._beat = time.monotonic()  # when the report loop last began a pass

    def inventory(self) -> wire.Inventory:
        """What this agent publishes (indices renumbered 0.. over the owned GPUs; GPUs in
        MIG mode with their instances)."""
        gpus: list[wire.InventoryGpu] = []
        for i, d in enumerate(self.devices):
            device = self.mig.get(d.uuid)
            mig = (
                None
                if device is None
                else tuple(
                    wire.InventoryMigInstance(m.uuid, m.profile, m.start)
                    for m in device.instances()
                    if m.uuid  # a GPU instance without a compute instance is no use
                )
            )
            gpus.append(wire.InventoryGpu(i, d.uuid, d.model, d.memory_mib, mig))
        return wire.Inventory(
            tuple(gpus),
            self.backend.kind,
            suspend_host_memory_mib=self.suspend_host_memory_mib,
            suspend_note=self.suspend_note,
        )

    def publish(self, status: wire.MigLayoutStatus | None = None) -> None:
        """Write the labels and the inventory on the Node (one merge patch), with the MIG
        status when given (so the scheduler sees the acknowledgement and the instances
        together).

        Raises:
            KubeError: the patch failed.
        """
        inv = self.inventory()
        text = inv.to_json()
        models = sorted({g.model for g in inv.gpus})
        labels = {
            wire.MANAGED_LABEL: "true",
            wire.COUNT_LABEL: str(len(inv.gpus)),
            wire.MODEL_LABEL: models[0] if len(models) == 1 else ("mixed" if models else "none"),
        }
        notes = {wire.INVENTORY: text}
        if status is not None:
            notes[wire.MIG_STATUS] = status.to_json()
        written = self.api.patch_node(
            self.node, {"metadata": {"labels": labels, "annotations": notes}}
        )
        self.view.nodes.apply("MODIFIED", written)
        self._published = text
        if self.on_publish is not None:
            self.on_publish(inv)

    def report(self) -> None:
        """Measure per-GPU memory in use (MiB) and utilization (%), write them when they
        moved (:func:`usage_moved`), carry out a pending MIG request, and sync the
        enforcer.

        Raises:
            KubeError: reading the Node or the pods, or a write, failed.
        """
        owned = {d.uuid for d in self.devices}
        memory: dict[str, int] = dict.fromkeys(owned, 0)
        try:
            for proc in self.backend.process_memory():
                if proc.gpu_uuid in owned:
                    memory[proc.gpu_uuid] += proc.used_mib
            util = {u: p for u, p in self.backend.utilization().items() if u in owned}
        except Exception as exc:  # a flaky driver must not stop the agent
            log.warning("reading GPU usage failed: %s", exc)
            util = {}
        usage = {"memory_mib": memory, "utilization": util, "time": int(time.time())}
        node = self.view.node()
        if self._usage is None and node is not None:
            try:  # what an earlier run wrote: a restart writes nothing new
                self._usage = json.loads(wire.annotations_of(node).get(wire.USAGE) or "null")
            except ValueError:
                self._usage = None
        if usage_moved(self._usage, usage):
            node = self.api.patch_node(
                self.node, {"metadata": {"annotations": {wire.USAGE: json.dumps(usage)}}}
            )
            self.view.nodes.apply("MODIFIED", node)
            self._usage = usage
            self.usage_writes += 1
        placed = self.placed()
        self.last_placed = placed  # what the metrics show until the next report
        if self.mig:
            status = self.reconcile_mig(node, placed)
            if status is None and self.inventory().to_json() != self._published:
                self.publish()  # instances changed outside fgpu (e.g. nvidia-smi)
        if self.suspensions is None:
            self.enforcer.sync(placed)
        else:  # the governor lets go of a pod before it is suspended (it would thaw it)
            pods = {wire.pod_key(p): p for p in self.view.bound_pods()}
            self.enforcer.sync(self.suspensions.governed(placed, pods))
            self.suspensions.suspend_asked(placed, pods)
        self.reports += 1

    def reconcile_mig(
        self, node: Any | None = None, placed: Sequence[PlacedContainer] | None = None
    ) -> wire.MigLayoutStatus | None:
        """Carry out the scheduler's pending MIG layout request (module docstring), then
        publish the inventory with the status.

        Args:
            node: this agent's Node object as just read (None: get it).
            placed: the fgpu pods bound here (None: list them).

        Returns:
            The status written, or None when no request was pending.

        Raises:
            KubeError: reading the Node, listing pods or publishing failed.
        """
        if not self.mig:
            return None
        if node is None:
            node = self.api.get_node(self.node)
        notes = wire.annotations_of(node)
        text = notes.get(wire.MIG_REQUEST)
        if not text:
            return None
        try:
            request = wire.MigLayoutRequest.from_json(text)
        except wire.WireError as exc:
            log.warning("%s", exc)
            return None
        done = 0
        if notes.get(wire.MIG_STATUS):
            try:
                done = wire.MigLayoutStatus.from_json(notes[wire.MIG_STATUS]).generation
            except wire.WireError as exc:
                log.warning("%s; handling the request again", exc)
        if request.generation <= done:
            return None
        if placed is None:
            placed = self.placed()
        errors: dict[str, str] = {}
        for uuid, layout in sorted(request.gpus.items()):
            error = self._lay_out(uuid, layout, placed)
            if error is not None:
                log.warning(
                    "MIG request %d: GPU %s not changed: %s", request.generation, uuid, error
                )
                errors[uuid] = error
        status = wire.MigLayoutStatus(request.generation, errors, time.time())
        self.publish(status)
        return status

    def _lay_out(
        self, uuid: str, layout: Sequence[tuple[str, int]], placed: Sequence[PlacedContainer]
    ) -> str | None:
        """Make ``layout`` the instances of GPU ``uuid``; None when done, else why not."""
        device = self.mig.get(uuid)
        if device is None:
            return f"GPU {uuid} is not a GPU in MIG mode that this agent owns"
        holders = sorted(
            p.workload_id
            for p in placed
            if p.assignment.mig is not None and p.assignment.mig.gpu_uuid == uuid
        )
        if holders:
            return (
                f"pods hold instances of it ({', '.join(holders)}); a GPU with instances "
                "held is never reconfigured"
            )
        table = device.profiles()
        wanted: set[Placement] = set()
        for profile, start in layout:
            found = table.find(profile)
            if found is None:
                return f"{profile!r} is not a MIG profile of {table.model}"
            wanted.add(Placement(start, found.name))
        now = device.instances()
        have = {i.placement for i in now}
        gpu_plan = GpuPlan(
            index=device.index,
            model=device.model,
            mig_enabled=device.mig_enabled(),
            enable_mig=False,
            before=tuple(i.state() for i in now),
            destroy=tuple(i.state() for i in now if i.placement not in wanted),
            create=tuple(sorted(wanted - have, key=lambda p: (p.start, p.profile))),
            assignments=(),
        )
        if not gpu_plan.changed:
            return None
        try:
            report = apply_plan([gpu_plan], [device], dry_run=False)
        except MigInputError as exc:
            return exc.reason
        for step in report.steps:
            log.info("MIG: %s", step)
        return report.error

    def placed(self) -> list[PlacedContainer]:
        """The fgpu pods bound to this node, with what they were granted (from the view's
        watch once :meth:`run` started it)."""
        out: list[PlacedContainer] = []
        for pod in self.view.bound_pods():
            text = wire.annotations_of(pod).get(wire.ASSIGNMENT)
            if not text or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            try:
                a = wire.Assignment.from_json(text)
            except wire.WireError:
                continue
            notes = wire.annotations_of(pod)
            squeezed = wire.squeezed_by(notes.get(wire.SQUEEZED_BY))
            uid = pod["metadata"].get("uid", "")
            suspend = notes.get(wire.SUSPEND) == "true"
            out.append(PlacedContainer(wire.pod_key(pod), uid, a, squeezed, suspend))
        return out

    def live(self) -> tuple[bool, str]:
        """The liveness probe: False only when :meth:`run` ended without :meth:`stop`, or
        its report loop has not begun a pass for :data:`STALL_S` (or ten intervals). Live
        while the first publication is still being retried."""
        if self._stop.is_set():
            return True, "stopping"
        if self._phase == "ended":
            return False, "the report loop ended"
        if self._phase == "new":
            return True, "starting"
        limit = max(STALL_S, 10 * self._interval_s)
        quiet = time.monotonic() - self._beat
        if quiet > limit:
            return False, f"no report began for {quiet:.0f} s (limit {limit:.0f})"
        return True, f"a report began {quiet:.0f} s ago"

    def ready(self) -> tuple[bool, str]:
        """The readiness probe: True once :meth:`run` published the inventory and listed
        this node's Node and pods (its watches then keep them current)."""
        if not self._started.is_set():
            why = f": {self._start_error}" if self._start_error else ""
            return False, f"the inventory of {self.node} is not published yet{why}"
        return True, f"{len(self.devices)} GPU(s) published; {len(self.last_placed)} fgpu pod(s)"

    def run(self, interval_s: float = 10.0) -> None:
        """Publish, start watching this node and its pods, then report every
        ``interval_s``, and at once after a change of either, until :meth:`stop`."""
        self._phase, self._interval_s = "running", interval_s
        try:
            self._run(interval_s)
        finally:
            self._phase = "ended"

    def _run(self, interval_s: float) -> None:
        while not self._stop.is_set():
            self._beat = time.monotonic()
            try:
                self.publish()
                self.view.start()
                if self.mig:
                    self.reconcile_mig(self.view.node())
                self._started.set()
                break
            except KubeError as exc:
                self._start_error = str(exc).splitlines()[0] if str(exc) else "failed"
                log.warning("publishing the inventory of %s failed: %s", self.node, exc)
                self._stop.wait(interval_s)
        while not self._stop.is_set():
            self._beat = time.monotonic()
            self._wake.wait(interval_s)
            self._beat = time.monotonic()
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.report()
            except KubeError as exc:
                log.warning("reporting usage of %s failed: %s", self.node, exc)
        self.view.stop()

    def stop(self) -> None:
        """End :meth:`run`."""
        self._stop.set()
        self._wake.set()

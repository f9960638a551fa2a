"""The MIG pool of the single-machine service: GPUs in MIG mode, their instances, and the pass
that places MIG workloads on them (issue #6 part 5; ``docs/mig.md``, "In the service").

GPUs in MIG mode are not offered to fractional requests (:mod:`fgpu.server.machine`); they
are this pool. A MIG workload asks for a profile (``--mig-profile 3g.40gb``) or a memory size
(``--isolation mig --gpu-memory 18GiB``: on each GPU model, the smallest profile with that
much, :func:`fgpu.mig.demand.smallest_fitting`). Each scheduling round, after the decision
core's round, :meth:`MigPool.schedule` takes the pending MIG workloads in order (priority,
then submission time, then id) and:

1. admits each against its queue (:class:`fgpu.sched.budget.QueueBudget`: the queue's and
   its ancestors' GPU limits, and non-preemptible work within its queue's quota, as the core
   does); a MIG
   instance counts ``1000 * compute slices // the GPU's compute slices`` milli-GPU
   (:func:`fgpu.mig.catalog.instance_milli`: 3g on an A100 is 428, 7g is 1000);
2. gives it a **free instance** of its profile when there is one: free means no workload of
   the service holds it and the device does not report processes on it. Among free ones it
   takes one on a GPU that already has instances in use (the most busy slices first), then
   the lowest GPU and start: idle GPUs stay idle, and only idle GPUs are reconfigured (3), so
   packing keeps the most options open;
3. for the workloads left, **reconfigures idle GPUs**: it asks :func:`fgpu.mig.planner.plan`
   for a plan over the GPUs none of whose instances is in use (a GPU with an instance in use
   is never changed), with those workloads' requests as the demand, records an event for
   each workload a change serves (before the device is touched), applies the plan through
   the devices (:func:`fgpu.mig.device.apply_plan`), and places the workloads on the
   instances it made (or idle ones it kept);
4. every workload left waits, with the reason.

MIG workloads are not preempted and do not preempt (not supported yet). The pool keeps no
state of its own: which instances exist comes from the devices, which workload holds which
instance from the store (the running workloads' allocations), so a restart of the service
reads both back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fgpu.agent.backend import GpuDevice
from fgpu.mig.catalog import MIG_TABLES, MigProfileTable, instance_milli
from fgpu.mig.demand import MigRequest, fitting_profiles, smallest_fitting
from fgpu.mig.device import MigDevice, MigInstance, apply_plan, gpu_from_device
from fgpu.mig.inventory import MigInputError
from fgpu.mig.planner import MigPlan, hand_out, plan
from fgpu.model.types import Allocation, Request
from fgpu.model.units import MILLI_PER_GPU, format_mib
from fgpu.rules.errors import BadRequest
from fgpu.sched.budget import QueueBudget
from fgpu.store.records import StoredMigInstance, StoredMigRequest

log = logging.getLogger("fgpu.server.mig")

EventSink = Callable[[str, str, str, str], None]
"""``(workload_id, kind, reason, message)``: records an event (the service's store)."""


@dataclass(frozen=True, slots=True)
class PoolGpu:
    """One GPU of the pool.

    Attributes:
        device: the GPU as the backend reports it (index, uuid, model, memory); its index
            (NVML's) is also its index on the MIG node ``HOST/mig``.
        mig: its MIG device (instances, create, destroy).
    """

    device: GpuDevice
    mig: MigDevice


@dataclass(frozen=True, slots=True)
class MigCandidate:
    """A pending MIG workload as the pass sees it.

    Attributes:
        id: workload id.
        queue: its leaf queue.
        priority: numeric priority.
        submitted_at: seconds.
        preemptible: counts as preemptible for the quota rule.
        want: what it asks for.
    """

    id: str
    queue: str
    priority: int
    submitted_at: float
    preemptible: bool
    want: StoredMigRequest


@dataclass(frozen=True, slots=True)
class MigPlace:
    """Start ``workload`` on a MIG instance.

    Attributes:
        workload: workload id.
        allocation: the allocation to store: the MIG node, the GPU's index, the instance's
            milli-GPU and memory (MiB); no CPU or host memory.
        gpu_uuid: the instance's GPU.
        instance: the instance, as stored with the allocation.
        reason: ``placed on a free MIG instance`` or ``placed on a new MIG instance``.
    """

    workload: str
    allocation: Allocation
    gpu_uuid: str
    instance: StoredMigInstance
    reason: str


@dataclass(slots=True)
class MigRound:
    """What one pass did.

    Attributes:
        places: workloads to start, in order.
        waits: workload id -> why it waits.
        changes: one line per GPU whose instances were changed (or that failed to change).
    """

    places: list[MigPlace] = field(default_factory=list)
    waits: dict[str, str] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)


class MigPool:
    """The GPUs in MIG mode of this machine and their instances.

    Args:
        gpus: the backend's GPUs in MIG mode (:attr:`fgpu.server.machine.Machine.mig_gpus`).
        devices: the backend's MIG devices; a GPU of ``gpus`` without one (same index) is
            left out with a warning.
        node_name: the name of the MIG node in allocations and views (``HOST/mig``).
    """

    def __init__(
        self, gpus: Sequence[GpuDevice], devices: Sequence[MigDevice], node_name: str
    ) -> None:
        by_index = {d.index: d for d in devices}
        pool: list[PoolGpu] = []
        for gpu in sorted(gpus, key=lambda g: g.index):
            mig = by_index.get(gpu.index)
            if mig is None:
                log.warning(
                    "GPU %d (%s) is in MIG mode but fgpu cannot manage its MIG instances; "
                    "it is not used",
                    gpu.index,
                    gpu.model,
                )
                continue
            pool.append(PoolGpu(gpu, mig))
        self.gpus: tuple[PoolGpu, ...] = tuple(pool)
        self.node_name = node_name

    # ------------------------------------------------------------------ requests
    def _tables(self) -> dict[str, MigProfileTable]:
        return {g.mig.model: g.mig.profiles() for g in self.gpus}

    def request_for(self, want: StoredMigRequest) -> Request:
        """Check that some MIG GPU here can hold ``want`` when idle, and the request to list
        for it: one GPU, the profile's compute share (for a profile) and its memory (the
        least among the models here that have it; for a memory size, that size).

        Raises:
            BadRequest: no GPU is in MIG mode (field ``mig_profile``, or ``isolation`` for
                a memory request); a profile none of the models here has (``mig_profile``;
                the valid ones listed per model, and the models that have it, if any); a
                memory size above every profile here (``gpu_memory``).
        """
        tables = self._tables()
        field_name = "mig_profile" if want.profile is not None else "isolation"
        if not tables:
            raise BadRequest(
                field_name,
                "no GPU of this machine is in MIG mode (root turns it on with "
                "`nvidia-smi -i N -mig 1`; --simulate-gpus 2xA100-80GB:mig simulates it)",
            )
        here = " or ".join(sorted(tables))
        if want.profile is not None:
            found = [(t, p) for t in tables.values() if (p := t.find(want.profile)) is not None]
            if not found:
                valid = "; ".join(f"{m}: {', '.join(t.names())}" for m, t in sorted(tables.items()))
                elsewhere = sorted(m for m, t in MIG_TABLES.items() if t.find(want.profile))
                where = (
                    f"it is a profile of {', '.join(elsewhere)}, not of {here}"
                    if elsewhere
                    else f"not a MIG profile of {here}"
                )
                raise BadRequest(
                    "mig_profile",
                    f"{want.profile!r}: {where}; valid here: {valid}",
                )
            milli = min(instance_milli(t, p) for t, p in found)
            memory = min(p.memory_mib for _, p in found)
            return Request(gpu_count=1, gpu_milli=max(milli, 1), gpu_memory_mib=memory)
        assert want.memory_mib is not None
        ask = MigRequest(memory_mib=want.memory_mib)
        if not any(fitting_profiles(t, ask) for t in tables.values()):
            largest = "; ".join(
                f"{m}: {t.profiles[-1].name} ({t.profiles[-1].memory_mib} MiB)"
                for m, t in sorted(tables.items())
            )
            raise BadRequest(
                "gpu_memory",
                f"{want.memory_mib} MiB is more than any MIG profile here has (largest: {largest})",
            )
        return Request(gpu_count=1, gpu_memory_mib=want.memory_mib)

    @staticmethod
    def profile_for(want: StoredMigRequest, table: MigProfileTable) -> str | None:
        """The profile that serves ``want`` on a GPU with ``table``: the named one, or the
        smallest with enough memory; None when the model has none."""
        if want.profile is not None:
            found = table.find(want.profile)
            return found.name if found is not None else None
        assert want.memory_mib is not None
        return smallest_fitting(table, MigRequest(memory_mib=want.memory_mib))

    @staticmethod
    def describe(want: StoredMigRequest) -> str:
        """``3g.40gb``, or ``the smallest with 18GiB``, for reasons."""
        if want.profile is not None:
            return want.profile
        assert want.memory_mib is not None
        return f"the smallest profile with {format_mib(want.memory_mib)}"

    # ------------------------------------------------------------------ state
    def find(self, stored: StoredMigInstance) -> MigInstance | None:
        """The instance a workload's allocation names, if its GPU still has it (same GPU
        uuid, same instance uuid)."""
        for gpu in self.gpus:
            if gpu.device.uuid == stored.gpu_uuid:
                for instance in gpu.mig.instances():
                    if instance.uuid == stored.uuid:
                        return instance
        return None

    def capacity_milli(self) -> int:
        """1000 per GPU of the pool."""
        return MILLI_PER_GPU * len(self.gpus)

    # ------------------------------------------------------------------ the pass
    def schedule(
        self,
        candidates: Sequence[MigCandidate],
        held: Mapping[str, str],
        budget: QueueBudget,
        record: EventSink,
    ) -> MigRound:
        """One pass over the pending MIG workloads (the module docstring has the rules).

        Args:
            candidates: the pending MIG workloads (any order; sorted here).
            held: instance uuid -> the workload that holds it (running or paused MIG
                workloads).
            budget: queue use so far this round (charged for every placement made here).
            record: writes an event; called for each workload a reconfiguration serves,
                before the devices are changed, and when a change fails.

        Returns:
            The placements to start, the waits with their reasons, and the changes made.
        """
        result = MigRound()
        if not candidates:
            return result
        ordered = sorted(candidates, key=lambda c: (-c.priority, c.submitted_at, c.id))
        if not self.gpus:
            for c in ordered:
                result.waits[c.id] = "no GPU of this machine is in MIG mode any more"
            return result
        taken = set(held)
        snapshot = {g.device.index: g.mig.instances() for g in self.gpus}
        left: list[tuple[MigCandidate, int]] = []
        for c in ordered:
            milli = self._least_milli(c.want)
            refused = budget.admit(c.queue, milli, c.preemptible)
            if refused is not None:
                result.waits[c.id] = refused
                continue
            found = self._free_instance(c.want, snapshot, taken)
            if found is None:
                budget.charge(c.queue, milli, c.preemptible)  # while a change is planned
                left.append((c, milli))
                continue
            gpu, instance = found
            taken.add(instance.uuid)
            place = self._place(c.id, gpu, instance, "placed on a free MIG instance")
            budget.charge(c.queue, place.allocation.gpu_milli[0], c.preemptible)
            result.places.append(place)
        if left:
            self._reconfigure(left, snapshot, taken, budget, record, result)
        return result

    def _least_milli(self, want: StoredMigRequest) -> int:
        """What ``want`` counts against its queue at least (for admission before the GPU is
        known): the least over the models that can serve it."""
        found = [
            instance_milli(t, p)
            for t in self._tables().values()
            if (name := self.profile_for(want, t)) is not None and (p := t.find(name)) is not None
        ]
        return min(found, default=0)

    def _busy(self, gpu: PoolGpu, instances: Sequence[MigInstance], taken: set[str]) -> int:
        """Compute slices of ``gpu`` in use (held by a workload or busy on the device)."""
        table = gpu.mig.profiles()
        return sum(
            p.compute_slices
            for i in instances
            if (i.in_use or i.uuid in taken) and (p := table.find(i.profile)) is not None
        )

    def _free_instance(
        self,
        want: StoredMigRequest,
        snapshot: Mapping[int, Sequence[MigInstance]],
        taken: set[str],
    ) -> tuple[PoolGpu, MigInstance] | None:
        best: tuple[tuple[int, int, int, int], PoolGpu, MigInstance] | None = None
        for gpu in self.gpus:
            name = self.profile_for(want, gpu.mig.profiles())
            if name is None:
                continue
            instances = snapshot[gpu.device.index]
            busy = self._busy(gpu, instances, taken)
            for instance in instances:
                if instance.profile != name or instance.in_use or not instance.uuid:
                    continue
                if instance.uuid in taken:
                    continue
                key = (0 if busy else 1, -busy, gpu.device.index, instance.start)
                if best is None or key < best[0]:
                    best = (key, gpu, instance)
        return None if best is None else (best[1], best[2])

    def _place(self, workload: str, gpu: PoolGpu, instance: MigInstance, why: str) -> MigPlace:
        table = gpu.mig.profiles()
        profile = table.get(instance.profile)
        allocation = Allocation(
            node=-1,
            node_name=self.node_name,
            gpus=(gpu.device.index,),
            gpu_milli=(instance_milli(table, profile),),
            gpu_memory_mib=(profile.memory_mib,),
            cpu_milli=0,
            memory_mib=0,
        )
        stored = StoredMigInstance(
            gpu.device.index, gpu.device.uuid, instance.profile, instance.start, instance.uuid
        )
        return MigPlace(workload, allocation, gpu.device.uuid, stored, why)

    def _reconfigure(
        self,
        left: list[tuple[MigCandidate, int]],
        snapshot: Mapping[int, Sequence[MigInstance]],
        taken: set[str],
        budget: QueueBudget,
        record: EventSink,
        result: MigRound,
    ) -> None:
        """Step 3 of the pass: plan on the idle GPUs, record, apply, place."""
        idle = [
            g
            for g in self.gpus
            if not any(i.in_use or i.uuid in taken for i in snapshot[g.device.index])
        ]
        busy_text = ", ".join(f"GPU {g.device.index}" for g in self.gpus if g not in idle)
        waiting = (
            f"no free MIG instance of {{what}}; GPUs with instances in use ({busy_text}) are "
            "not reconfigured"
            if busy_text
            else "no free MIG instance of {what}"
        )
        tables = [g.mig.profiles() for g in idle]
        demand: list[tuple[MigCandidate, MigRequest]] = []
        room = sum(t.memory_slices for t in tables)  # no GPU holds more instances than this
        for c, milli in left:
            ask = (
                MigRequest(profile=c.want.profile)
                if c.want.profile is not None
                else MigRequest(memory_mib=c.want.memory_mib)
            )
            if len(demand) < room and any(fitting_profiles(t, ask) for t in tables):
                demand.append((c, ask))
            else:
                budget.charge(c.queue, milli, c.preemptible, -1)
                result.waits[c.id] = waiting.format(what=self.describe(c.want))
        if not demand:
            return
        try:
            planned = plan([gpu_from_device(g.mig) for g in idle], [ask for _, ask in demand])
        except MigInputError as exc:  # the checks above make this a bug; keep serving
            log.error("MIG planner refused the demand: %s", exc)
            planned = None
        served = self._assign(planned, demand) if planned is not None else {}
        for c, ask in demand:
            if c not in served:
                budget.charge(c.queue, self._least_milli(c.want), c.preemptible, -1)
                result.waits[c.id] = waiting.format(what=self.describe(c.want)) + (
                    f" and no idle MIG GPU has room for it ({self._unserved(planned, ask)})"
                    if planned is not None
                    else ""
                )
        if planned is None or not served:
            return
        changed = [g for g in planned.gpus if g.changed]
        for gpu_plan in changed:
            for c, (index, profile, start, _) in served.items():
                if index == gpu_plan.index:
                    record(
                        c.id,
                        "mig-reconfigure",
                        "no free MIG instance",
                        f"{gpu_plan.explanation[0]}; this workload gets {profile}@{start}",
                    )
        error: str | None = None
        if changed:
            try:
                report = apply_plan(changed, [g.mig for g in idle], dry_run=False)
                error = report.error
            except MigInputError as exc:
                error = str(exc)
            for gpu_plan in changed:
                line = gpu_plan.explanation[0]
                result.changes.append(line if error is None else f"{line} (failed: {error})")
        by_index = {g.device.index: g for g in idle}
        now = {i: by_index[i].mig.instances() for i in {s[0] for s in served.values()}}
        for c, (index, profile, start, new) in served.items():
            made = next(
                (
                    i
                    for i in now[index]
                    if (i.profile, i.start) == (profile, start)
                    and i.uuid
                    and not i.in_use
                    and i.uuid not in taken
                ),
                None,
            )
            if made is None:
                budget.charge(c.queue, self._least_milli(c.want), c.preemptible, -1)
                why = error or f"{profile}@{start} on GPU {index} is not there after the change"
                record(c.id, "mig-failed", "MIG change failed", why)
                result.waits[c.id] = f"the MIG change for it failed: {why}"
                continue
            taken.add(made.uuid)
            why = "placed on a new MIG instance" if new else "placed on a free MIG instance"
            place = self._place(c.id, by_index[index], made, why)
            # charged at the least before; now at what it holds
            budget.charge(c.queue, self._least_milli(c.want), c.preemptible, -1)
            budget.charge(c.queue, place.allocation.gpu_milli[0], c.preemptible)
            result.places.append(place)

    @staticmethod
    def _assign(
        planned: MigPlan, demand: Sequence[tuple[MigCandidate, MigRequest]]
    ) -> dict[MigCandidate, tuple[int, str, int, bool]]:
        """Hand the plan's assignments to the workloads, in their order: workload ->
        (GPU index, profile, start, created by the plan)."""
        return {
            c: (a.gpu_index, a.profile, a.start, a.new)
            for c, a in hand_out(planned, demand).items()
        }

    @staticmethod
    def _unserved(planned: MigPlan, ask: MigRequest) -> str:
        for u in planned.unserved:
            if u.request == ask.text:
                return u.reason
        return "the other requests take it"


__all__ = [
    "EventSink",
    "MigCandidate",
    "MigPlace",
    "MigPool",
    "MigRound",
    "PoolGpu",
]

"""MIG devices: the create/destroy interface, a simulated device, and applying a plan.

:class:`MigDevice` is what applying a plan needs from one GPU: its MIG mode and profile
table, its instances, and create (with an explicit start) and destroy. Two implementations:
:class:`SimulatedMigDevice` here (in memory; tests and ``--simulate-gpus``) and
:class:`fgpu.agent.mig_nvml.NvmlMigDevice` (NVML).

:func:`apply_plan` checks the whole plan against the devices first (same instances as when
the plan was made, nothing to destroy in use, MIG on, final layouts valid) and changes
nothing when a check fails; then it destroys, then creates, GPU by GPU, and stops at the first
device error, reporting what was done.
"""

from __future__ import annotations

import uuid as uuid_module
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from fgpu.mig.catalog import MigProfileTable, mig_profiles
from fgpu.mig.inventory import MigGpu, MigInputError, MigInstanceState, parse_gpu_spec
from fgpu.mig.layout import Placement, is_valid, layout_text, make_layout
from fgpu.mig.planner import GpuPlan

_NAMESPACE = uuid_module.UUID("6d1f3c52-8f0e-4f7e-9a55-2b9c0d7e4a11")


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A GPU instance on a device (with its one compute instance, as fgpu creates them).

    Attributes:
        profile: profile name.
        start: first memory slice.
        uuid: the MIG device uuid (``MIG-...``) that ``CUDA_VISIBLE_DEVICES`` takes; empty when
            the device has not given one (a GPU instance without a compute instance).
        gpu_instance_id: the device's GPU instance id.
        in_use: processes run on it.
    """

    profile: str
    start: int
    uuid: str
    gpu_instance_id: int
    in_use: bool = False

    @property
    def placement(self) -> Placement:
        return Placement(self.start, self.profile)

    def state(self) -> MigInstanceState:
        """The planner's view of it."""
        return MigInstanceState(self.profile, self.start, self.in_use, self.uuid or None)


class MigDeviceError(RuntimeError):
    """The device refused or failed an operation (NVML error, no room, in use)."""


@runtime_checkable
class MigDevice(Protocol):
    """One GPU whose MIG instances can be listed, created and destroyed."""

    @property
    def index(self) -> int:
        """The GPU's index on its node."""
        ...

    @property
    def model(self) -> str:
        """Catalog model name."""
        ...

    def mig_enabled(self) -> bool:
        """MIG mode is on now."""
        ...

    def profiles(self) -> MigProfileTable:
        """The profile table (read from the device where it can)."""
        ...

    def instances(self) -> list[MigInstance]:
        """The GPU instances, sorted by start."""
        ...

    def create(self, profile: str, start: int) -> MigInstance:
        """Create a GPU instance of ``profile`` at ``start`` and its compute instance.

        Raises:
            MigDeviceError: not possible (overlap, bad start, MIG off) or the device failed.
        """
        ...

    def destroy(self, instance: MigInstance) -> None:
        """Destroy the instance's compute instances, then the GPU instance.

        Raises:
            MigDeviceError: it is in use, gone, or the device failed.
        """
        ...


def gpu_from_device(device: MigDevice) -> MigGpu:
    """The planner's view of a device (its table included, so the device's answer wins)."""
    return MigGpu(
        device.index,
        device.model,
        device.mig_enabled(),
        tuple(i.state() for i in device.instances()),
        table=device.profiles(),
    )


class SimulatedMigDevice:
    """A MIG GPU in memory, with the same checks a real one makes.

    Uuids are deterministic: ``MIG-`` and a name-based uuid of the GPU's uuid, the GPU instance
    id and the placement, so the same operations give the same uuids in every run.

    Args:
        index: GPU index.
        model: catalog model name or alias.
        gpu_uuid: the parent GPU's uuid (default ``GPU-sim-<index>``).
        mig_enabled: MIG mode.
        table: profile table; default the catalog's.
        on_change: called after every create and destroy (the service's simulated GPUs keep
            their instances in a file with it, as a real GPU keeps them across a restart of
            the service).

    Raises:
        NotMigCapableError, UnknownGpuModelError: the model has no MIG profiles.
    """

    def __init__(
        self,
        index: int,
        model: str,
        *,
        gpu_uuid: str | None = None,
        mig_enabled: bool = True,
        table: MigProfileTable | None = None,
        on_change: Callable[[SimulatedMigDevice], None] | None = None,
    ) -> None:
        self._index = index
        self.on_change = on_change
        self._table = table or mig_profiles(model)
        self.gpu_uuid = gpu_uuid or f"GPU-sim-{index}"
        self._mig_enabled = mig_enabled
        self._instances: dict[str, MigInstance] = {}
        self._next_id = 1
        self.log: list[str] = []

    @property
    def index(self) -> int:
        return self._index

    @property
    def model(self) -> str:
        return self._table.model

    def mig_enabled(self) -> bool:
        return self._mig_enabled

    def profiles(self) -> MigProfileTable:
        return self._table

    def instances(self) -> list[MigInstance]:
        return sorted(self._instances.values(), key=lambda i: (i.start, i.profile))

    def create(self, profile: str, start: int) -> MigInstance:
        if not self._mig_enabled:
            raise MigDeviceError(f"GPU {self._index}: MIG mode is off")
        found = self._table.find(profile)
        if found is None:
            raise MigDeviceError(
                f"GPU {self._index}: {profile!r} is not a MIG profile of {self.model}"
            )
        layout = make_layout(
            [*(i.placement for i in self._instances.values()), (found.name, start)]
        )
        status = is_valid(self._table, layout)
        if not status:
            raise MigDeviceError(
                f"GPU {self._index}: cannot create {found.name}@{start}: {status.reason}"
            )
        gi_id = self._next_id
        self._next_id += 1
        name = f"{self.gpu_uuid}/{gi_id}/{found.name}@{start}"
        instance = MigInstance(
            found.name, start, f"MIG-{uuid_module.uuid5(_NAMESPACE, name)}", gi_id
        )
        self._instances[instance.uuid] = instance
        self.log.append(f"create {found.name}@{start} -> {instance.uuid}")
        self._changed()
        return instance

    def destroy(self, instance: MigInstance) -> None:
        current = self._instances.get(instance.uuid)
        if current is None:
            raise MigDeviceError(f"GPU {self._index}: no instance {instance.uuid}")
        if current.in_use:
            raise MigDeviceError(f"GPU {self._index}: {current.profile}@{current.start} is in use")
        del self._instances[instance.uuid]
        self.log.append(f"destroy {current.profile}@{current.start}")
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    def restore(self, instances: Sequence[MigInstance]) -> None:
        """Replace the instances with ``instances`` as they were (uuids and GPU instance ids
        kept; what a real GPU still holds when the service starts again). ``on_change`` is not
        called.

        Raises:
            MigDeviceError: MIG mode is off, or the instances do not form a valid layout of
                this model (nothing is changed then).
        """
        if not self._mig_enabled and instances:
            raise MigDeviceError(f"GPU {self._index}: MIG mode is off")
        status = is_valid(self._table, make_layout(i.placement for i in instances))
        if not status:
            raise MigDeviceError(f"GPU {self._index}: not a valid layout: {status.reason}")
        self._instances = {i.uuid: i for i in instances}
        self._next_id = max((i.gpu_instance_id for i in instances), default=0) + 1

    def set_in_use(self, uuid: str, in_use: bool = True) -> None:
        """Mark an instance busy or idle (what processes on it would do).

        Raises:
            KeyError: no such instance.
        """
        current = self._instances[uuid]
        self._instances[uuid] = MigInstance(
            current.profile, current.start, current.uuid, current.gpu_instance_id, in_use
        )

    def __repr__(self) -> str:
        held = layout_text([i.placement for i in self.instances()])
        return f"SimulatedMigDevice({self._index}, {self.model!r}, {held})"


def simulated_devices(spec: str, field: str = "--simulate-gpus") -> list[SimulatedMigDevice]:
    """Empty MIG GPUs from a spec such as ``"2xA100-80GB"`` (see
    :func:`fgpu.mig.inventory.parse_gpu_spec`).

    Raises:
        MigInputError: the spec is not valid.
    """
    return [SimulatedMigDevice(g.index, g.model) for g in parse_gpu_spec(spec, field)]


# --- applying a plan -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApplyStep:
    """One operation of an apply: ``destroy`` or ``create`` of ``profile@start`` on a GPU;
    ``uuid`` is the instance's (for a create, the new one; empty in a dry run)."""

    gpu_index: int
    action: str
    profile: str
    start: int
    uuid: str = ""

    def __str__(self) -> str:
        text = f"GPU {self.gpu_index}: {self.action} {self.profile}@{self.start}"
        return f"{text} ({self.uuid})" if self.uuid else text


@dataclass(slots=True)
class ApplyReport:
    """What :func:`apply_plan` did (or, in a dry run, would do).

    Attributes:
        dry_run: nothing was changed.
        steps: operations done, in order (all of them in a dry run).
        pending: operations not done because an earlier one failed.
        error: the device error that stopped the apply, or None.
    """

    dry_run: bool
    steps: list[ApplyStep] = field(default_factory=list)
    pending: list[ApplyStep] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def check_plan(plans: Sequence[GpuPlan], devices: Sequence[MigDevice]) -> None:
    """Check that ``plans`` can be applied to ``devices`` as they are now.

    Raises:
        MigInputError: a GPU of the plan is missing or of another model, needs MIG mode
            turned on, changed since the plan was made, would lose an instance in use, or
            would end in a layout that is not valid. Field ``plan.gpus[i]``.
    """
    by_index = {d.index: d for d in devices}
    for position, plan in enumerate(plans):
        where = f"plan.gpus[{position}]"
        if not plan.changed:
            continue
        device = by_index.get(plan.index)
        if device is None:
            known = ", ".join(str(i) for i in sorted(by_index)) or "none"
            raise MigInputError(where, f"GPU {plan.index} is not on this machine (GPUs: {known})")
        if device.model != plan.model:
            raise MigInputError(
                where, f"GPU {plan.index} is an {device.model}, the plan is for an {plan.model}"
            )
        if plan.enable_mig or not device.mig_enabled():
            raise MigInputError(
                where,
                f"GPU {plan.index} has MIG mode off; fgpu does not change MIG modes (A100 and "
                f"A30 reset the GPU): run `nvidia-smi -i {plan.index} -mig 1` as root, then "
                "plan and apply again",
            )
        now = {i.placement: i for i in device.instances()}
        expected = make_layout(b.placement for b in plan.before)
        if tuple(sorted(now)) != expected:
            raise MigInputError(
                where,
                f"GPU {plan.index} changed since the plan was made: it holds "
                f"{layout_text(sorted(now))}, the plan expected {layout_text(expected)}; "
                "plan again",
            )
        for doomed in plan.destroy:
            if now[doomed.placement].in_use:
                raise MigInputError(
                    where,
                    f"GPU {plan.index}: {doomed.profile}@{doomed.start} is in use now; "
                    "it will not be destroyed",
                )
        status = is_valid(device.profiles(), plan.after)
        if not status:
            raise MigInputError(f"{where}.create", f"GPU {plan.index}: {status.reason}")


def apply_plan(
    plans: Sequence[GpuPlan], devices: Sequence[MigDevice], *, dry_run: bool = True
) -> ApplyReport:
    """Apply per-GPU plans: all checks first (:func:`check_plan`), then per GPU in index
    order its destroys, then its creates with their explicit starts.

    Args:
        plans: e.g. :attr:`fgpu.mig.planner.MigPlan.gpus`; unchanged GPUs are skipped.
        devices: the machine's MIG devices, by index.
        dry_run: only list the operations (the default).

    Returns:
        The report; a device error stops the apply and is in ``report.error`` with the
        operations left in ``report.pending`` (operations done stay done).

    Raises:
        MigInputError: a check failed; nothing was changed.
    """
    check_plan(plans, devices)
    by_index = {d.index: d for d in devices}
    todo: list[ApplyStep] = []
    for plan in sorted(plans, key=lambda p: p.index):
        todo += [
            ApplyStep(plan.index, "destroy", d.profile, d.start, d.uuid or "") for d in plan.destroy
        ]
        todo += [ApplyStep(plan.index, "create", c.profile, c.start) for c in plan.create]
    report = ApplyReport(dry_run)
    if dry_run:
        report.steps = todo
        return report
    for number, step in enumerate(todo):
        device = by_index[step.gpu_index]
        try:
            if step.action == "destroy":
                target = next(
                    i
                    for i in device.instances()
                    if (i.profile, i.start) == (step.profile, step.start)
                )
                device.destroy(target)
                report.steps.append(
                    ApplyStep(step.gpu_index, "destroy", step.profile, step.start, target.uuid)
                )
            else:
                made = device.create(step.profile, step.start)
                report.steps.append(
                    ApplyStep(step.gpu_index, "create", step.profile, step.start, made.uuid)
                )
        except (MigDeviceError, StopIteration) as exc:
            report.error = f"{step}: {exc or 'the instance is gone'}"
            report.pending = todo[number:]
            break
    return report

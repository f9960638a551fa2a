"""MIG through NVML: a GPU's profile table as the device reports it, and a
:class:`~fgpu.mig.device.MigDevice` that creates and destroys instances with explicit starts.

NVML calls (nvidia-ml-py, NVML API reference "Multi Instance GPU Management"):

- profiles: ``nvmlDeviceGetGpuInstanceProfileInfo(handle, p)`` for each
  ``p < NVML_GPU_INSTANCE_PROFILE_COUNT`` (``.id``, ``.sliceCount`` compute slices,
  ``.instanceCount``, ``.multiprocessorCount``, ``.memorySizeMB``, ``.name`` such as
  ``b"MIG 1g.10gb"``); ``nvmlDeviceGetGpuInstancePossiblePlacements(handle, id, placements,
  count)``, first with ``placements=None`` to learn the count, then with an array of
  ``c_nvmlGpuInstancePlacement_t`` (``.start``, ``.size`` in memory slices);
- instances: ``nvmlDeviceGetGpuInstances(handle, id, array, count)`` and
  ``nvmlGpuInstanceGetInfo(gi)`` (``.id``, ``.placement.start``); uuids and use through the MIG
  device handles: ``nvmlDeviceGetMaxMigDeviceCount``, ``nvmlDeviceGetMigDeviceHandleByIndex``,
  ``nvmlDeviceGetGpuInstanceId``, ``nvmlDeviceGetUUID``,
  ``nvmlDeviceGetComputeRunningProcesses`` (an instance whose processes cannot be read
  counts as in use);
- create: ``nvmlDeviceCreateGpuInstanceWithPlacement(handle, id, pointer(placement))``, then
  one compute instance over the whole GPU instance: the compute-instance profile whose
  ``sliceCount`` equals the GPU instance's
  (``nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, p,
  NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)``) and
  ``nvmlGpuInstanceCreateComputeInstance(gi, ci_id)``; a failed compute instance destroys the
  GPU instance again;
- destroy: ``nvmlDeviceGetGpuInstanceById``, ``nvmlGpuInstanceGetComputeInstances`` and
  ``nvmlComputeInstanceDestroy`` for each compute instance, then ``nvmlGpuInstanceDestroy``.

Creating and destroying need root. Nothing here changes the MIG mode. Counts go in and out
through ``ctypes.pointer`` so a stand-in module can fill them; the module itself is passed
in (``nvml=``), as for :class:`fgpu.agent.nvml.NvmlBackend`.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass, field
from typing import Any

from fgpu.agent.nvml import NvmlUnavailableError, catalog_name_for
from fgpu.mig.catalog import MIG_TABLES, MigProfile, MigProfileTable
from fgpu.mig.device import MigDeviceError, MigInstance

_log = logging.getLogger(__name__)
_MIB = 1024 * 1024
_GI_PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT in nvidia-ml-py 12/13
_CI_PROFILE_COUNT = 0x9  # NVML_COMPUTE_INSTANCE_PROFILE_COUNT


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _profile_name(info: Any) -> str:
    raw = _text(getattr(info, "name", b"") or b"").strip()
    if raw.upper().startswith("MIG "):
        raw = raw[4:]
    if raw:
        return raw.strip().lower()
    gib = round(int(info.memorySizeMB) / 1024)
    return f"{int(info.sliceCount)}g.{gib}gb"


def possible_placements(nvml: Any, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    """``(start, size)`` of every placement NVML allows for a GPU instance profile.

    Raises:
        nvml.NVMLError: NVML refused.
    """
    count = ctypes.c_uint(0)
    try:
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            handle, profile_id, None, ctypes.pointer(count)
        )
        size = max(int(count.value), 1)
    except nvml.NVMLError:
        size = 16  # drivers that want a buffer at once
    array = (nvml.c_nvmlGpuInstancePlacement_t * size)()
    count.value = size
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
        handle, profile_id, array, ctypes.pointer(count)
    )
    return sorted((int(array[i].start), int(array[i].size)) for i in range(int(count.value)))


def read_profile_table(nvml: Any, handle: Any, model: str) -> MigProfileTable:
    """The GPU instance profiles a device reports, as a table (``source="nvml"``).

    Args:
        nvml: the ``pynvml`` module or a stand-in.
        handle: the GPU's NVML handle.
        model: the catalog name to give the table.

    Raises:
        MigDeviceError: the device reports no profile (MIG mode off, or not MIG capable).
    """
    profiles: list[MigProfile] = []
    seen: set[int] = set()
    for number in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", _GI_PROFILE_COUNT))):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, number)
        except nvml.NVMLError:
            continue
        profile_id = int(info.id)
        if int(info.instanceCount) == 0 or profile_id in seen:
            continue
        seen.add(profile_id)
        try:
            placements = possible_placements(nvml, handle, profile_id)
        except nvml.NVMLError as exc:
            _log.debug("NVML: no placements for profile %d: %s", profile_id, exc)
            continue
        if not placements:
            continue
        profiles.append(
            MigProfile(
                _profile_name(info),
                profile_id,
                int(info.sliceCount),
                placements[0][1],
                int(info.memorySizeMB),
                int(info.multiprocessorCount),
                int(info.instanceCount),
                tuple(start for start, _ in placements),
            )
        )
    if not profiles:
        raise MigDeviceError("the device reports no MIG profiles (is MIG mode on?)")
    profiles.sort(key=lambda p: (p.compute_slices, p.memory_slices, p.name))
    return MigProfileTable(
        model,
        max(p.compute_slices for p in profiles),
        max(s + p.memory_slices for p in profiles for s in p.starts),
        tuple(profiles),
        source="nvml",
    )


class NvmlMigDevice:
    """One MIG GPU through NVML (see the module docstring for the calls).

    Args:
        nvml: the ``pynvml`` module or a stand-in.
        handle: the GPU's NVML handle.
        index: its NVML index.
        model: its catalog model name.
        table: its profile table (:func:`read_profile_table`, else the catalog's).
        mig_enabled: MIG mode now.
    """

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        index: int,
        model: str,
        table: MigProfileTable,
        mig_enabled: bool,
    ) -> None:
        self._nvml = nvml
        self._handle = handle
        self._index = index
        self._model = model
        self._table = table
        self._mig_enabled = mig_enabled

    @property
    def index(self) -> int:
        return self._index

    @property
    def model(self) -> str:
        return self._model

    def mig_enabled(self) -> bool:
        return self._mig_enabled

    def profiles(self) -> MigProfileTable:
        return self._table

    def _mig_devices(self) -> dict[int, tuple[str, bool]]:
        """GPU instance id -> (MIG device uuid, in use)."""
        nvml = self._nvml
        found: dict[int, tuple[str, bool]] = {}
        try:
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(self._handle))
        except nvml.NVMLError:
            return found
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(self._handle, slot)
                gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
                uuid = _text(nvml.nvmlDeviceGetUUID(mig))
            except nvml.NVMLError:
                continue
            try:
                busy = bool(nvml.nvmlDeviceGetComputeRunningProcesses(mig))
            except nvml.NVMLError:
                busy = True  # cannot tell: never destroy what may be in use
            found[gi_id] = (uuid, busy)
        return found

    def _gpu_instances(self) -> list[tuple[Any, Any, MigProfile]]:
        nvml = self._nvml
        found: list[tuple[Any, Any, MigProfile]] = []
        for profile in self._table.profiles:
            array = (nvml.c_nvmlGpuInstance_t * profile.max_count)()
            count = ctypes.c_uint(profile.max_count)
            try:
                nvml.nvmlDeviceGetGpuInstances(
                    self._handle, profile.profile_id, array, ctypes.pointer(count)
                )
            except nvml.NVMLError as exc:
                raise MigDeviceError(
                    f"GPU {self._index}: cannot list {profile.name}: {exc}"
                ) from exc
            for i in range(int(count.value)):
                gi = array[i]
                found.append((gi, nvml.nvmlGpuInstanceGetInfo(gi), profile))
        return found

    def instances(self) -> list[MigInstance]:
        migs = self._mig_devices()
        out = []
        for _, info, profile in self._gpu_instances():
            gi_id = int(info.id)
            uuid, busy = migs.get(gi_id, ("", False))
            out.append(MigInstance(profile.name, int(info.placement.start), uuid, gi_id, busy))
        return sorted(out, key=lambda i: (i.start, i.profile))

    def _compute_profile_id(self, gi: Any, slices: int) -> int:
        nvml = self._nvml
        shared = int(getattr(nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
        for number in range(
            int(getattr(nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", _CI_PROFILE_COUNT))
        ):
            try:
                info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, number, shared)
            except nvml.NVMLError:
                continue
            if int(info.sliceCount) == slices:
                return int(info.id)
        raise MigDeviceError(f"GPU {self._index}: no compute instance profile of {slices} slices")

    def create(self, profile: str, start: int) -> MigInstance:
        nvml = self._nvml
        chosen = self._table.find(profile)
        if chosen is None:
            raise MigDeviceError(
                f"GPU {self._index}: {profile!r} is not a MIG profile of {self._model}"
            )
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = chosen.memory_slices
        try:
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                self._handle, chosen.profile_id, ctypes.pointer(placement)
            )
        except nvml.NVMLError as exc:
            raise MigDeviceError(
                f"GPU {self._index}: cannot create {chosen.name}@{start}: {exc}"
            ) from exc
        try:
            nvml.nvmlGpuInstanceCreateComputeInstance(
                gi, self._compute_profile_id(gi, chosen.compute_slices)
            )
        except (nvml.NVMLError, MigDeviceError) as exc:
            try:
                nvml.nvmlGpuInstanceDestroy(gi)
            except nvml.NVMLError as undo:
                _log.warning(
                    "GPU %d: could not undo %s@%d: %s", self._index, chosen.name, start, undo
                )
            raise MigDeviceError(
                f"GPU {self._index}: {chosen.name}@{start}: no compute instance: {exc}"
            ) from exc
        gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
        uuid = self._mig_devices().get(gi_id, ("", False))[0]
        return MigInstance(chosen.name, start, uuid, gi_id, False)

    def destroy(self, instance: MigInstance) -> None:
        nvml = self._nvml
        now = {i.gpu_instance_id: i for i in self.instances()}
        current = now.get(instance.gpu_instance_id)
        if current is None or current.placement != instance.placement:
            raise MigDeviceError(f"GPU {self._index}: {instance.profile}@{instance.start} is gone")
        if current.in_use:
            raise MigDeviceError(f"GPU {self._index}: {current.profile}@{current.start} is in use")
        try:
            gi = nvml.nvmlDeviceGetGpuInstanceById(self._handle, current.gpu_instance_id)
            shared = int(getattr(nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
            done: set[int] = set()
            for number in range(
                int(getattr(nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", _CI_PROFILE_COUNT))
            ):
                try:
                    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, number, shared)
                except nvml.NVMLError:
                    continue
                if int(info.id) in done or int(info.instanceCount) == 0:
                    continue
                done.add(int(info.id))
                array = (nvml.c_nvmlComputeInstance_t * int(info.instanceCount))()
                count = ctypes.c_uint(int(info.instanceCount))
                nvml.nvmlGpuInstanceGetComputeInstances(
                    gi, int(info.id), array, ctypes.pointer(count)
                )
                for i in range(int(count.value)):
                    nvml.nvmlComputeInstanceDestroy(array[i])
            nvml.nvmlGpuInstanceDestroy(gi)
        except nvml.NVMLError as exc:
            raise MigDeviceError(
                f"GPU {self._index}: cannot destroy {current.profile}@{current.start}: {exc}"
            ) from exc


@dataclass
class NvmlMigSession:
    """The MIG-capable GPUs of this machine through NVML; :meth:`close` shuts NVML down.

    Attributes:
        devices: one :class:`NvmlMigDevice` per GPU whose model has MIG profiles.
        notes: why other GPUs were left out, and where the catalog stood in for the device.
    """

    nvml: Any
    devices: list[NvmlMigDevice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            _log.debug("NVML shutdown: %s", exc)


def open_mig_devices(nvml: Any = None) -> NvmlMigSession:
    """Initialise NVML and describe every MIG-capable GPU (read only).

    A GPU whose profiles cannot be read (MIG off) gets the catalog's table; the session's
    notes say so.

    Raises:
        NvmlUnavailableError: nvidia-ml-py missing or NVML does not initialise.
    """
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailableError(
                f"nvidia-ml-py (module pynvml) is not installed: {exc}"
            ) from exc
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError) as exc:
        raise NvmlUnavailableError(f"NVML did not initialise: {exc}") from exc
    session = NvmlMigSession(nvml)
    try:
        count = int(nvml.nvmlDeviceGetCount())
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(nvml.nvmlDeviceGetName(handle)).strip()
            memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
            model = catalog_name_for(name, memory)
            if model is None or model not in MIG_TABLES:
                session.notes.append(f"GPU {index} ({name}): no MIG profiles known, left out")
                continue
            try:
                enabled = int(nvml.nvmlDeviceGetMigMode(handle)[0]) == int(
                    nvml.NVML_DEVICE_MIG_ENABLE
                )
            except nvml.NVMLError:
                enabled = False
            try:
                table = read_profile_table(nvml, handle, model)
            except MigDeviceError as exc:
                table = MIG_TABLES[model]
                session.notes.append(f"GPU {index} ({model}): {exc}; using the catalog's profiles")
            session.devices.append(NvmlMigDevice(nvml, handle, index, model, table, enabled))
    except nvml.NVMLError as exc:
        session.close()
        raise NvmlUnavailableError(f"NVML could not list the GPUs: {exc}") from exc
    return session

"""NVML GPU backend (nvidia-ml-py, module ``pynvml``, imported lazily).

NVML calls used (nvidia-ml-py; NVML API reference, "Device Queries" and "MIG"):
``nvmlInit``/``nvmlShutdown``, ``nvmlDeviceGetCount``, ``nvmlDeviceGetHandleByIndex``,
``nvmlDeviceGetUUID``, ``nvmlDeviceGetName``, ``nvmlDeviceGetMemoryInfo`` (``.total``, bytes),
``nvmlDeviceGetMigMode`` (``[current, pending]``, ``NVML_DEVICE_MIG_ENABLE`` when on),
``nvmlDeviceGetAttributes`` (``.multiprocessorCount``; NVML documents it for MIG device
handles, so on a full GPU it may fail and the catalog's figure is used),
``nvmlDeviceGetComputeRunningProcesses`` (objects with ``.pid`` and ``.usedGpuMemory`` in
bytes, None where the driver cannot tell), ``nvmlDeviceGetUtilizationRates`` (``.gpu``,
percent of the last sample period a kernel ran) and ``nvmlDeviceGetProcessUtilization``
(per-process samples newer than a timestamp in microseconds, each with ``.pid``,
``.timeStamp`` and ``.smUtil`` in percent; "not found" when there are none). GPUs in MIG
mode are also handed out as :class:`~fgpu.agent.mig_nvml.NvmlMigDevice`
(:meth:`NvmlBackend.mig_devices`; the MIG calls are listed in that module). Accounting
("Accounting Statistics" in the NVML reference): ``nvmlDeviceGetAccountingMode`` /
``nvmlDeviceSetAccountingMode`` (``NVML_FEATURE_ENABLED`` = 1; setting needs root, else
"no permission") and ``nvmlDeviceGetAccountingStats(handle, pid)`` (``.maxMemoryUsage``: the
most device memory the process ever held, bytes, a high-water mark kept by the driver;
``.isRunning``; "not supported" while the mode is off, "not found" for a process it has no
record of).

The module is reached through a seam: ``NvmlBackend(nvml=...)`` takes any object with these
functions, so tests pass a stand-in instead of patching the import.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Protocol

from fgpu.agent.backend import GpuDevice, GpuProcess, ProcessUtilization
from fgpu.mig.device import MigDevice
from fgpu.model.catalog import GPU_CATALOG, GpuModel

_log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED (nvmlEnableState_t)
_NOT_AVAILABLE_ULL = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as unsigned long long

MEMORY_TOLERANCE = 0.10
"""How far (as a fraction of the catalog's nominal size) a device's reported memory may be from
the catalog figure and still count as that model. Devices report a few percent less than the
nominal size (a T4 reports 15360 of 16384 MiB, an A10 about 22.5 of 24 GiB); an H100 NVL
(about 94 GiB) is 17% above the 80 GiB H100 and so is not taken for one."""


class NvmlApi(Protocol):
    """The part of the ``pynvml`` module the backend uses (a stand-in provides the same)."""

    NVMLError: type[Exception]
    NVML_DEVICE_MIG_ENABLE: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMigMode(self, handle: Any) -> Any: ...
    def nvmlDeviceGetAttributes(self, handle: Any) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetProcessUtilization(self, handle: Any, timestamp: int) -> Any: ...
    def nvmlDeviceGetAccountingMode(self, handle: Any) -> int: ...
    def nvmlDeviceSetAccountingMode(self, handle: Any, mode: int) -> None: ...
    def nvmlDeviceGetAccountingStats(self, handle: Any, pid: int) -> Any: ...


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used here: nvidia-ml-py missing, no driver, or initialisation failed."""


_VENDOR_PREFIX = re.compile(r"^(?:nvidia|tesla)\s+", re.IGNORECASE)
_FAMILY = re.compile(r"^([A-Za-z0-9]+)")
_SIZE = re.compile(r"(\d+)\s*GB\b", re.IGNORECASE)


def catalog_name_for(nvml_name: str, memory_mib: int | None = None) -> str | None:
    """Map an NVML device name to a catalog model name, or None when it is not in the catalog.

    The rule:

    1. Drop vendor words in front (``NVIDIA``, ``Tesla``).
    2. The family is the leading run of letters and digits: ``"A100-SXM4-80GB"`` -> ``A100``,
       ``"H100 80GB HBM3"`` -> ``H100``, ``"A10G"`` -> ``A10G``. Candidates are the catalog
       models whose name up to the first ``-`` is that family (``A100-40GB``, ``A100-80GB``);
       the trace-only models (``G2``, ``G3``) never match.
    3. A size in the name (``80GB``) picks the candidate named with that size
       (``A100-80GB``).
    4. Otherwise the device's memory (``memory_mib``; else the size in the name) picks the
       candidate with the nearest nominal memory, if it is within :data:`MEMORY_TOLERANCE` of
       it (``"NVIDIA H100 PCIe"`` with 81559 MiB -> ``H100-80GB``; ``"NVIDIA H100 NVL"`` with
       about 94 GiB -> None).
    5. With no memory figure at all, a single candidate is taken as it is.

    Examples: ``"NVIDIA A100-SXM4-80GB"`` -> ``A100-80GB``, ``"NVIDIA H200"`` (143771 MiB) ->
    ``H200-141GB``, ``"Tesla T4"`` -> ``T4``, ``"NVIDIA A10G"`` -> None (not an A10),
    ``"NVIDIA GeForce RTX 4090"`` -> None.
    """
    name = nvml_name.strip()
    while True:
        stripped = _VENDOR_PREFIX.sub("", name)
        if stripped == name:
            break
        name = stripped
    family_match = _FAMILY.match(name)
    if family_match is None:
        return None
    family = family_match.group(1).upper()
    candidates = [
        m for m in GPU_CATALOG.values() if not m.assumed and m.name.split("-")[0].upper() == family
    ]
    if not candidates:
        return None

    size_match = _SIZE.search(name)
    size_gb = int(size_match.group(1)) if size_match else None
    if size_gb is not None:
        for model in candidates:
            if model.name.upper().endswith(f"-{size_gb}GB"):
                return model.name

    figure = memory_mib if memory_mib is not None else (size_gb * 1024 if size_gb else None)
    if figure is None:
        return candidates[0].name if len(candidates) == 1 else None
    best = min(candidates, key=lambda m: abs(m.memory_mib - figure))
    if abs(best.memory_mib - figure) <= MEMORY_TOLERANCE * best.memory_mib:
        return best.name
    return None


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class NvmlBackend:
    """Real GPUs through NVML.

    The constructor initialises NVML and reads the GPUs once (index, uuid, name, memory, MIG
    mode, SM count); GPUs do not come and go while the agent runs. :meth:`process_memory` and
    :meth:`utilization` query NVML on every call. A GPU whose uuid, name or memory cannot be
    read is left out with a warning; an unreadable MIG mode counts as off, an unreadable SM
    count falls back to the catalog (None for models the catalog lacks). Per-call query
    errors on one GPU leave that GPU out of that answer.

    Args:
        nvml: the ``pynvml`` module or a stand-in with the same functions (see
            :class:`NvmlApi`); None imports ``pynvml`` here.

    Raises:
        NvmlUnavailableError: nvidia-ml-py is not installed, or NVML does not initialise
            (no driver, no library) or cannot count the GPUs.
    """

    def __init__(self, nvml: NvmlApi | None = None) -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlUnavailableError(
                    f"nvidia-ml-py (module pynvml) is not installed: {exc}",
                ) from exc
            nvml = pynvml
        self._nvml: NvmlApi = nvml
        errors = (nvml.NVMLError, OSError)
        try:
            nvml.nvmlInit()
        except errors as exc:
            raise NvmlUnavailableError(f"NVML did not initialise: {exc}") from exc
        self._open = True
        try:
            count = nvml.nvmlDeviceGetCount()
        except errors as exc:
            self.close()
            raise NvmlUnavailableError(f"NVML could not count the GPUs: {exc}") from exc
        self._handles: list[tuple[str, Any]] = []
        devices: list[GpuDevice] = []
        for index in range(count):
            device = self._read_device(index)
            if device is not None:
                devices.append(device[0])
                self._handles.append((device[0].uuid, device[1]))
        self._devices = tuple(devices)
        self._mig: list[MigDevice] | None = None
        self._last_sample_us: dict[str, int] = {}

    @property
    def kind(self) -> str:
        return "nvml"

    def _read_device(self, index: int) -> tuple[GpuDevice, Any] | None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            raw_name = _text(nvml.nvmlDeviceGetName(handle)).strip()
            memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
        except nvml.NVMLError as exc:
            _log.warning("NVML: GPU %d left out, its identity could not be read: %s", index, exc)
            return None
        catalog_name = catalog_name_for(raw_name, memory_mib)
        entry: GpuModel | None = GPU_CATALOG[catalog_name] if catalog_name else None
        try:
            current = nvml.nvmlDeviceGetMigMode(handle)[0]
            mig_enabled = int(current) == int(nvml.NVML_DEVICE_MIG_ENABLE)
        except nvml.NVMLError:
            mig_enabled = False  # not MIG capable: NVML answers "not supported"
        sm_count: int | None
        try:
            sm_count = int(nvml.nvmlDeviceGetAttributes(handle).multiprocessorCount)
        except nvml.NVMLError:
            sm_count = entry.sm_count if entry else None
        device = GpuDevice(
            index=index,
            uuid=uuid,
            model=catalog_name or raw_name,
            memory_mib=memory_mib,
            sm_count=sm_count,
            mig_enabled=mig_enabled,
        )
        return device, handle

    def gpus(self) -> list[GpuDevice]:
        return list(self._devices)

    def process_memory(self) -> list[GpuProcess]:
        """Device memory per compute process and GPU, MiB rounded up; processes whose
        memory NVML cannot report (``usedGpuMemory`` None) are left out."""
        nvml = self._nvml
        found: list[GpuProcess] = []
        for uuid, handle in self._handles if self._open else []:
            try:
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError as exc:
                _log.debug("NVML: no process list for %s: %s", uuid, exc)
                continue
            for proc in processes:
                used = getattr(proc, "usedGpuMemory", None)
                if used is None:
                    continue
                found.append(GpuProcess(int(proc.pid), uuid, -(-int(used) // _MIB)))
        return found

    def enable_accounting(self) -> dict[str, str]:
        """Turn NVML accounting mode on where it is off, for :meth:`process_peak_memory`.

        Returns:
            GPU uuid -> ``"on"`` (it is on now), or why it is not (the NVML error: "no
            permission" when not root, "not supported" on boards without it). Accounting mode
            lives in the driver until it unloads; it is left on at :meth:`close`.
        """
        nvml = self._nvml
        found: dict[str, str] = {}
        for uuid, handle in self._handles if self._open else []:
            try:
                if int(nvml.nvmlDeviceGetAccountingMode(handle)) != _FEATURE_ENABLED:
                    nvml.nvmlDeviceSetAccountingMode(handle, _FEATURE_ENABLED)
                found[uuid] = "on"
            except (nvml.NVMLError, AttributeError) as exc:
                found[uuid] = str(exc) or type(exc).__name__
        return found

    def process_peak_memory(self, processes: list[GpuProcess]) -> list[GpuProcess]:
        """The high-water mark of device memory (NVML accounting's ``maxMemoryUsage``, MiB
        rounded up) of each of ``processes`` on its GPU: the most it held since it began,
        which shows a burst between two looks at :meth:`process_memory`. Processes without
        a record (accounting off on that GPU, a process that began before it was on, figure
        unavailable) are left out."""
        nvml = self._nvml
        handles = dict(self._handles) if self._open else {}
        found: list[GpuProcess] = []
        for proc in processes:
            handle = handles.get(proc.gpu_uuid)
            if handle is None:
                continue
            try:
                stats = nvml.nvmlDeviceGetAccountingStats(handle, proc.pid)
            except (nvml.NVMLError, AttributeError):
                continue
            peak = getattr(stats, "maxMemoryUsage", None)
            if peak is None or int(peak) >= _NOT_AVAILABLE_ULL:
                continue
            found.append(GpuProcess(proc.pid, proc.gpu_uuid, -(-int(peak) // _MIB)))
        return found

    def utilization(self) -> dict[str, int]:
        nvml = self._nvml
        busy: dict[str, int] = {}
        for uuid, handle in self._handles if self._open else []:
            try:
                busy[uuid] = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except nvml.NVMLError:
                continue  # MIG mode and some boards: "not supported"
        return busy

    def mig_devices(self) -> list[MigDevice]:
        """An :class:`~fgpu.agent.mig_nvml.NvmlMigDevice` for each GPU in MIG mode whose
        model has MIG profiles in the catalog, with the profile table read from the device
        (the catalog's when the device answers none); made once, then the same objects. MIG
        modes are read, never changed."""
        if self._mig is None:
            from fgpu.agent.mig_nvml import NvmlMigDevice, read_profile_table
            from fgpu.mig.catalog import MIG_TABLES
            from fgpu.mig.device import MigDeviceError

            found: list[MigDevice] = []
            handles = dict(self._handles)
            for device in self._devices:
                if not device.mig_enabled:
                    continue
                if device.model not in MIG_TABLES:
                    _log.warning(
                        "NVML: GPU %d (%s) is in MIG mode but fgpu knows no MIG profiles of "
                        "it; it is not used",
                        device.index,
                        device.model,
                    )
                    continue
                handle = handles[device.uuid]
                try:
                    table = read_profile_table(self._nvml, handle, device.model)
                except MigDeviceError as exc:
                    _log.warning(
                        "NVML: GPU %d: %s; using the catalog's profiles", device.index, exc
                    )
                    table = MIG_TABLES[device.model]
                found.append(
                    NvmlMigDevice(self._nvml, handle, device.index, device.model, table, True)
                )
            self._mig = found
        return list(self._mig)

    def process_utilization(self) -> list[ProcessUtilization]:
        """Per process and GPU, the highest SM utilization among the samples NVML took since
        the previous call (the first call reads what NVML still holds). A GPU without new
        samples, or whose query fails, contributes nothing. Used by the governor to tell
        busy workloads that send no hints (DESIGN.md section 7)."""
        nvml = self._nvml
        found: dict[tuple[int, str], int] = {}
        for uuid, handle in self._handles if self._open else []:
            since = self._last_sample_us.get(uuid, 0)
            try:
                samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
            except nvml.NVMLError:
                continue  # no samples since then ("not found"), or not supported
            for sample in samples:
                stamp = int(sample.timeStamp)
                if stamp > self._last_sample_us.get(uuid, 0):
                    self._last_sample_us[uuid] = stamp
                key = (int(sample.pid), uuid)
                found[key] = max(found.get(key, 0), int(sample.smUtil))
        return [ProcessUtilization(pid, uuid, sm) for (pid, uuid), sm in sorted(found.items())]

    def process_utilization_since(self, since_us: int) -> list[ProcessUtilization]:
        """Per process and GPU, the mean SM utilization of the samples NVML took after
        ``since_us`` (wall clock, microseconds since the epoch: NVML's sample timestamps),
        rounded up (a process seen busy at all is never 0).
        Leaves the cursor of :meth:`process_utilization` alone. A GPU without such samples
        ("not found"), or whose query fails, contributes nothing. The governor's check that a
        workload held at launch runs no kernels (DESIGN.md section 7)."""
        nvml = self._nvml
        found: dict[tuple[int, str], list[int]] = {}
        for uuid, handle in self._handles if self._open else []:
            try:
                samples = nvml.nvmlDeviceGetProcessUtilization(handle, since_us)
            except nvml.NVMLError:
                continue
            for sample in samples:
                if int(sample.timeStamp) <= since_us:
                    continue
                found.setdefault((int(sample.pid), uuid), []).append(int(sample.smUtil))
        return [
            ProcessUtilization(pid, uuid, -(-sum(sm) // len(sm)))
            for (pid, uuid), sm in sorted(found.items())
        ]

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            _log.debug("NVML shutdown: %s", exc)

    def __repr__(self) -> str:
        return f"NvmlBackend({len(self._devices)} GPUs)"

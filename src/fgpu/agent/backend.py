"""GPU backends: what the node agent knows about its GPUs and the processes on them.

A backend answers three questions: which GPUs are there (:meth:`GpuBackend.gpus`), how much
device memory each process holds (:meth:`GpuBackend.process_memory`, for the memory guard)
and how busy each GPU is (:meth:`GpuBackend.utilization`, for ``fgpu top`` and the governor's
activity fallback). Two implementations:

- :class:`SimulatedBackend`: GPUs described by a ``--simulate-gpus`` spec such as
  ``"2xA100-40GB,1xH100-80GB"``, with figures from :mod:`fgpu.model.catalog`; tests and
  machines without NVIDIA GPUs use it. ``2xA100-80GB:mig`` makes GPUs in MIG mode.
- :class:`fgpu.agent.nvml.NvmlBackend`: real GPUs through NVML (nvidia-ml-py).

A backend that also implements :class:`MigBackend` gives a :class:`~fgpu.mig.device.MigDevice`
for each of its GPUs in MIG mode (:func:`mig_devices_of`); the service places MIG requests on
their instances.

:func:`detect_backend` is the one place that chooses between them. The backend is passed to
the agent's components through their constructors (DESIGN.md section 2), so tests replace it
without monkeypatching.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fgpu.mig.catalog import MIG_MODELS, MIG_TABLES
from fgpu.mig.device import MigDevice, MigDeviceError, MigInstance, SimulatedMigDevice
from fgpu.model.catalog import ALIASES, GPU_CATALOG, UnknownGpuModelError, canonical_name

if TYPE_CHECKING:
    from fgpu.agent.nvml import NvmlApi

FALLBACK_SIMULATED_GPUS = "1xH100-80GB"
"""What :func:`detect_backend` simulates when NVML is unavailable (issue 4)."""

_SPEC_EXAMPLE = "2xA100-40GB,1xH100-80GB"
MIG_FLAG = "mig"
"""``--simulate-gpus`` part suffix (``2xA100-80GB:mig``) for GPUs in MIG mode."""


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU as the agent sees it.

    Attributes:
        index: position in the backend's enumeration (NVML index for real GPUs).
        uuid: stable identifier (``GPU-...``); what ``CUDA_VISIBLE_DEVICES`` is given.
        model: canonical catalog name (``"A100-80GB"``) when the model is known, else the raw
            name the driver reports.
        memory_mib: device memory in MiB (the device's own figure for real GPUs).
        sm_count: streaming multiprocessors, or None when unknown.
        mig_enabled: whether MIG mode is currently on.
    """

    index: int
    uuid: str
    model: str
    memory_mib: int
    sm_count: int | None
    mig_enabled: bool


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """Device memory one process holds on one GPU.

    Attributes:
        pid: process id (as the host kernel numbers it).
        gpu_uuid: the GPU's uuid.
        used_mib: device memory in use, MiB.
    """

    pid: int
    gpu_uuid: str
    used_mib: int


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    """How busy one process kept one GPU over the last sample window.

    Attributes:
        pid: process id.
        gpu_uuid: the GPU's uuid.
        sm_percent: percent of the window in which a kernel of the process ran (0-100).
    """

    pid: int
    gpu_uuid: str
    sm_percent: int


@runtime_checkable
class GpuBackend(Protocol):
    """What the node agent asks of a GPU backend.

    Implementations must be safe to call from any one thread at a time; the agent does not
    call one backend from several threads at once.
    """

    @property
    def kind(self) -> str:
        """Short name for logs and ``fgpu nodes``: ``"nvml"`` or ``"simulated"``."""
        ...

    def gpus(self) -> list[GpuDevice]:
        """The GPUs, ordered by index."""
        ...

    def process_memory(self) -> list[GpuProcess]:
        """Device memory held per (process, GPU); processes the backend cannot measure are
        left out."""
        ...

    def utilization(self) -> dict[str, int]:
        """GPU uuid -> percent of the last sample period the GPU was busy (0-100); a GPU
        whose figure is unavailable is missing from the dict."""
        ...

    def close(self) -> None:
        """Release what the backend holds (NVML handle); idempotent."""
        ...


@runtime_checkable
class MigBackend(Protocol):
    """A backend that can hand out its GPUs in MIG mode as MIG devices."""

    def mig_devices(self) -> Sequence[MigDevice]:
        """One device per GPU in MIG mode whose profiles fgpu knows, by index; the same
        objects on every call. Never changes a MIG mode."""
        ...


def mig_devices_of(backend: GpuBackend) -> list[MigDevice]:
    """The MIG devices of ``backend`` (none when it is not a :class:`MigBackend`)."""
    return list(backend.mig_devices()) if isinstance(backend, MigBackend) else []


@dataclass(frozen=True, slots=True)
class SimulatedGpuGroup:
    """One part of a ``--simulate-gpus`` spec: ``count`` GPUs of catalog ``model``, in MIG
    mode when ``mig``."""

    count: int
    model: str
    mig: bool = False


_PART = re.compile(r"^(?:(?P<count>[+-]?\d+)\s*[xX]\s*)?(?P<model>.+)$")


MAX_SIMULATED_GPUS = 64
"""Most simulated GPUs of one model (one node per model, and a node has at most 64)."""


def parse_simulate_spec(spec: str) -> list[SimulatedGpuGroup]:
    """Parse a ``--simulate-gpus`` spec: comma-separated ``COUNTxMODEL[:mig]`` parts.

    ``COUNT`` is a positive integer and may be left out (``"H100-80GB"`` means one);
    ``MODEL`` is a catalog name or alias, case-insensitive (``"1xh100"`` is one
    ``H100-80GB``); ``:mig`` puts those GPUs in MIG mode (``"2xA100-80GB:mig"``). Whitespace
    around parts is ignored.

    Raises:
        ValueError: the spec is empty, a part is empty, a count is not a positive integer,
            a model is not in the catalog, a flag is not ``mig``, or ``:mig`` is given for a
            model without MIG profiles. The message starts with ``--simulate-gpus:`` and
            quotes the offending part.
    """
    if not spec.strip():
        raise ValueError(
            f"--simulate-gpus: empty GPU list; expected e.g. {_SPEC_EXAMPLE!r}",
        )
    groups: list[SimulatedGpuGroup] = []
    for raw_part in spec.split(","):
        part = raw_part.strip()
        if not part:
            raise ValueError(
                f"--simulate-gpus: empty part in {spec!r}; expected e.g. {_SPEC_EXAMPLE!r}",
            )
        match = _PART.match(part)
        if match is None:  # pragma: no cover - the pattern matches any non-empty text
            raise ValueError(f"--simulate-gpus: cannot read {part!r}")
        count_text = match.group("count")
        count = int(count_text) if count_text is not None else 1
        if count <= 0:
            raise ValueError(
                f"--simulate-gpus: GPU count must be a positive integer, got {count} in {part!r}",
            )
        if count > MAX_SIMULATED_GPUS:
            raise ValueError(
                f"--simulate-gpus: {count} GPUs in {part[:40]!r}; at most "
                f"{MAX_SIMULATED_GPUS} of one model (a node's limit)",
            )
        model_text, colon, flag = match.group("model").partition(":")
        model_text = model_text.strip()
        mig = False
        if colon:
            if flag.strip().lower() != MIG_FLAG:
                raise ValueError(
                    f"--simulate-gpus: unknown flag {flag.strip()!r} in {part!r}; the only "
                    f"flag is {MIG_FLAG!r} (GPUs in MIG mode, e.g. '2xA100-80GB:mig')",
                )
            mig = True
        try:
            model = canonical_name(model_text)
        except UnknownGpuModelError:
            known = ", ".join(sorted(GPU_CATALOG))
            aliases = ", ".join(sorted(ALIASES))
            raise ValueError(
                f"--simulate-gpus: unknown GPU model {model_text!r} in {part!r}; "
                f"known models: {known} (aliases: {aliases})",
            ) from None
        if mig and model not in MIG_TABLES:
            raise ValueError(
                f"--simulate-gpus: {model} in {part!r} has no MIG profiles; "
                f"MIG models: {', '.join(MIG_MODELS)}",
            )
        groups.append(SimulatedGpuGroup(count, model, mig))
    return groups


def simulated_uuid(index: int, model: str, host: str = "") -> str:
    """Deterministic uuid of simulated GPU ``index`` of catalog ``model`` on ``host``.

    Shape ``GPU-HHHHHHHH-feed-MMMM-0000-IIIIIIIIIIII``: ``HHHHHHHH`` is a CRC-32 of the host
    name (``00000000`` without one), ``feed`` marks a simulated GPU, ``MMMM`` is a CRC-32 of
    the model name (low 16 bits, hex) and ``I...`` the index. It has the 8-4-4-4-12 hex digits
    of an NVIDIA uuid, so the fake CUDA driver reports exactly these 16 bytes from
    ``cuDeviceGetUuid`` and the interposer finds the GPU in a workload's segment.

    The same spec gives the same uuids in every process, so workloads can be re-adopted after
    a restart; a spec that puts a different model at an index gives that
    GPU a different uuid, so a workload is never re-adopted onto a GPU of another model; and
    simulated nodes of one cluster (each agent names its node) have different uuids, as real
    GPUs do.
    """
    tag = zlib.crc32(model.encode()) & 0xFFFF
    where = zlib.crc32(host.encode()) if host else 0
    return f"GPU-{where:08x}-feed-{tag:04x}-0000-{index:012d}"


class SimulatedBackend:
    """GPUs that exist only on paper, described by a ``--simulate-gpus`` spec.

    Figures (memory, SM count) come from the catalog; MIG is off unless the spec part says
    ``:mig``, and each GPU in MIG mode has a :class:`~fgpu.mig.device.SimulatedMigDevice`
    (:meth:`mig_devices`), empty at first; :meth:`keep_mig_state` keeps their instances in a
    file, so that a new process finds them as a real GPU keeps its instances across a restart
    of the service. Nothing measures real processes: per-process memory and utilization are
    whatever callers report through :meth:`report_usage` and :meth:`report_utilization`
    (tests of the memory guard and the governor use these).

    Args:
        spec: e.g. ``"2xA100-40GB,1xH100-80GB,2xA100-80GB:mig"``; see
            :func:`parse_simulate_spec`.
        host: the machine (or Kubernetes node) the GPUs are on, part of their uuids
            (:func:`simulated_uuid`); empty for a single machine.

    Raises:
        ValueError: the spec is invalid (message names ``--simulate-gpus``).
    """

    def __init__(self, spec: str, host: str = "") -> None:
        self.spec = spec
        devices: list[GpuDevice] = []
        for group in parse_simulate_spec(spec):
            entry = GPU_CATALOG[group.model]
            for _ in range(group.count):
                index = len(devices)
                devices.append(
                    GpuDevice(
                        index=index,
                        uuid=simulated_uuid(index, group.model, host),
                        model=group.model,
                        memory_mib=entry.memory_mib,
                        sm_count=entry.sm_count,
                        mig_enabled=group.mig,
                    ),
                )
        self._devices = tuple(devices)
        self._mig = tuple(
            SimulatedMigDevice(d.index, d.model, gpu_uuid=d.uuid) for d in devices if d.mig_enabled
        )
        self._mig_state: Path | None = None
        self._uuids = frozenset(d.uuid for d in devices)
        self._lock = threading.Lock()
        self._usage: dict[tuple[int, str], int] = {}
        self._busy: dict[str, int] = {}
        self._estimate: Callable[[], Mapping[str, int]] | None = None

    @property
    def kind(self) -> str:
        return "simulated"

    def gpus(self) -> list[GpuDevice]:
        return list(self._devices)

    def process_memory(self) -> list[GpuProcess]:
        with self._lock:
            items = sorted(self._usage.items())
        return [GpuProcess(pid, uuid, mib) for (pid, uuid), mib in items]

    def utilization(self) -> dict[str, int]:
        """Reported figures (:meth:`report_utilization`) and, for the other GPUs, the
        estimate of :meth:`estimate_utilization`'s source when one is set."""
        source = self._estimate
        estimated = {} if source is None else dict(source())
        with self._lock:
            return {**estimated, **self._busy}

    def estimate_utilization(self, source: Callable[[], Mapping[str, int]] | None) -> None:
        """Have :meth:`utilization` show ``source()`` (GPU uuid -> percent busy, 0-100) for
        the GPUs nobody reported on; the service passes the governor's view of its
        workloads (the run time its busy workloads received). None removes the source."""
        self._estimate = source

    def close(self) -> None:
        return None

    def mig_devices(self) -> list[SimulatedMigDevice]:
        return list(self._mig)

    def keep_mig_state(self, path: Path) -> list[str]:
        """Read the MIG instances a previous process left in ``path`` (if the file exists)
        and write them there after every change from now on.

        The file is JSON, ``{"gpus": {GPU_UUID: [{"profile", "start", "uuid",
        "gpu_instance_id"}, ...]}}``; a GPU uuid names the model and index
        (:func:`simulated_uuid`), so instances of a GPU the spec no longer has, or has as
        another model, are dropped (as a GPU reset would).

        Returns:
            Notes for the log: GPUs whose saved instances were dropped, and why.

        Raises:
            OSError: the file exists and cannot be read.
        """
        notes: list[str] = []
        saved: dict[str, Any] = {}
        if path.is_file():
            try:
                loaded = json.loads(path.read_text())
                saved = dict(loaded.get("gpus", {}))
            except (ValueError, AttributeError, TypeError) as exc:
                notes.append(f"{path}: not a simulated MIG state ({exc}); starting empty")
        for device in self._mig:
            entries = saved.pop(device.gpu_uuid, [])
            try:
                device.restore(
                    [
                        MigInstance(
                            str(e["profile"]),
                            int(e["start"]),
                            str(e["uuid"]),
                            int(e["gpu_instance_id"]),
                        )
                        for e in entries
                    ]
                )
            except (MigDeviceError, KeyError, TypeError, ValueError) as exc:
                notes.append(f"GPU {device.index}: saved MIG instances dropped: {exc}")
            device.on_change = self._save_mig_state
        notes.extend(
            f"GPU {uuid}: not simulated any more; its MIG instances dropped" for uuid in saved
        )
        self._mig_state = path
        self._save_mig_state()
        return notes

    def _save_mig_state(self, _changed: SimulatedMigDevice | None = None) -> None:
        path = self._mig_state
        if path is None:
            return
        data = {
            "gpus": {
                d.gpu_uuid: [
                    {
                        "profile": i.profile,
                        "start": i.start,
                        "uuid": i.uuid,
                        "gpu_instance_id": i.gpu_instance_id,
                    }
                    for i in d.instances()
                ]
                for d in self._mig
            }
        }
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)

    def report_usage(self, pid: int, gpu_uuid: str, mib: int) -> None:
        """Pretend process ``pid`` holds ``mib`` MiB on GPU ``gpu_uuid``; 0 forgets it.

        Raises:
            ValueError: unknown uuid or negative ``mib``.
        """
        self._check_uuid(gpu_uuid)
        if mib < 0:
            raise ValueError(f"report_usage: memory must be >= 0 MiB, got {mib}")
        with self._lock:
            if mib == 0:
                self._usage.pop((pid, gpu_uuid), None)
            else:
                self._usage[(pid, gpu_uuid)] = mib

    def forget_process(self, pid: int) -> None:
        """Drop every usage report of ``pid`` (the process ended)."""
        with self._lock:
            for key in [k for k in self._usage if k[0] == pid]:
                del self._usage[key]

    def report_utilization(self, gpu_uuid: str, percent: int | None) -> None:
        """Pretend GPU ``gpu_uuid`` is ``percent`` busy (0-100); None makes it unknown.

        Raises:
            ValueError: unknown uuid or a percentage outside 0-100.
        """
        self._check_uuid(gpu_uuid)
        with self._lock:
            if percent is None:
                self._busy.pop(gpu_uuid, None)
                return
            if not 0 <= percent <= 100:
                raise ValueError(f"report_utilization: percent must be 0-100, got {percent}")
            self._busy[gpu_uuid] = percent

    def _check_uuid(self, gpu_uuid: str) -> None:
        if gpu_uuid not in self._uuids:
            known = ", ".join(d.uuid for d in self._devices)
            raise ValueError(f"unknown simulated GPU {gpu_uuid!r}; known: {known}")

    def __repr__(self) -> str:
        return f"SimulatedBackend({self.spec!r})"


def detect_backend(
    simulate: str | None,
    log: logging.Logger,
    *,
    nvml: NvmlApi | None = None,
    host: str = "",
) -> GpuBackend:
    """Choose the GPU backend for this process (the composition root calls this once).

    - ``simulate`` given: a :class:`SimulatedBackend` for it (errors are the spec's
      ``ValueError``; an empty string is an error, not "no simulation").
    - else NVML, if it initialises and reports at least one GPU;
    - else one simulated ``H100-80GB``, after a WARNING on ``log`` that says NVML is
      unavailable, why, and which simulated GPU is used.

    Args:
        simulate: the ``--simulate-gpus`` value, or None.
        log: where the fallback warning and an INFO line on the choice go.
        nvml: stand-in for the ``pynvml`` module (tests); None uses the real one.
        host: for simulated GPUs, the machine or node they are on (:func:`simulated_uuid`).

    Raises:
        ValueError: ``simulate`` is not a valid spec.
    """
    if simulate is not None:
        backend = SimulatedBackend(simulate, host)
        log.info("GPU backend: simulated GPUs %s", _describe(backend.gpus()))
        return backend

    from fgpu.agent.nvml import NvmlBackend, NvmlUnavailableError

    reason: str
    try:
        real = NvmlBackend(nvml)
    except NvmlUnavailableError as exc:
        reason = str(exc)
    else:
        devices = real.gpus()
        if devices:
            log.info("GPU backend: NVML, GPUs %s", _describe(devices))
            return real
        real.close()
        reason = "NVML reports no GPUs"

    fallback = SimulatedBackend(FALLBACK_SIMULATED_GPUS, host)
    device = fallback.gpus()[0]
    log.warning(
        "NVML is unavailable (%s); using one simulated %s GPU (%s) instead. "
        "Pass --simulate-gpus to choose the simulated GPUs.",
        reason,
        device.model,
        device.uuid,
    )
    return fallback


def _describe(devices: list[GpuDevice]) -> str:
    return (
        ", ".join(
            f"{d.index}:{d.model}{' in MIG mode' if d.mig_enabled else ''}({d.uuid})"
            for d in devices
        )
        or "none"
    )

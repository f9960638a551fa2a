"""NVML backend: the NVML name -> catalog name rule, and the backend over a stand-in pynvml.

The stand-in (:class:`FakeNvml`) is handed to ``NvmlBackend(nvml=...)``, the seam the backend
has for this; nothing is patched. Tests against a real GPU are marked ``gpu``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from fgpu.agent.backend import GpuDevice, GpuProcess, ProcessUtilization
from fgpu.agent.nvml import NvmlBackend, NvmlUnavailableError, catalog_name_for

GIB = 1024**3
MIB = 1024**2


class FakeNvmlError(Exception):
    """Stands in for ``pynvml.NVMLError``."""


@dataclass
class FakeGpu:
    name: str | bytes = "NVIDIA A100-SXM4-80GB"
    uuid: str | bytes = "GPU-11111111-2222-3333-4444-555555555555"
    total_bytes: int = 81920 * MIB
    mig_mode: int | None = 0  # None: NVML answers "not supported"
    sm_count: int | None = None  # None: nvmlDeviceGetAttributes not supported
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    busy: int | None = 0  # None: utilization not supported
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, stamp us, sm %)
    broken_identity: bool = False  # uuid query fails
    broken_queries: bool = False  # per-call queries fail


class FakeNvml:
    """The slice of ``pynvml`` the backend uses, over :class:`FakeGpu` records."""

    NVMLError = FakeNvmlError
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: str | None = None,
        count_error: str | None = None,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.count_error = count_error
        self.init_calls = 0
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error:
            raise FakeNvmlError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error:
            raise FakeNvmlError(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str | bytes:
        if handle.broken_identity:
            raise FakeNvmlError("GPU is lost")
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str | bytes:
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Any:
        return SimpleNamespace(total=handle.total_bytes, free=handle.total_bytes, used=0)

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> Any:
        if handle.mig_mode is None:
            raise FakeNvmlError("Not Supported")
        return [handle.mig_mode, handle.mig_mode]

    def nvmlDeviceGetAttributes(self, handle: FakeGpu) -> Any:
        if handle.sm_count is None:
            raise FakeNvmlError("Not Supported")
        return SimpleNamespace(multiprocessorCount=handle.sm_count)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> Any:
        if handle.broken_queries:
            raise FakeNvmlError("Unknown Error")
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in handle.processes]

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        if handle.busy is None or handle.broken_queries:
            raise FakeNvmlError("Not Supported")
        return SimpleNamespace(gpu=handle.busy, memory=0)

    def nvmlDeviceGetProcessUtilization(self, handle: FakeGpu, timestamp: int) -> Any:
        newer = [s for s in handle.samples if s[1] > timestamp]
        if handle.broken_queries or not newer:
            raise FakeNvmlError("Not Found")
        return [SimpleNamespace(pid=p, timeStamp=t, smUtil=u) for p, t, u in newer]


# -- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvml_name", "memory_mib", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-80GB"),
        ("NVIDIA H100 NVL", 95830, None),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA H200 NVL", 143771, "H200-141GB"),
        ("Tesla V100-SXM2-16GB", 16160, "V100-16GB"),
        ("Tesla V100-PCIE-32GB", 32510, "V100-32GB"),
        ("Tesla V100S-PCIE-32GB", 32510, None),
        ("Tesla T4", 15360, "T4"),
        ("Tesla P100-PCIE-16GB", 16280, "P100"),
        ("Tesla P100-PCIE-12GB", 12198, None),
        ("NVIDIA A10", 23028, "A10"),
        ("NVIDIA A10G", 23028, None),
        ("NVIDIA A30", 24576, "A30"),
        ("NVIDIA L40S", 46068, "L40S"),
        ("NVIDIA GeForce RTX 4090", 24564, None),
        ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
        ("NVIDIA A100-SXM4", None, None),
        ("Tesla T4", None, "T4"),
        ("", None, None),
    ],
)
def test_nvml_names_map_to_catalog_names(
    nvml_name: str,
    memory_mib: int | None,
    expected: str | None,
) -> None:
    assert catalog_name_for(nvml_name, memory_mib) == expected


# -- backend over the stand-in ----------------------------------------------------------------


def test_devices_are_read_once_with_catalog_names_and_device_memory() -> None:
    nvml = FakeNvml(
        [
            FakeGpu(name=b"NVIDIA H100 80GB HBM3", uuid=b"GPU-aaaa", total_bytes=81559 * MIB),
            FakeGpu(
                name="NVIDIA H100 NVL",
                uuid="GPU-bbbb",
                total_bytes=95830 * MIB,
                mig_mode=1,
                sm_count=132,
            ),
            FakeGpu(name="Tesla T4", uuid="GPU-cccc", total_bytes=15360 * MIB, mig_mode=None),
        ],
    )
    backend = NvmlBackend(nvml)
    assert backend.kind == "nvml"
    assert backend.gpus() == [
        GpuDevice(0, "GPU-aaaa", "H100-80GB", 81559, 132, False),
        GpuDevice(1, "GPU-bbbb", "NVIDIA H100 NVL", 95830, 132, True),
        GpuDevice(2, "GPU-cccc", "T4", 15360, 40, False),
    ]
    assert nvml.init_calls == 1


def test_unknown_model_without_sm_figure_has_none() -> None:
    backend = NvmlBackend(FakeNvml([FakeGpu(name="NVIDIA GeForce RTX 4090", total_bytes=GIB)]))
    (device,) = backend.gpus()
    assert (device.model, device.sm_count) == ("NVIDIA GeForce RTX 4090", None)


def test_a_gpu_whose_identity_cannot_be_read_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = NvmlBackend(
        FakeNvml([FakeGpu(uuid="GPU-bad", broken_identity=True), FakeGpu(uuid="GPU-ok")]),
    )
    assert [d.uuid for d in backend.gpus()] == ["GPU-ok"]
    assert "GPU 0 left out" in caplog.text


def test_process_memory_in_mib_rounded_up_and_unknown_left_out() -> None:
    nvml = FakeNvml(
        [
            FakeGpu(uuid="GPU-a", processes=[(10, 1024 * MIB), (11, MIB + 1), (12, None)]),
            FakeGpu(uuid="GPU-b", processes=[(10, 0)]),
            FakeGpu(uuid="GPU-c", broken_queries=True),
        ],
    )
    assert NvmlBackend(nvml).process_memory() == [
        GpuProcess(10, "GPU-a", 1024),
        GpuProcess(11, "GPU-a", 2),
        GpuProcess(10, "GPU-b", 0),
    ]


def test_utilization_leaves_out_gpus_without_a_figure() -> None:
    nvml = FakeNvml(
        [
            FakeGpu(uuid="GPU-a", busy=37),
            FakeGpu(uuid="GPU-b", busy=None),
            FakeGpu(uuid="GPU-c", broken_queries=True),
        ],
    )
    assert NvmlBackend(nvml).utilization() == {"GPU-a": 37}


def test_init_failure_is_nvml_unavailable() -> None:
    with pytest.raises(NvmlUnavailableError, match="NVML did not initialise: Driver Not Loaded"):
        NvmlBackend(FakeNvml([], init_error="Driver Not Loaded"))


def test_count_failure_shuts_nvml_down_again() -> None:
    nvml = FakeNvml([], count_error="Unknown Error")
    with pytest.raises(NvmlUnavailableError, match="could not count the GPUs: Unknown Error"):
        NvmlBackend(nvml)
    assert nvml.shutdown_calls == 1


def test_close_is_idempotent_and_stops_queries() -> None:
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", busy=5, processes=[(1, MIB)])])
    backend = NvmlBackend(nvml)
    backend.close()
    backend.close()
    assert nvml.shutdown_calls == 1
    assert backend.utilization() == {}
    assert backend.process_memory() == []


# -- a real GPU -------------------------------------------------------------------------------


@pytest.fixture
def real_nvml() -> NvmlBackend:
    try:
        backend = NvmlBackend()
    except NvmlUnavailableError as exc:
        pytest.skip(f"no NVML here: {exc}")
    if not backend.gpus():
        backend.close()
        pytest.skip("NVML reports no GPUs")
    return backend


@pytest.mark.gpu
def test_real_gpus_are_described(real_nvml: NvmlBackend) -> None:
    try:
        devices = real_nvml.gpus()
        assert [d.index for d in devices] == list(range(len(devices)))
        for device in devices:
            assert device.uuid.startswith(("GPU-", "MIG-"))
            assert device.memory_mib > 0
            assert device.model
        uuids = {d.uuid for d in devices}
        assert set(real_nvml.utilization()) <= uuids
        for used in real_nvml.process_memory():
            assert used.gpu_uuid in uuids
            assert used.used_mib >= 0
    finally:
        real_nvml.close()


def test_process_utilization_reads_only_new_samples() -> None:
    gpu = FakeGpu(samples=[(10, 100, 40), (10, 200, 90), (11, 150, 0)])
    backend = NvmlBackend(FakeNvml([gpu]))
    uuid = gpu.uuid

    assert backend.process_utilization() == [
        ProcessUtilization(10, str(uuid), 90),
        ProcessUtilization(11, str(uuid), 0),
    ]
    assert backend.process_utilization() == []  # nothing newer than stamp 200
    gpu.samples.append((11, 300, 55))
    assert backend.process_utilization() == [ProcessUtilization(11, str(uuid), 55)]
    gpu.broken_queries = True
    assert backend.process_utilization() == []


def test_process_utilization_since_reads_samples_after_a_time_and_keeps_the_cursor() -> None:
    gpu = FakeGpu(samples=[(10, 100, 40), (10, 200, 90), (11, 150, 3)])
    backend = NvmlBackend(FakeNvml([gpu]))
    uuid = str(gpu.uuid)

    assert backend.process_utilization_since(120) == [
        ProcessUtilization(10, uuid, 90),
        ProcessUtilization(11, uuid, 3),
    ]
    assert backend.process_utilization_since(200) == []  # only samples after the time
    # the mean of a process's samples, rounded up
    assert backend.process_utilization_since(0)[0] == ProcessUtilization(10, uuid, 65)
    # the governor's activity cursor is not moved: everything is still new to it
    assert backend.process_utilization() == [
        ProcessUtilization(10, uuid, 90),
        ProcessUtilization(11, uuid, 3),
    ]
    gpu.broken_queries = True
    assert backend.process_utilization_since(0) == []

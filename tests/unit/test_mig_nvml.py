"""MIG through NVML, over a stand-in ``pynvml`` that keeps GPU and compute instances.

The stand-in answers the calls :mod:`fgpu.agent.mig_nvml` makes with the shapes nvidia-ml-py
has (ctypes placement structures, counts through pointers, instance handles in ctypes
arrays); its geometry comes from the catalog, with its own overlap check.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from fgpu.agent.mig_nvml import NvmlMigDevice, open_mig_devices, read_profile_table
from fgpu.mig.catalog import mig_profiles
from fgpu.mig.demand import parse_demand
from fgpu.mig.device import MigDeviceError, apply_plan, gpu_from_device
from fgpu.mig.planner import plan

MIB = 1024 * 1024


class FakeNvmlError(Exception):
    pass


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@dataclass
class FakeGi:
    id: int
    profile_id: int
    start: int
    size: int
    slices: int
    cis: list[int] = field(default_factory=list)


class FakeMigNvml:
    """One A100-80GB (or the given model) with MIG on, or off."""

    NVMLError = FakeNvmlError
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    c_nvmlGpuInstancePlacement_t = Placement
    c_nvmlGpuInstance_t = ctypes.c_void_p
    c_nvmlComputeInstance_t = ctypes.c_void_p

    def __init__(self, model: str = "A100-80GB", name: str = "NVIDIA A100-SXM4-80GB") -> None:
        self.table = mig_profiles(model)
        self.name = name
        self.mig = 1
        self.gis: dict[int, FakeGi] = {}
        self.busy: set[int] = set()
        self.next_id = 1
        self.calls: list[str] = []
        self.fail_compute_instance = False
        # GI profile enum -> catalog profile, in catalog order
        self.by_enum = dict(enumerate(self.table.profiles))

    # --- device basics
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return "gpu0"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return self.name.encode()

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return SimpleNamespace(total=81920 * MIB)

    def nvmlDeviceGetMigMode(self, handle: str) -> list[int]:
        return [self.mig, self.mig]

    # --- profiles
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: str, number: int) -> Any:
        profile = self.by_enum.get(number)
        if profile is None or not self.mig:
            raise FakeNvmlError("Not Supported")
        return SimpleNamespace(
            id=profile.profile_id,
            sliceCount=profile.compute_slices,
            instanceCount=profile.max_count,
            multiprocessorCount=profile.sm_count,
            memorySizeMB=profile.memory_mib,
            name=f"MIG {profile.name}".encode(),
        )

    def _profile(self, profile_id: int) -> Any:
        for p in self.table.profiles:
            if p.profile_id == profile_id:
                return p
        raise FakeNvmlError("Invalid Argument")

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: str, profile_id: int, placements: Any, count: Any
    ) -> int:
        profile = self._profile(profile_id)
        if placements is None:
            count.contents.value = len(profile.starts)
            return 0
        for i, start in enumerate(profile.starts):
            placements[i].start = start
            placements[i].size = profile.memory_slices
        count.contents.value = len(profile.starts)
        return 0

    # --- GPU instances
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: str, profile_id: int, placement: Any
    ) -> int:
        profile = self._profile(profile_id)
        start, size = placement.contents.start, placement.contents.size
        if start not in profile.starts or size != profile.memory_slices:
            raise FakeNvmlError("Invalid Argument")
        taken = set()
        for gi in self.gis.values():
            taken |= set(range(gi.start, gi.start + gi.size))
        if taken & set(range(start, start + size)):
            raise FakeNvmlError("Insufficient Resources")
        gi = FakeGi(self.next_id, profile_id, start, size, profile.compute_slices)
        self.next_id += 1
        self.gis[gi.id] = gi
        self.calls.append(f"create gi {profile.name}@{start}")
        return gi.id

    def nvmlDeviceGetGpuInstances(
        self, handle: str, profile_id: int, array: Any, count: Any
    ) -> int:
        found = [g for g in self.gis.values() if g.profile_id == profile_id]
        for i, gi in enumerate(found):
            array[i] = gi.id
        count.contents.value = len(found)
        return 0

    def nvmlGpuInstanceGetInfo(self, gi: int) -> Any:
        g = self.gis[gi]
        return SimpleNamespace(
            id=g.id, profileId=g.profile_id, placement=SimpleNamespace(start=g.start, size=g.size)
        )

    def nvmlDeviceGetGpuInstanceById(self, handle: str, gi_id: int) -> int:
        if gi_id not in self.gis:
            raise FakeNvmlError("Not Found")
        return gi_id

    def nvmlGpuInstanceDestroy(self, gi: int) -> int:
        if self.gis[gi].cis:
            raise FakeNvmlError("In use by another client")
        self.calls.append(f"destroy gi {gi}")
        del self.gis[gi]
        return 0

    # --- compute instances (profile enum n covers [1, 2, 3, 4, 7, 8, 6][n] slices)
    CI_SLICES = (1, 2, 3, 4, 7, 8, 6)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: int, number: int, engine: int
    ) -> Any:
        if number >= len(self.CI_SLICES) or self.CI_SLICES[number] > self.gis[gi].slices:
            raise FakeNvmlError("Not Supported")
        slices = self.CI_SLICES[number]
        return SimpleNamespace(
            id=number, sliceCount=slices, instanceCount=self.gis[gi].slices // slices
        )

    def nvmlGpuInstanceCreateComputeInstance(self, gi: int, ci_profile: int) -> int:
        if self.fail_compute_instance:
            raise FakeNvmlError("Insufficient Resources")
        assert self.CI_SLICES[ci_profile] == self.gis[gi].slices
        ci = 1000 + gi
        self.gis[gi].cis.append(ci)
        self.calls.append(f"create ci on gi {gi}")
        return ci

    def nvmlGpuInstanceGetComputeInstances(
        self, gi: int, ci_profile: int, array: Any, count: Any
    ) -> int:
        found = self.gis[gi].cis if self.CI_SLICES[ci_profile] == self.gis[gi].slices else []
        for i, ci in enumerate(found):
            array[i] = ci
        count.contents.value = len(found)
        return 0

    def nvmlComputeInstanceDestroy(self, ci: int) -> int:
        self.gis[ci - 1000].cis.remove(ci)
        self.calls.append(f"destroy ci {ci}")
        return 0

    # --- MIG device handles
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: str) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: str, slot: int) -> Any:
        with_ci = [g for g in sorted(self.gis.values(), key=lambda g: g.id) if g.cis]
        if slot >= len(with_ci):
            raise FakeNvmlError("Not Found")
        return SimpleNamespace(gi=with_ci[slot].id)

    def nvmlDeviceGetGpuInstanceId(self, mig: Any) -> int:
        return int(mig.gi)

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:
        if isinstance(handle, str):
            return b"GPU-fake"
        return f"MIG-fake-{handle.gi}".encode()

    def nvmlDeviceGetComputeRunningProcesses(self, mig: Any) -> list[Any]:
        return [SimpleNamespace(pid=42)] if mig.gi in self.busy else []


def test_profile_table_read_from_the_device_matches_the_catalog() -> None:
    fake = FakeMigNvml()
    table = read_profile_table(fake, "gpu0", "A100-80GB")
    catalog = mig_profiles("A100-80GB")
    assert table.source == "nvml"
    assert (table.compute_slices, table.memory_slices) == (7, 8)
    assert {p.name: p for p in table.profiles} == {p.name: p for p in catalog.profiles}


def test_the_device_answer_wins_over_the_catalog() -> None:
    fake = FakeMigNvml()
    profile = fake.by_enum[0]
    from dataclasses import replace

    fake.by_enum[0] = replace(profile, memory_mib=9000, sm_count=13)
    table = read_profile_table(fake, "gpu0", "A100-80GB")
    assert table.get(profile.name).memory_mib == 9000
    assert table.get(profile.name).sm_count == 13


def test_no_profiles_with_mig_off() -> None:
    fake = FakeMigNvml()
    fake.mig = 0
    with pytest.raises(MigDeviceError, match="no MIG profiles"):
        read_profile_table(fake, "gpu0", "A100-80GB")
    session = open_mig_devices(fake)
    [device] = session.devices
    assert not device.mig_enabled()
    assert device.profiles().source == "catalog"
    assert "using the catalog's profiles" in session.notes[0]


def _device(fake: FakeMigNvml) -> NvmlMigDevice:
    session = open_mig_devices(fake)
    [device] = session.devices
    assert device.model == "A100-80GB"
    return device


def test_create_with_placement_list_and_destroy() -> None:
    fake = FakeMigNvml()
    device = _device(fake)
    made = device.create("3g.40gb", 4)
    assert (made.profile, made.start, made.in_use) == ("3g.40gb", 4, False)
    assert made.uuid == f"MIG-fake-{made.gpu_instance_id}"
    device.create("1g.10gb", 0)
    assert [(i.profile, i.start) for i in device.instances()] == [("1g.10gb", 0), ("3g.40gb", 4)]
    assert fake.calls[:2] == ["create gi 3g.40gb@4", f"create ci on gi {made.gpu_instance_id}"]
    device.destroy(made)
    assert [(i.profile, i.start) for i in device.instances()] == [("1g.10gb", 0)]
    assert fake.calls[-2:] == [
        f"destroy ci {1000 + made.gpu_instance_id}",
        f"destroy gi {made.gpu_instance_id}",
    ]


def test_overlap_and_in_use_are_refused() -> None:
    fake = FakeMigNvml()
    device = _device(fake)
    made = device.create("4g.40gb", 0)
    with pytest.raises(MigDeviceError, match=r"cannot create 3g.40gb@0: Insufficient Resources"):
        device.create("3g.40gb", 0)
    fake.busy.add(made.gpu_instance_id)
    [busy] = device.instances()
    assert busy.in_use
    with pytest.raises(MigDeviceError, match=r"4g.40gb@0 is in use"):
        device.destroy(busy)
    assert len(fake.gis) == 1


def test_a_failed_compute_instance_undoes_the_gpu_instance() -> None:
    fake = FakeMigNvml()
    device = _device(fake)
    fake.fail_compute_instance = True
    with pytest.raises(MigDeviceError, match="no compute instance"):
        device.create("2g.20gb", 0)
    assert fake.gis == {}


def test_a_plan_applies_through_nvml() -> None:
    fake = FakeMigNvml()
    device = _device(fake)
    idle = device.create("1g.10gb", 3)
    kept = device.create("1g.10gb", 6)
    fake.busy.add(kept.gpu_instance_id)
    result = plan([gpu_from_device(device)], parse_demand("4g.40gb"))
    assert [str(d) for d in result.gpus[0].destroy] == ["1g.10gb@3"]
    report = apply_plan(result.gpus, [device], dry_run=False)
    assert report.ok, report.error
    assert [(i.profile, i.start, i.in_use) for i in device.instances()] == [
        ("4g.40gb", 0, False),
        ("1g.10gb", 6, True),
    ]
    assert report.steps[0].uuid == idle.uuid


class FakeBackendNvml(FakeMigNvml):
    """The stand-in with what :class:`fgpu.agent.nvml.NvmlBackend` also asks."""

    def nvmlDeviceGetAttributes(self, handle: str) -> Any:
        raise FakeNvmlError("Not Supported")

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        raise FakeNvmlError("Not Supported")


def test_the_nvml_backend_hands_out_its_gpus_in_mig_mode() -> None:
    from fgpu.agent.backend import MigBackend, mig_devices_of
    from fgpu.agent.nvml import NvmlBackend

    fake = FakeBackendNvml()
    backend = NvmlBackend(fake)
    assert isinstance(backend, MigBackend)
    [gpu] = backend.gpus()
    assert (gpu.model, gpu.mig_enabled) == ("A100-80GB", True)
    [device] = mig_devices_of(backend)
    assert device is backend.mig_devices()[0]
    assert (device.index, device.model, device.profiles().source) == (0, "A100-80GB", "nvml")
    made = device.create("3g.40gb", 4)
    assert device.instances() == [made]
    assert fake.mig == 1  # read, never changed


def test_the_nvml_backend_has_no_mig_devices_with_mig_off() -> None:
    from fgpu.agent.nvml import NvmlBackend

    fake = FakeBackendNvml()
    fake.mig = 0
    backend = NvmlBackend(fake)
    assert backend.mig_devices() == []
    assert fake.calls == []


@pytest.mark.gpu
def test_real_mig_gpus_are_read_without_change() -> None:
    from fgpu.agent.nvml import NvmlUnavailableError
    from fgpu.mig.layout import is_valid, make_layout

    try:
        session = open_mig_devices()
    except NvmlUnavailableError as exc:
        pytest.skip(f"no NVML here: {exc}")
    try:
        if not session.devices:
            pytest.skip("no MIG-capable GPU")
        for device in session.devices:
            table = device.profiles()
            assert table.profiles
            if device.mig_enabled():
                held = device.instances()
                assert is_valid(table, make_layout(i.placement for i in held))
    finally:
        session.close()

"""The service's MIG pool on simulated MIG devices: which instance a workload gets, when a GPU
is reconfigured (only idle ones, events first), queue admission, and failures."""

from __future__ import annotations

import pytest

from fgpu.agent.backend import GpuDevice
from fgpu.mig.catalog import mig_profiles
from fgpu.mig.device import MigDeviceError, MigInstance, SimulatedMigDevice
from fgpu.model.types import Request
from fgpu.rules.errors import BadRequest
from fgpu.sched.workload import QueueSpec, QueueTree, Resources
from fgpu.server.mig_pool import MigCandidate, MigPool, QueueBudget, instance_milli
from fgpu.store.records import StoredMigRequest


def pool(*models: str) -> tuple[MigPool, list[SimulatedMigDevice]]:
    devices = [SimulatedMigDevice(i, m, gpu_uuid=f"GPU-{i}") for i, m in enumerate(models)]
    gpus = [GpuDevice(d.index, d.gpu_uuid, d.model, 81920, None, True) for d in devices]
    return MigPool(gpus, devices, "vm/mig"), devices


def want(profile: str, wid: str = "w1", priority: int = 50, queue: str = "default") -> MigCandidate:
    return MigCandidate(wid, queue, priority, 0.0, True, StoredMigRequest(profile=profile))


class Events:
    def __init__(self, devices: list[SimulatedMigDevice]) -> None:
        self.devices = devices
        self.seen: list[tuple[str, str, str, int]] = []  # id, kind, message, device ops then

    def __call__(self, workload: str, kind: str, reason: str, message: str) -> None:
        self.seen.append((workload, kind, message, sum(len(d.log) for d in self.devices)))


def budget(**queues: QueueSpec) -> QueueBudget:
    tree = QueueTree(queues.values()) if queues else QueueTree.single()
    return QueueBudget(tree, {}, {})


@pytest.mark.parametrize(
    ("model", "milli"),
    [
        ("A100-80GB", {"1g.10gb": 142, "1g.20gb": 142, "2g.20gb": 285, "3g.40gb": 428}),
        ("A100-80GB", {"4g.40gb": 571, "7g.80gb": 1000}),
        ("A30", {"1g.6gb": 250, "2g.12gb": 500, "4g.24gb": 1000}),
    ],
    ids=["a100-small", "a100-large", "a30"],
)
def test_an_instance_counts_its_compute_slices_as_milli_gpu(
    model: str, milli: dict[str, int]
) -> None:
    table = mig_profiles(model)
    assert {name: instance_milli(table, table.get(name)) for name in milli} == milli


def test_seven_1g_instances_never_count_more_than_one_gpu() -> None:
    table = mig_profiles("H100-80GB")
    assert 7 * instance_milli(table, table.get("1g.10gb")) <= 1000


def test_a_free_instance_on_a_busy_gpu_is_taken_before_one_on_an_idle_gpu() -> None:
    migs, (gpu0, gpu1) = pool("A100-80GB", "A100-80GB")
    held = gpu0.create("1g.10gb", 0)
    spare = gpu0.create("1g.10gb", 1)
    gpu1.create("1g.10gb", 6)
    ops = len(gpu0.log) + len(gpu1.log)
    result = migs.schedule([want("1g.10gb")], {held.uuid: "other"}, budget(), Events([]))
    (place,) = result.places
    assert place.instance.uuid == spare.uuid
    assert place.allocation.gpus == (0,)
    assert (place.allocation.gpu_milli, place.allocation.gpu_memory_mib) == ((142,), (9728,))
    assert place.reason == "placed on a free MIG instance"
    assert len(gpu0.log) + len(gpu1.log) == ops  # nothing changed
    assert result.waits == {}


def test_without_a_free_instance_an_idle_gpu_is_reconfigured_after_the_event() -> None:
    migs, devices = pool("A100-80GB")
    events = Events(devices)
    result = migs.schedule([want("3g.40gb")], {}, budget(), events)
    (place,) = result.places
    (made,) = devices[0].instances()
    assert place.instance.uuid == made.uuid
    assert place.reason == "placed on a new MIG instance"
    assert events.seen == [
        (
            "w1",
            "mig-reconfigure",
            "GPU 0 (A100-80GB): create 3g.40gb@4 -> 3g.40gb@4; this workload gets 3g.40gb@4",
            0,  # recorded before the device was touched
        )
    ]
    assert result.changes == ["GPU 0 (A100-80GB): create 3g.40gb@4 -> 3g.40gb@4"]


@pytest.mark.parametrize("how", ["held", "busy-on-device"])
def test_a_gpu_with_an_instance_in_use_is_never_reconfigured(how: str) -> None:
    migs, (gpu0, gpu1) = pool("A100-80GB", "A100-80GB")
    used = gpu0.create("1g.10gb", 6)
    gpu1.create("7g.80gb", 0)  # idle: may be destroyed
    held: dict[str, str] = {}
    if how == "held":
        held[used.uuid] = "other"
    else:
        gpu0.set_in_use(used.uuid)
    before = list(gpu0.log)
    result = migs.schedule([want("3g.40gb")], held, budget(), Events([gpu0, gpu1]))
    (place,) = result.places
    assert place.instance.gpu_index == 1
    assert gpu0.log == before
    assert [(i.profile, i.start) for i in gpu0.instances()] == [("1g.10gb", 6)]
    assert [(i.profile, i.start) for i in gpu1.instances()] == [("3g.40gb", 4)]


def test_a_request_only_a_busy_gpu_could_hold_waits_and_says_why() -> None:
    migs, (gpu,) = pool("A100-80GB")
    used = gpu.create("4g.40gb", 0)
    result = migs.schedule([want("3g.40gb")], {used.uuid: "other"}, budget(), Events([gpu]))
    assert result.places == []
    assert result.waits == {
        "w1": "no free MIG instance of 3g.40gb; GPUs with instances in use (GPU 0) are not "
        "reconfigured"
    }
    assert len(gpu.log) == 1


def test_higher_priority_first_and_the_other_waits() -> None:
    migs, devices = pool("A100-80GB")
    low = want("7g.80gb", "low", priority=40)
    high = want("7g.80gb", "high", priority=100)
    result = migs.schedule([low, high], {}, budget(), Events(devices))
    assert [p.workload for p in result.places] == ["high"]
    assert "low" in result.waits
    assert "no idle MIG GPU has room for it" in result.waits["low"]


def test_a_memory_request_gets_the_smallest_profile_with_that_much() -> None:
    migs, devices = pool("A100-80GB")
    asked = MigCandidate("w1", "default", 50, 0.0, True, StoredMigRequest(memory_mib=18432))
    (place,) = migs.schedule([asked], {}, budget(), Events(devices)).places
    assert place.instance.profile == "1g.20gb"


def test_a_queue_at_its_limit_waits_and_nothing_changes() -> None:
    migs, devices = pool("A100-80GB")
    capped = QueueSpec("capped", limit=Resources(gpu_milli=500))
    result = migs.schedule(
        [want("4g.40gb", queue="capped")], {}, budget(capped=capped), Events(devices)
    )
    assert result.waits == {"w1": "queue capped would exceed its limit (0.571 > 0.5 GPUs)"}
    assert devices[0].log == []


def test_the_budget_counts_this_passes_placements() -> None:
    migs, devices = pool("A100-80GB")
    capped = QueueSpec("capped", limit=Resources(gpu_milli=800))
    first = want("4g.40gb", "first", queue="capped")
    second = MigCandidate("second", "capped", 50, 1.0, True, StoredMigRequest(profile="3g.40gb"))
    result = migs.schedule([first, second], {}, budget(capped=capped), Events(devices))
    assert [p.workload for p in result.places] == ["first"]
    assert result.waits == {"second": "queue capped would exceed its limit (0.999 > 0.8 GPUs)"}
    assert [(i.profile, i.start) for i in devices[0].instances()] == [("4g.40gb", 0)]


class Failing(SimulatedMigDevice):
    def create(self, profile: str, start: int) -> MigInstance:
        raise MigDeviceError(f"GPU {self.index}: cannot create {profile}@{start}: NVML said no")


def test_a_device_that_fails_leaves_the_workload_waiting_with_the_error() -> None:
    device = Failing(0, "A100-80GB", gpu_uuid="GPU-0")
    migs = MigPool([GpuDevice(0, "GPU-0", "A100-80GB", 81920, None, True)], [device], "vm/mig")
    events = Events([device])
    result = migs.schedule([want("3g.40gb")], {}, budget(), events)
    assert result.places == []
    assert "NVML said no" in result.waits["w1"]
    assert [k for _, k, _, _ in events.seen] == ["mig-reconfigure", "mig-failed"]
    assert result.changes[0].endswith("NVML said no)")


def test_requests_are_checked_against_the_models_here() -> None:
    migs, _ = pool("A30", "A100-80GB")
    assert migs.request_for(StoredMigRequest(profile="2g.12gb")) == Request(
        gpu_count=1, gpu_milli=500, gpu_memory_mib=11968
    )
    assert migs.request_for(StoredMigRequest(memory_mib=5000)) == Request(
        gpu_count=1, gpu_memory_mib=5000
    )
    with pytest.raises(BadRequest) as caught:
        migs.request_for(StoredMigRequest(profile="5g.50gb"))
    assert caught.value.field == "mig_profile"
    assert caught.value.reason.startswith(
        "'5g.50gb': not a MIG profile of A100-80GB or A30; valid here: A100-80GB: 1g.10gb"
    )
    assert caught.value.reason.endswith("A30: 1g.6gb, 1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb")

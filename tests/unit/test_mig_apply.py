"""Simulated MIG devices, applying plans (checks first, nothing applied on bad input), and
the plan files: plan JSON and mig-parted v1 (golden file, parsed back with PyYAML)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fgpu.mig.demand import parse_demand
from fgpu.mig.device import (
    MigDevice,
    MigDeviceError,
    MigInstance,
    SimulatedMigDevice,
    apply_plan,
    gpu_from_device,
    simulated_devices,
)
from fgpu.mig.export import (
    MIG_PARTED_KEYS,
    gpu_plans_from_data,
    load_plan_file,
    parse_mig_parted,
    plan_to_data,
    plans_from_mig_parted,
    to_mig_parted,
)
from fgpu.mig.inventory import MigGpu, MigInputError, MigInstanceState, parse_gpu_spec
from fgpu.mig.planner import MigPlan, plan

DATA = Path(__file__).parent.parent / "data" / "mig"


def layout_of(device: MigDevice) -> list[str]:
    return [f"{i.profile}@{i.start}" + ("!" if i.in_use else "") for i in device.instances()]


# --- simulated device ----------------------------------------------------------------------


def test_simulated_device_creates_destroys_and_checks() -> None:
    device = SimulatedMigDevice(0, "A100-80GB")
    assert isinstance(device, MigDevice)
    made = device.create("3g.40gb", 4)
    assert made.uuid.startswith("MIG-")
    assert made.uuid == SimulatedMigDevice(0, "A100-80GB").create("3g.40gb", 4).uuid
    device.create("3g.40gb", 0)
    with pytest.raises(MigDeviceError, match=r"cannot create 4g.40gb@0: .*overlap"):
        device.create("4g.40gb", 0)
    with pytest.raises(MigDeviceError, match=r"start 2 is not allowed"):
        device.create("3g.40gb", 2)
    device.set_in_use(made.uuid)
    with pytest.raises(MigDeviceError, match=r"3g.40gb@4 is in use"):
        device.destroy(device.instances()[1])
    assert layout_of(device) == ["3g.40gb@0", "3g.40gb@4!"]
    device.destroy(device.instances()[0])
    assert layout_of(device) == ["3g.40gb@4!"]
    with pytest.raises(MigDeviceError, match="MIG mode is off"):
        SimulatedMigDevice(1, "A30", mig_enabled=False).create("4g.24gb", 0)


def test_simulated_devices_from_a_spec() -> None:
    devices = simulated_devices("2xA100-80GB,A30")
    assert [(d.index, d.model) for d in devices] == [(0, "A100-80GB"), (1, "A100-80GB"), (2, "A30")]
    with pytest.raises(MigInputError, match=r"^--simulate-gpus: T4 has no MIG"):
        simulated_devices("T4")


# --- apply ---------------------------------------------------------------------------------


def _busy_machine() -> list[SimulatedMigDevice]:
    devices = simulated_devices("2xA100-80GB")
    busy = devices[0].create("1g.10gb", 3)
    devices[0].create("1g.10gb", 5)
    devices[0].set_in_use(busy.uuid)
    return devices


def test_plan_then_apply_on_simulated_gpus() -> None:
    devices = _busy_machine()
    result = plan([gpu_from_device(d) for d in devices], parse_demand("3g.40gb,2x2g.20gb,1g.10gb"))
    dry = apply_plan(result.gpus, devices)
    assert dry.dry_run
    assert layout_of(devices[0]) == ["1g.10gb@3!", "1g.10gb@5"]  # nothing changed
    report = apply_plan(result.gpus, devices, dry_run=False)
    assert report.ok
    assert [str(s).split(" (")[0] for s in report.steps] == [str(s) for s in dry.steps]
    for gpu_plan, device in zip(result.gpus, devices, strict=True):
        assert [f"{p}" for p in gpu_plan.after] == [
            f"{i.profile}@{i.start}" for i in device.instances()
        ]
    assert "1g.10gb@3!" in layout_of(devices[0])
    # the planner's view of the machine now serves the demand without change
    again = plan([gpu_from_device(d) for d in devices], parse_demand("3g.40gb,2x2g.20gb,1g.10gb"))
    assert again.changed_gpus == 0
    assert again.served == result.served


def test_a_stale_plan_is_refused_and_nothing_is_applied() -> None:
    devices = _busy_machine()
    result = plan([gpu_from_device(d) for d in devices], parse_demand("4g.40gb,3g.40gb"))
    devices[1].create("1g.10gb", 0)  # someone changed GPU 1 meanwhile
    before = [layout_of(d) for d in devices]
    with pytest.raises(MigInputError, match=r"GPU 1 changed since the plan was made"):
        apply_plan(result.gpus, devices, dry_run=False)
    assert [layout_of(d) for d in devices] == before


def test_an_instance_that_became_busy_is_not_destroyed() -> None:
    devices = _busy_machine()
    result = plan([gpu_from_device(d) for d in devices], parse_demand("2x3g.40gb,2x2g.20gb"))
    assert any(g.destroy for g in result.gpus)
    idle = next(i for i in devices[0].instances() if not i.in_use)
    devices[0].set_in_use(idle.uuid)
    with pytest.raises(MigInputError, match=r"1g.10gb@5 is in use now"):
        apply_plan(result.gpus, devices, dry_run=False)
    assert layout_of(devices[0]) == ["1g.10gb@3!", "1g.10gb@5!"]


def test_mig_mode_changes_are_refused() -> None:
    devices = [SimulatedMigDevice(0, "A100-80GB", mig_enabled=False)]
    result = plan([gpu_from_device(d) for d in devices], parse_demand("1g.10gb"))
    assert result.gpus[0].enable_mig
    with pytest.raises(MigInputError, match=r"MIG mode off; fgpu does not change MIG modes"):
        apply_plan(result.gpus, devices)


class _Flaky(SimulatedMigDevice):
    def create(self, profile: str, start: int):  # type: ignore[no-untyped-def]
        if profile == "3g.40gb":
            raise MigDeviceError("NVML: Unknown Error")
        return super().create(profile, start)


def test_a_device_error_stops_and_reports() -> None:
    device = _Flaky(0, "A100-80GB")
    result = plan([gpu_from_device(device)], parse_demand("3g.40gb,1g.10gb"))
    report = apply_plan(result.gpus, [device], dry_run=False)
    assert not report.ok
    assert [str(c) for c in result.gpus[0].create] == ["1g.10gb@0", "3g.40gb@4"]
    assert report.error == "GPU 0: create 3g.40gb@4: NVML: Unknown Error"
    assert [f"{s.action} {s.profile}@{s.start}" for s in report.steps] == ["create 1g.10gb@0"]
    assert [f"{s.profile}@{s.start}" for s in report.pending] == ["3g.40gb@4"]
    assert layout_of(device) == ["1g.10gb@0"]  # what was done stays done


# --- plan JSON -----------------------------------------------------------------------------


def _mixed_plan() -> MigPlan:
    gpus = [
        MigGpu(
            0,
            "A100-80GB",
            instances=(
                MigInstanceState("3g.40gb", 0, True, "MIG-aaaa"),
                MigInstanceState("1g.10gb", 4, False, "MIG-bbbb"),
            ),
        ),
        MigGpu(1, "A100-80GB"),
        MigGpu(2, "A100-80GB"),
        MigGpu(3, "A30", mig_enabled=False),
    ]
    return plan(gpus, parse_demand("2g.20gb,2x1g.10gb,0.5,2x3g.40gb"))


def test_plan_json_round_trip() -> None:
    result = _mixed_plan()
    data = json.loads(json.dumps(plan_to_data(result)))
    assert data["unserved"] == []
    assert data["served"] == 6
    back = gpu_plans_from_data(data)
    assert [(g.index, g.before, g.destroy, g.create, g.after) for g in back] == [
        (g.index, g.before, g.destroy, g.create, g.after) for g in result.gpus
    ]


def test_unserved_is_listed_in_the_json() -> None:
    result = plan(parse_gpu_spec("A100-80GB"), parse_demand("7g.80gb,2x3g.40gb"))
    data = plan_to_data(result)
    assert [(u["request"], u["count"]) for u in data["unserved"]] == [("7g.80gb", 1)]
    assert data["unserved"][0]["reason"].startswith("no room left: GPU 0 could hold it")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d["gpus"][1]["create"].append({"profile": "4g.40gb", "start": 0}),
            "plan.gpus[1].create: GPU 1: 1g.10gb@0 and 4g.40gb@0 overlap on memory slice 0",
        ),
        (
            lambda d: d["gpus"][1]["create"].append({"profile": "3g.40gb", "start": 2}),
            "plan.gpus[1].create: GPU 1: 3g.40gb@2: start 2 is not allowed",
        ),
        (
            lambda d: d["gpus"][0]["destroy"].append(d["gpus"][0]["before"][0]),
            "plan.gpus[0].destroy[0]: 3g.40gb@0 is in use; it is never destroyed",
        ),
        (
            lambda d: d["gpus"][1]["create"].append({"profile": "1g.5gb", "start": 0}),
            "'1g.5gb' is not a MIG profile of A100-80GB",
        ),
        (lambda d: d["gpus"][1]["create"][0].pop("start"), "plan.gpus[1].create[0].start: missing"),
        (lambda d: d.update(kind="other"), "plan: not an fgpu MIG plan"),
    ],
)
def test_bad_plan_files_name_the_field(edit: object, message: str) -> None:
    data = plan_to_data(_mixed_plan())
    edit(data)  # type: ignore[operator]
    with pytest.raises(MigInputError) as caught:
        gpu_plans_from_data(data)
    assert message in str(caught.value)


# --- mig-parted ----------------------------------------------------------------------------


def test_mig_parted_export_matches_the_golden_file() -> None:
    text = to_mig_parted(_mixed_plan(), "fgpu-plan")
    assert text == (DATA / "mixed-plan.mig-parted.yaml").read_text()


def test_mig_parted_export_parses_back_against_the_spec() -> None:
    result = _mixed_plan()
    data = yaml.safe_load(to_mig_parted(result, "fgpu-plan"))
    assert set(data) == {"version", "mig-configs"}
    assert data["version"] == "v1"
    entries = data["mig-configs"]["fgpu-plan"]
    covered: list[int] = []
    for entry in entries:
        assert set(entry) <= MIG_PARTED_KEYS
        assert {"devices", "mig-enabled"} <= set(entry)
        assert isinstance(entry["mig-enabled"], bool)
        if entry["mig-enabled"]:
            assert isinstance(entry["mig-devices"], dict)
        else:
            assert not entry.get("mig-devices")
        covered += entry["devices"]
        for index in entry["devices"]:
            gpu_plan = result.gpus[index]
            counts: dict[str, int] = {}
            for p in gpu_plan.after:
                counts[p.profile] = counts.get(p.profile, 0) + 1
            assert entry.get("mig-devices", {}) == counts
    assert sorted(covered) == [0, 1, 2, 3]
    assert parse_mig_parted(data)[0].devices == (0,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", "config.version"),
        (
            "version: v1\nmig-configs: {a: [{devices: all}]}",
            "config.mig-configs.a[0].mig-enabled: missing",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}",
            "config.mig-configs.a[0].mig-devices: required when mig-enabled is true",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}",
            "config.mig-configs.a[0].devices: expected 'all' or a list",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false,"
            " mig-devices: {1g.10gb: 1}}]}",
            "MIG devices given while mig-enabled is false",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, colour: red}]}",
            "config.mig-configs.a[0].colour: unexpected field",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false}], b: []}",
            "--config-name: the file has several configs; choose one of a, b",
        ),
    ],
)
def test_bad_mig_parted_configs(text: str, message: str) -> None:
    with pytest.raises(MigInputError) as caught:
        parse_mig_parted(yaml.safe_load(text))
    assert message in str(caught.value)


def test_mig_parted_config_applies_incrementally() -> None:
    devices = _busy_machine()  # GPU 0: 1g.10gb@3 in use, 1g.10gb@5 idle
    text = (
        "version: v1\nmig-configs:\n  mine:\n"
        "    - devices: [0]\n      mig-enabled: true\n"
        "      mig-devices: {1g.10gb: 2, 3g.40gb: 1}\n"
        "    - devices: [1]\n      mig-enabled: true\n      mig-devices: {3g.40gb: 2}\n"
    )
    kind, data = load_plan_file(text, "config.yaml")
    assert kind == "mig-parted"
    plans = plans_from_mig_parted(parse_mig_parted(data, "mine"), devices)
    assert [str(d) for d in plans[0].destroy] == ["1g.10gb@5"]  # the 3g needs slices 4-7
    report = apply_plan(plans, devices, dry_run=False)
    assert report.ok
    after = layout_of(devices[0])
    assert "1g.10gb@3!" in after
    assert "3g.40gb@4" in after
    assert sorted(a.split("@")[0] for a in after) == ["1g.10gb", "1g.10gb", "3g.40gb"]
    assert layout_of(devices[1]) == ["3g.40gb@0", "3g.40gb@4"]


def test_mig_parted_config_that_would_drop_an_instance_in_use_is_refused() -> None:
    devices = _busy_machine()
    entries = parse_mig_parted(
        yaml.safe_load(
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: true,"
            " mig-devices: {7g.80gb: 1}}]}"
        )
    )
    with pytest.raises(
        MigInputError, match=r"config\[0\].mig-devices: GPU 0: asks for 0 x 1g.10gb"
    ):
        plans_from_mig_parted(entries, devices)
    assert layout_of(devices[0]) == ["1g.10gb@3!", "1g.10gb@5"]


def test_load_plan_file_refuses_other_files() -> None:
    with pytest.raises(MigInputError, match=r"^x.yaml: neither an fgpu MIG plan"):
        load_plan_file("a: 1", "x.yaml")
    with pytest.raises(MigInputError, match=r"^x.yaml: not YAML or JSON"):
        load_plan_file("a: [", "x.yaml")


def test_a_simulated_device_restores_instances_and_reports_changes() -> None:
    seen: list[str] = []
    device = SimulatedMigDevice(0, "A100-80GB", on_change=lambda d: seen.append(repr(d)))
    kept = MigInstance("3g.40gb", 4, "MIG-kept", 5)
    device.restore([kept])
    assert device.instances() == [kept]
    assert seen == []  # restoring is not a change
    made = device.create("4g.40gb", 0)
    assert made.gpu_instance_id == 6
    device.destroy(made)
    assert seen == [
        "SimulatedMigDevice(0, 'A100-80GB', 4g.40gb@0 + 3g.40gb@4)",
        "SimulatedMigDevice(0, 'A100-80GB', 3g.40gb@4)",
    ]
    with pytest.raises(MigDeviceError, match="not a valid layout"):
        device.restore([kept, MigInstance("4g.40gb", 4, "MIG-over", 7)])
    assert device.instances() == [kept]

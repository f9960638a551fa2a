"""GPU backends: the --simulate-gpus spec, simulated GPUs, and choosing a backend."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fgpu.agent.backend import (
    FALLBACK_SIMULATED_GPUS,
    GpuBackend,
    GpuDevice,
    GpuProcess,
    SimulatedBackend,
    SimulatedGpuGroup,
    detect_backend,
    mig_devices_of,
    parse_simulate_spec,
    simulated_uuid,
)
from fgpu.model.catalog import ALIASES, GPU_CATALOG
from tests.unit.test_agent_nvml import FakeGpu, FakeNvml

KNOWN = f"known models: {', '.join(sorted(GPU_CATALOG))} (aliases: {', '.join(sorted(ALIASES))})"


# -- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "groups"),
    [
        ("2xA100-40GB,1xH100-80GB", [(2, "A100-40GB"), (1, "H100-80GB")]),
        ("1xH100-80GB", [(1, "H100-80GB")]),
        ("H100-80GB", [(1, "H100-80GB")]),
        (" 4 x a100-80gb , 1X h100 ", [(4, "A100-80GB"), (1, "H100-80GB")]),
        ("3xV100M32", [(3, "V100-32GB")]),
        ("64xA100-80GB", [(64, "A100-80GB")]),
    ],
    ids=["two-kinds", "one", "count-left-out", "spaces-case-alias", "trace-alias", "many"],
)
def test_good_specs(spec: str, groups: list[tuple[int, str]]) -> None:
    assert parse_simulate_spec(spec) == [SimulatedGpuGroup(c, m) for c, m in groups]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "--simulate-gpus: empty GPU list; expected e.g. '2xA100-40GB,1xH100-80GB'"),
        ("  ", "--simulate-gpus: empty GPU list; expected e.g. '2xA100-40GB,1xH100-80GB'"),
        (
            "2xA100-40GB,",
            "--simulate-gpus: empty part in '2xA100-40GB,'; expected e.g. "
            "'2xA100-40GB,1xH100-80GB'",
        ),
        (
            "0xA100-40GB",
            "--simulate-gpus: GPU count must be a positive integer, got 0 in '0xA100-40GB'",
        ),
        (
            "99999xA100-80GB",
            "--simulate-gpus: 99999 GPUs in '99999xA100-80GB'; at most 64 of one model "
            "(a node's limit)",
        ),
        (
            "1xT4,-2xH100-80GB",
            "--simulate-gpus: GPU count must be a positive integer, got -2 in '-2xH100-80GB'",
        ),
        ("2xB200", f"--simulate-gpus: unknown GPU model 'B200' in '2xB200'; {KNOWN}"),
        ("2x", f"--simulate-gpus: unknown GPU model '2x' in '2x'; {KNOWN}"),
        (
            "1.5xA100-40GB",
            f"--simulate-gpus: unknown GPU model '1.5xA100-40GB' in '1.5xA100-40GB'; {KNOWN}",
        ),
    ],
    ids=[
        "empty",
        "blank",
        "empty-part",
        "zero",
        "too-many",
        "negative",
        "unknown",
        "no-model",
        "fraction",
    ],
)
def test_bad_specs_name_the_flag_and_the_part(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^--simulate-gpus: ") as caught:
        SimulatedBackend(spec)
    assert str(caught.value) == message


# -- simulated GPUs ------------------------------------------------------------------------


def test_devices_come_from_the_catalog_in_spec_order() -> None:
    backend = SimulatedBackend("2xA100-40GB,1xH100-80GB")
    assert backend.kind == "simulated"
    assert backend.gpus() == [
        GpuDevice(0, simulated_uuid(0, "A100-40GB"), "A100-40GB", 40960, 108, False),
        GpuDevice(1, simulated_uuid(1, "A100-40GB"), "A100-40GB", 40960, 108, False),
        GpuDevice(2, simulated_uuid(2, "H100-80GB"), "H100-80GB", 81920, 132, False),
    ]
    assert isinstance(backend, GpuBackend)


def test_uuids_are_stable_across_instances_and_distinct() -> None:
    first = [d.uuid for d in SimulatedBackend("2xA100-40GB,1xH100-80GB").gpus()]
    second = [d.uuid for d in SimulatedBackend("2xA100-40GB, 1xH100").gpus()]
    assert first == second
    assert len(set(first)) == 3
    assert all(u.startswith("GPU-00000000-feed-") for u in first)


def test_another_model_at_an_index_gets_another_uuid() -> None:
    a100 = SimulatedBackend("1xA100-40GB").gpus()[0].uuid
    h100 = SimulatedBackend("1xH100-80GB").gpus()[0].uuid
    assert a100 != h100


def test_pretend_usage_reports() -> None:
    backend = SimulatedBackend("2xA100-40GB")
    gpu0, gpu1 = (d.uuid for d in backend.gpus())
    assert backend.process_memory() == []
    backend.report_usage(200, gpu1, 2048)
    backend.report_usage(100, gpu0, 512)
    backend.report_usage(100, gpu1, 1)
    assert backend.process_memory() == [
        GpuProcess(100, gpu0, 512),
        GpuProcess(100, gpu1, 1),
        GpuProcess(200, gpu1, 2048),
    ]
    backend.report_usage(100, gpu0, 0)
    backend.forget_process(200)
    assert backend.process_memory() == [GpuProcess(100, gpu1, 1)]


def test_pretend_utilization() -> None:
    backend = SimulatedBackend("2xT4")
    gpu0, _ = (d.uuid for d in backend.gpus())
    assert backend.utilization() == {}
    backend.report_utilization(gpu0, 70)
    assert backend.utilization() == {gpu0: 70}
    backend.report_utilization(gpu0, None)
    assert backend.utilization() == {}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda b: b.report_usage(1, "GPU-nope", 5), "unknown simulated GPU 'GPU-nope'"),
        (lambda b: b.report_usage(1, b.gpus()[0].uuid, -1), "memory must be >= 0 MiB, got -1"),
        (lambda b: b.report_utilization(b.gpus()[0].uuid, 101), "percent must be 0-100, got 101"),
    ],
    ids=["unknown-gpu", "negative-memory", "over-100"],
)
def test_bad_pretend_reports(call: object, message: str) -> None:
    backend = SimulatedBackend("1xT4")
    with pytest.raises(ValueError, match=message):
        call(backend)  # type: ignore[operator]


# -- choosing a backend ---------------------------------------------------------------------

LOG = logging.getLogger("test.agent.backend")


def test_simulate_flag_wins_and_nvml_is_not_touched(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([FakeGpu()])
    with caplog.at_level(logging.INFO, logger=LOG.name):
        backend = detect_backend("2xT4", LOG, nvml=nvml)
    assert isinstance(backend, SimulatedBackend)
    assert [d.model for d in backend.gpus()] == ["T4", "T4"]
    assert nvml.init_calls == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_empty_simulate_flag_is_an_error() -> None:
    with pytest.raises(ValueError, match="--simulate-gpus: empty GPU list"):
        detect_backend("", LOG)


def test_nvml_is_used_when_it_reports_gpus() -> None:
    backend = detect_backend(None, LOG, nvml=FakeNvml([FakeGpu()]))
    assert backend.kind == "nvml"
    assert [d.model for d in backend.gpus()] == ["A100-80GB"]


@pytest.mark.parametrize(
    ("nvml", "why"),
    [
        (
            FakeNvml([], init_error="NVML Shared Library Not Found"),
            "NVML did not initialise: NVML Shared Library Not Found",
        ),
        (FakeNvml([]), "NVML reports no GPUs"),
        (
            FakeNvml([], count_error="Driver Not Loaded"),
            "NVML could not count the GPUs: Driver Not Loaded",
        ),
    ],
    ids=["no-library", "no-gpus", "no-driver"],
)
def test_fallback_is_one_simulated_h100_with_a_warning(
    nvml: FakeNvml,
    why: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        backend = detect_backend(None, LOG, nvml=nvml)
    assert isinstance(backend, SimulatedBackend)
    (device,) = backend.gpus()
    assert (device.model, device.memory_mib) == ("H100-80GB", 81920)
    assert backend.spec == FALLBACK_SIMULATED_GPUS
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        f"NVML is unavailable ({why}); using one simulated H100-80GB GPU ({device.uuid}) "
        "instead. Pass --simulate-gpus to choose the simulated GPUs.",
    ]
    opened = nvml.init_error is None
    assert nvml.shutdown_calls == (1 if opened else 0)  # what was opened is closed again


def test_this_machine_gives_a_usable_backend(caplog: pytest.LogCaptureFixture) -> None:
    """Without a stand-in: NVML on a GPU machine, the warned fallback elsewhere."""
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        backend = detect_backend(None, LOG)
    try:
        assert backend.gpus()
        if backend.kind == "simulated":
            assert "NVML is unavailable" in caplog.text
    finally:
        backend.close()


# -- GPUs in MIG mode ----------------------------------------------------------------------


def test_mig_flag_puts_gpus_in_mig_mode() -> None:
    assert parse_simulate_spec("1xA100-40GB,2xa100-80gb:MIG") == [
        SimulatedGpuGroup(1, "A100-40GB"),
        SimulatedGpuGroup(2, "A100-80GB", mig=True),
    ]
    backend = SimulatedBackend("1xA100-40GB,2xA100-80GB:mig")
    assert [d.mig_enabled for d in backend.gpus()] == [False, True, True]
    migs = backend.mig_devices()
    assert [(d.index, d.model, d.gpu_uuid) for d in migs] == [
        (1, "A100-80GB", simulated_uuid(1, "A100-80GB")),
        (2, "A100-80GB", simulated_uuid(2, "A100-80GB")),
    ]
    assert migs == backend.mig_devices()  # the same objects each time
    assert mig_devices_of(backend) == migs
    assert SimulatedBackend("1xA100-40GB").mig_devices() == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "2xA100-80GB:mps",
            "--simulate-gpus: unknown flag 'mps' in '2xA100-80GB:mps'; the only flag is 'mig' "
            "(GPUs in MIG mode, e.g. '2xA100-80GB:mig')",
        ),
        (
            "1xT4:mig",
            "--simulate-gpus: T4 in '1xT4:mig' has no MIG profiles; MIG models: A30, "
            "A100-40GB, A100-80GB, H100-80GB, H200-141GB",
        ),
    ],
    ids=["unknown-flag", "not-mig-capable"],
)
def test_bad_mig_flags(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^--simulate-gpus: ") as caught:
        SimulatedBackend(spec)
    assert str(caught.value) == message


def test_simulated_mig_instances_outlive_the_backend_through_the_state_file(
    tmp_path: Path,
) -> None:
    state = tmp_path / "simulated-mig.json"
    first = SimulatedBackend("2xA100-80GB:mig")
    assert first.keep_mig_state(state) == []
    made = first.mig_devices()[1].create("3g.40gb", 4)
    first.mig_devices()[1].create("1g.10gb", 0)
    first.mig_devices()[1].destroy(first.mig_devices()[1].instances()[0])  # the 1g again
    second = SimulatedBackend("2xA100-80GB:mig")
    assert second.keep_mig_state(state) == []
    gpu0, gpu1 = second.mig_devices()
    assert gpu0.instances() == []
    assert gpu1.instances() == [made]
    # the next instance gets an id of its own
    assert gpu1.create("1g.10gb", 0).gpu_instance_id > made.gpu_instance_id
    # another model at index 1 is another GPU: its saved instances are dropped
    third = SimulatedBackend("1xA100-80GB:mig,1xH100-80GB:mig")
    notes = third.keep_mig_state(state)
    assert notes == [
        f"GPU {simulated_uuid(1, 'A100-80GB')}: not simulated any more; its MIG instances dropped"
    ]
    assert [d.instances() for d in third.mig_devices()] == [[], []]


def test_a_broken_state_file_starts_empty_with_a_note(tmp_path: Path) -> None:
    state = tmp_path / "simulated-mig.json"
    state.write_text("{not json")
    backend = SimulatedBackend("1xA100-80GB:mig")
    (note,) = backend.keep_mig_state(state)
    assert note.startswith(f"{state}: not a simulated MIG state")
    assert backend.mig_devices()[0].instances() == []
    assert json.loads(state.read_text()) == {"gpus": {simulated_uuid(0, "A100-80GB"): []}}


def test_simulated_gpus_of_two_hosts_have_different_uuids() -> None:
    alone = SimulatedBackend("2xA100-80GB").gpus()
    a = SimulatedBackend("2xA100-80GB", host="node-a").gpus()
    b = SimulatedBackend("2xA100-80GB", host="node-b").gpus()
    assert {g.uuid for g in a}.isdisjoint(g.uuid for g in b)
    assert [g.uuid for g in a] == [g.uuid for g in SimulatedBackend("2xA100-80GB", "node-a").gpus()]
    assert alone[0].uuid.startswith("GPU-00000000-feed-")  # one machine: as before

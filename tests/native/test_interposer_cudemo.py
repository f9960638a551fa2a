"""libfgpu against the fake driver with fgpu-cudemo (a C program linked to libcuda.so.1).

Every allocation API against the cap through the linked path and through dlopen +
cuGetProcAddress_v2 (``--dlopen``, as the CUDA runtime does); memory queries report the cap;
launches (kernels and graphs) wait at a closed gate and go when it opens; in-flight work
stays within max_inflight; GPU time from events matches the fake driver's own per-process
device time. The fake driver is a stand-in for libcuda.so.1 written for the tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.native.interposer_support import (
    FLAG_MEMORY_CAP,
    GATE_CLOSED,
    GATE_OPEN,
    MIB,
    AgentLib,
    fake_env,
)

from fgpu import native as fgpu_native

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPUS = f"{UUID}=A100-80GB:81920"
CAP = 1024 * MIB
DEADLINE_S = 60.0
APIS = ["mem", "pitch", "managed", "vmm", "async", "pool", "array", "array3d", "mipmap", "graph"]
PATHS = [pytest.param([], id="linked"), pytest.param(["--dlopen"], id="dlopen-procaddr")]


@pytest.fixture(scope="module")
def native() -> Path:
    return fgpu_native.ensure_built()


@pytest.fixture
def seg(tmp_path: Path, native: Path) -> Iterator[tuple[AgentLib, Path]]:
    agent = AgentLib(native)
    path = tmp_path / "seg"
    agent.create(path, [UUID], [CAP])
    yield agent, path
    agent.close()


@pytest.fixture
def env(native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]) -> dict[str, str]:
    return fake_env(native, tmp_path / "fakegpu", GPUS, seg=seg[1])


def cudemo(native: Path, env: dict[str, str], *args: str) -> dict[str, object]:
    proc = subprocess.run(
        [str(native / "bin" / "fgpu-cudemo"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.stdout, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.mark.parametrize(
    "path",
    [
        *PATHS,
        pytest.param(["--dlopen", "--ptsz"], id="dlopen-procaddr-ptsz"),
    ],
)
@pytest.mark.parametrize("api", APIS)
def test_every_allocation_api_is_capped(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], api: str, path: list[str]
) -> None:
    agent, _ = seg
    if "--ptsz" in path:
        env = {**env, "FGPU_PROCADDR": "names"}
    over = cudemo(native, env, *path, "alloc", api, str(CAP + 64 * MIB))
    assert over["error"] == "CUDA_ERROR_OUT_OF_MEMORY", over
    snap = agent.snapshot()
    assert snap.gpus[0].oom_count == 1
    assert snap.gpus[0].oom_last_bytes >= CAP
    fits = cudemo(native, env, *path, "alloc", api, str(500 * MIB))
    assert fits["error"] == "CUDA_SUCCESS", fits
    # while held, the program's own cuMemGetInfo saw the reservation inside the cap
    assert fits["total"] == CAP
    assert fits["free_before"] == CAP
    # counted: between the bytes asked and the bytes the driver took (its rounding)
    asked, taken = int(fits["bytes"]), int(fits["size"])  # type: ignore[call-overload]
    held = CAP - int(fits["free_during"])  # type: ignore[call-overload]
    assert min(asked, taken) <= held <= max(asked, taken)
    assert fits["free_after"] == CAP
    snap = agent.snapshot()
    assert snap.gpus[0].memory_reserved == 0, "given back on free"
    assert snap.gpus[0].memory_peak == held


@pytest.mark.parametrize("path", PATHS)
def test_allocating_until_oom_stops_at_the_cap(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], path: list[str]
) -> None:
    out = cudemo(native, env, *path, "alloc-until-oom", "mem", str(100 * MIB))
    assert out["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert out["count"] == 10
    assert out["total"] == CAP
    assert out["free_at_error"] == CAP - 1000 * MIB
    assert seg[0].snapshot().gpus[0].oom_last_bytes == 100 * MIB


def test_ipc_import_is_not_counted_twice(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path]
) -> None:
    out = cudemo(native, env, "alloc", "ipc", str(600 * MIB))
    child = out["ipc_child"]
    assert isinstance(child, dict)
    assert child["error"] == "CUDA_SUCCESS"
    # the exporter holds 600 MiB of the cap; opening it in a second process takes nothing more
    assert child["free_before"] == child["free_opened"] == CAP - 600 * MIB
    assert seg[0].snapshot().gpus[0].memory_reserved == 0


def test_meminfo_and_nvml_report_the_cap(native: Path, env: dict[str, str]) -> None:
    assert cudemo(native, env, "meminfo") == {"free": CAP, "total": CAP}
    code = (
        "import ctypes, json\n"
        "n = ctypes.CDLL('libnvidia-ml.so.1')\n"
        "assert n.nvmlInit_v2() == 0\n"
        "h = ctypes.c_void_p()\n"
        "assert n.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0\n"
        "m = (ctypes.c_ulonglong * 3)()\n"
        "assert n.nvmlDeviceGetMemoryInfo(h, m) == 0\n"
        "m2 = (ctypes.c_ulonglong * 5)(0x02000028)\n"
        "assert n.nvmlDeviceGetMemoryInfo_v2(h, m2) == 0\n"
        "print(json.dumps({'v1': list(m), 'v2_total': m2[1], 'v2_free': m2[3]}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["v1"] == [CAP, CAP, 0]
    assert (out["v2_total"], out["v2_free"]) == (CAP, CAP)


@pytest.mark.parametrize("rule", ["auto", "pointers", "names"])
def test_procaddr_answers_match_dlsym_through_the_interposer(
    native: Path, env: dict[str, str], rule: str
) -> None:
    # "names" runs the fake driver's (name, version, flags) table through the name rule the
    # interposer falls back on when a driver answers with addresses dlsym does not give
    out = cudemo(native, {**env, "FGPU_PROCADDR": rule}, "procaddr")
    assert out["mismatches"] == []
    assert out["ok"] == out["checked"]
    assert out["v1_same"] is True


def start(native: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(native / "bin" / "fgpu-cudemo"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    "how",
    [
        pytest.param([], id="kernel"),
        pytest.param(["--graph"], id="graph"),
        pytest.param(["--ex"], id="launch-ex"),
        pytest.param(["--coop"], id="cooperative"),
        pytest.param(["--ptsz"], id="ptsz"),
    ],
)
def test_a_closed_gate_holds_launches_and_opening_releases_them(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], how: list[str]
) -> None:
    agent, _ = seg
    agent.set_gate(GATE_CLOSED)
    flags = [f for f in how if f == "--ptsz"]
    spin_flags = [f for f in how if f != "--ptsz"]
    proc = start(native, env, *flags, "--dlopen", "spin", str(1_000_000), "5", *spin_flags)
    try:

        def waiting() -> bool:
            agent.beat()  # the agent is alive: a silent one's gate would count as open
            return bool(agent.snapshot().waiting == 1)

        wait_for(waiting, "the launcher to wait at the gate")
        snap = agent.snapshot()
        assert (snap.launches, snap.gate_waits, snap.live_processes) == (0, 1, 1)
        assert proc.poll() is None, "held, not finished"
        agent.set_gate(GATE_OPEN)
        stdout, stderr = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert json.loads(stdout.strip().splitlines()[-1])["launches"] == 5
    snap = agent.snapshot()
    assert snap.launches == 5
    assert snap.waiting == 0


def test_inflight_stays_within_max_inflight(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path]
) -> None:
    agent, _ = seg
    agent.set_max_inflight(2)
    proc = start(native, env, "spin", str(5_000_000), "40", "--stream")
    seen: list[int] = []
    while proc.poll() is None:
        seen.append(agent.snapshot().inflight)
        time.sleep(0.001)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert max(seen) <= 2
    assert max(seen) >= 1, "the sampler saw work in flight"
    snap = agent.snapshot()
    assert snap.launches == 40
    assert snap.inflight == 0


def device_time(env: dict[str, str], pid: int) -> int:
    """The fake driver's own figure: fgpuFakeDeviceTime(uuid, pid)."""
    code = (
        "import ctypes, sys\n"
        "lib = ctypes.CDLL('libcuda.so.1')\n"
        "ns = ctypes.c_ulonglong()\n"
        f"rc = lib.fgpuFakeDeviceTime(b'{UUID}', {pid}, ctypes.byref(ns))\n"
        "print(rc, ns.value)\n"
    )
    plain = {k: v for k, v in env.items() if k not in ("LD_PRELOAD", "FGPU_SEG")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=plain, capture_output=True, text=True, check=True
    )
    rc, ns = out.stdout.split()
    assert rc == "0", out.stdout
    return int(ns)


@pytest.mark.parametrize(
    "how", [[], ["--graph"], ["--stream"]], ids=["kernel", "graph", "own-stream"]
)
def test_gpu_time_matches_the_fake_drivers_device_time(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], how: list[str]
) -> None:
    agent, _ = seg
    out = cudemo(native, env, "spin", str(2_000_000), "50", *how)
    measured = agent.snapshot().gpus[0].gpu_time_ns
    truth = device_time(env, int(out["pid"]))  # type: ignore[call-overload]
    assert truth >= 50 * 2_000_000
    assert abs(measured - truth) <= 0.03 * truth, (measured, truth)


def test_memory_only_segment_does_not_gate(native: Path, tmp_path: Path) -> None:
    agent = AgentLib(native)
    path = tmp_path / "seg-mem"
    agent.create(path, [UUID], [CAP], flags=FLAG_MEMORY_CAP)
    agent.set_gate(GATE_CLOSED)  # ignored without FGPU_SEG_GATING
    env = fake_env(native, tmp_path / "fakegpu", GPUS, seg=path)
    out = cudemo(native, env, "spin", str(100_000), "5")
    assert out["launches"] == 5
    snap = agent.snapshot()
    assert (snap.launches, snap.gate_waits) == (5, 0)
    agent.close()


def test_a_gate_whose_agent_went_silent_counts_as_open(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path]
) -> None:
    agent, _ = seg
    agent.set_gate(GATE_CLOSED)  # beats once; nobody beats again (a dead agent)
    out = cudemo(native, env, "spin", str(100_000), "3")
    assert out["launches"] == 3, "released once FGPU_SEG_STALE_NS (1.5 s) passed without a beat"
    snap = agent.snapshot()
    assert (snap.gate, snap.launches, snap.gate_waits) == (GATE_CLOSED, 3, 1)


def test_devices_map_to_segment_gpus_by_uuid(native: Path, tmp_path: Path) -> None:
    other = "GPU-99999999-8888-7777-6666-555555555555"
    gpus = f"{other}=H100-80GB:81920,{UUID}=A100-80GB:81920"  # ordinal 0: not in the segment
    agent = AgentLib(native)
    path = tmp_path / "seg2"
    agent.create(path, [UUID], [CAP])
    env = fake_env(native, tmp_path / "fakegpu2", gpus, seg=path)
    other_dev = cudemo(native, env, "--device", "0", "alloc", "mem", str(MIB))
    assert other_dev["error"] == "CUDA_ERROR_OUT_OF_MEMORY", "a GPU not granted: its cap is 0"
    assert other_dev["total"] == 81920 * MIB
    assert cudemo(native, env, "--device", "0", "meminfo")["free"] == 0
    uncapped = fake_env(native, tmp_path / "fakegpu2", gpus, seg=path)
    agent_nocap = AgentLib(native)
    path_nocap = tmp_path / "seg3"
    agent_nocap.create(path_nocap, [UUID], [CAP], flags=0)
    uncapped["FGPU_SEG"] = str(path_nocap)
    free_dev0 = cudemo(native, uncapped, "--device", "0", "alloc", "mem", str(2 * CAP))
    assert free_dev0["error"] == "CUDA_SUCCESS", "without the cap flag nothing is refused"
    agent_nocap.close()
    capped = cudemo(native, env, "--device", "1", "alloc", "mem", str(2 * CAP))
    assert capped["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert capped["total"] == CAP
    snap = agent.snapshot()
    assert (snap.gpus[0].oom_count, snap.gpus[0].memory_peak) == (1, 0)
    agent.close()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("api", ["mem", "vmm", "async", "array"])
def test_threads_racing_in_one_process_share_the_cap(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], api: str, path: list[str]
) -> None:
    out = cudemo(native, env, *path, "threads", "8", api, str(200 * MIB))
    assert (out["ok"], out["oom"], out["other"]) == (5, 3, 0)  # 5 x 200 MiB fit in 1024 MiB
    snap = seg[0].snapshot()
    assert snap.gpus[0].memory_peak <= CAP
    assert snap.gpus[0].memory_reserved == 0

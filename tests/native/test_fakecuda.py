"""The fake CUDA driver and fake NVML (stand-ins written for the tests, native/fakecuda),
driven by fgpu-cudemo as real processes and through ctypes: capacity and out-of-memory for
every allocation API, memory of a killed process, one kernel at a time per device across
processes, stream order, events, cuGetProcAddress, NVML memory and utilization, pynvml.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.native.fakecuda_support import GPU_A, GPU_B, MIB, FakeGpus

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
DEADLINE_S = 60.0
ALL_APIS = [
    "mem", "pitch", "managed", "vmm", "async", "pool",
    "array", "array3d", "mipmap", "graph", "ipc", "module",
]  # fmt: skip


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def read_json_line(proc: subprocess.Popen[str]) -> dict[str, object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the program prints (no fixed sleep)
    assert line, f"no output; stderr: {proc.stderr.read() if proc.stderr else ''}"
    out: dict[str, object] = json.loads(line)
    return out


# ---------------------------------------------------------------- configuration and devices


def test_devices_follow_the_configuration_and_cuda_visible_devices(fake_gpus: FakeGpus) -> None:
    info = fake_gpus.run("info")
    assert [(d["name"], d["total"]) for d in info["devices"]] == [
        ("A100-80GB", 1024 * MIB),
        ("H100-80GB", 2048 * MIB),
    ]
    # the uuid bytes are the hex digits of "GPU-xxxxxxxx-..." (16 bytes)
    assert info["devices"][0]["uuid_hex"] == GPU_A[4:].replace("-", "")
    swapped = fake_gpus.run("info", env=fake_gpus.env(visible=f"{GPU_B[:12]},0"))
    assert [d["name"] for d in swapped["devices"]] == ["H100-80GB", "A100-80GB"]
    only_second = fake_gpus.run("info", env=fake_gpus.env(visible="1"))
    assert [d["name"] for d in only_second["devices"]] == ["H100-80GB"]
    stops_at_unknown = fake_gpus.run("info", env=fake_gpus.env(visible="1,7,0"))
    assert [d["name"] for d in stops_at_unknown["devices"]] == ["H100-80GB"]
    none = fake_gpus.run("info", env=fake_gpus.env(visible=""), ok=False)
    assert (none["call"], none["result"]) == ("cuInit", CUDA_ERROR_NO_DEVICE)


@pytest.mark.parametrize(
    ("variables", "reason"),
    [
        pytest.param({"FGPU_FAKE_GPU_STATE": ""}, "FGPU_FAKE_GPU_STATE is not set", id="no-state"),
        pytest.param({"FGPU_FAKE_GPUS": ""}, "FGPU_FAKE_GPUS is not set", id="no-gpus"),
        pytest.param({"FGPU_FAKE_GPUS": "GPU-x=A100:lots"}, "memory 'lots'", id="bad-mib"),
        pytest.param(
            {"FGPU_FAKE_GPUS": "GPU-x:80"}, "'GPU-x:80' is not UUID=MODEL:MIB", id="no-eq"
        ),
        pytest.param(
            {"FGPU_FAKE_GPUS": "GPU-x=A:1,GPU-x=B:1"}, "uuid GPU-x given twice", id="duplicate"
        ),
    ],
)
def test_missing_or_bad_configuration_means_no_device_and_says_why(
    fake_gpus: FakeGpus, variables: dict[str, str], reason: str
) -> None:
    env = fake_gpus.env(FGPU_FAKE_DEBUG="1", **variables)
    out = fake_gpus.run("info", env=env, ok=False)
    assert (out["call"], out["result"]) == ("cuInit", CUDA_ERROR_NO_DEVICE)
    assert reason in out["_stderr"]
    quiet = fake_gpus.run("info", env=fake_gpus.env(**variables), ok=False)
    assert quiet["_stderr"] == ""  # quiet without FGPU_FAKE_DEBUG
    assert fake_gpus.probe("nvml-init", env=env)["result"] != 0


def test_racing_first_users_agree_on_one_state_file(fake_gpus: FakeGpus) -> None:
    procs = [fake_gpus.start("--ready", "hold", str(100 * MIB)) for _ in range(6)]
    for proc in procs:
        assert read_json_line(proc)["ready"] == proc.pid
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    held = [read_json_line(proc) for proc in procs]
    assert all(h["result"] == CUDA_SUCCESS for h in held)
    assert fake_gpus.run("meminfo")["free"] == 1024 * MIB - 6 * 100 * MIB
    for proc in procs:
        proc.communicate(timeout=DEADLINE_S)
    assert fake_gpus.run("meminfo")["free"] == 1024 * MIB


# ---------------------------------------------------------------- memory


@pytest.mark.parametrize("entry", ["linked", "dlopen"])
@pytest.mark.parametrize("api", ALL_APIS)
def test_each_allocation_api_takes_device_memory_and_gives_it_back(
    fake_gpus: FakeGpus, api: str, entry: str
) -> None:
    flags = ["--dlopen"] if entry == "dlopen" else []
    out = fake_gpus.run(*flags, "alloc", api, str(64 * MIB))
    assert out["result"] == CUDA_SUCCESS, out
    assert out["free_before"] == 1024 * MIB
    assert out["free_before"] - out["free_during"] == out["size"]
    assert abs(out["size"] - 64 * MIB) <= 64  # mipmaps: three levels summing to about that
    if api == "pool":  # a created pool keeps freed memory until trimmed or destroyed
        assert out["free_after"] == out["free_during"]
    else:
        assert out["free_after"] == out["free_before"]
    assert out["free_end"] == out["free_before"]


@pytest.mark.parametrize("entry", ["linked", "dlopen"])
@pytest.mark.parametrize("api", ALL_APIS)
def test_each_allocation_api_runs_out_at_the_capacity(
    fake_gpus: FakeGpus, api: str, entry: str
) -> None:
    flags = ["--dlopen"] if entry == "dlopen" else []
    chunk = 60 * MIB  # 1024 MiB / 60 MiB: 17 fit, with 4 MiB over
    out = fake_gpus.run(*flags, "alloc-until-oom", api, str(chunk))
    assert (out["result"], out["error"]) == (CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY")
    assert out["count"] == 17
    assert out["free_at_error"] == 1024 * MIB - out["size"]
    assert out["free_at_error"] < chunk
    assert fake_gpus.run("meminfo")["free"] == 1024 * MIB  # all given back at the end


def test_pitch_is_rounded_up_and_arrays_are_sized_from_their_descriptors(
    fake_gpus: FakeGpus,
) -> None:
    pitch = fake_gpus.run("alloc", "pitch", "1000")  # one row of 1000 bytes: pitch 1024
    assert pitch["free_before"] - pitch["free_during"] == 1024
    array = fake_gpus.run("alloc", "array", "1000")  # 1000 x uint8, 1 channel
    assert array["free_before"] - array["free_during"] == 1000
    mipmap = fake_gpus.run("alloc", "mipmap", "7000")  # 1D levels of 4000, 2000, 1000 texels
    assert mipmap["free_before"] - mipmap["free_during"] == 7000


def test_ipc_open_in_another_process_maps_memory_without_taking_more(
    fake_gpus: FakeGpus,
) -> None:
    out = fake_gpus.run("alloc", "ipc", str(100 * MIB))
    child = out["ipc_child"]
    assert child is not None
    assert child["result"] == CUDA_SUCCESS
    assert child["close"] == 0
    assert child["free_before"] == out["free_during"]  # the child sees the owner's memory
    assert child["free_opened"] == child["free_before"]  # opening takes none
    assert child["dptr"] > 0


def test_device_pointers_are_unique_across_processes(fake_gpus: FakeGpus) -> None:
    holders = [fake_gpus.start("hold", str(MIB)) for _ in range(2)]
    try:
        for h in holders:
            assert read_json_line(h)["result"] == CUDA_SUCCESS
        pointers = [fake_gpus.run("alloc", "ipc", str(MIB))["ipc_child"]["dptr"] for _ in range(3)]
        assert len(set(pointers)) == 3
    finally:
        for h in holders:
            h.communicate(timeout=DEADLINE_S)


def test_memory_of_a_process_killed_with_sigkill_comes_back(fake_gpus: FakeGpus) -> None:
    holder = fake_gpus.start("hold", str(600 * MIB))
    held = read_json_line(holder)
    assert held["result"] == CUDA_SUCCESS
    assert fake_gpus.run("alloc", "mem", str(600 * MIB))["result"] == CUDA_ERROR_OUT_OF_MEMORY
    procs = fake_gpus.probe("nvml-procs", GPU_A)["procs"]
    assert [held["pid"], 600 * MIB] in procs
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=DEADLINE_S)
    # the next allocation that would fail sweeps the dead process first
    assert fake_gpus.run("alloc", "mem", str(600 * MIB))["result"] == CUDA_SUCCESS
    assert held["pid"] not in [p[0] for p in fake_gpus.probe("nvml-procs", GPU_A)["procs"]]


def test_nvml_queries_sweep_dead_processes(fake_gpus: FakeGpus) -> None:
    holder = fake_gpus.start("hold", str(300 * MIB), "vmm")
    assert read_json_line(holder)["result"] == CUDA_SUCCESS
    assert fake_gpus.probe("nvml-memory", GPU_A)["used"] == 300 * MIB
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=DEADLINE_S)
    assert fake_gpus.probe("nvml-memory", GPU_A)["used"] == 0


def test_threads_of_one_process_share_the_capacity(fake_gpus: FakeGpus) -> None:
    out = fake_gpus.run("threads", "8", "mem", str(200 * MIB))
    assert (out["ok"], out["oom"], out["other"]) == (5, 3, 0)


# ---------------------------------------------------------------- kernels, streams, events


def test_events_time_kernels_in_stream_order(fake_gpus: FakeGpus) -> None:
    out = fake_gpus.run("events", str(40_000_000))
    assert out["query_before"] == CUDA_ERROR_NOT_READY
    assert out["elapsed_before"] == CUDA_ERROR_NOT_READY
    assert out["query_after"] == CUDA_SUCCESS
    assert out["ms01"] >= 40.0
    assert out["ms12"] >= 40.0
    assert out["ms02"] == pytest.approx(out["ms01"] + out["ms12"], abs=0.01)


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param([], id="cuLaunchKernel"),
        pytest.param(["--ex"], id="cuLaunchKernelEx"),
        pytest.param(["--coop"], id="cuLaunchCooperativeKernel"),
        pytest.param(["--graph"], id="cuGraphLaunch"),
        pytest.param(["--stream"], id="own-stream"),
        pytest.param(["--graph", "--stream"], id="graph-own-stream"),
    ],
)
@pytest.mark.parametrize("entry", [[], ["--dlopen"], ["--ptsz"], ["--dlopen", "--ptsz"]])
def test_launches_run_for_the_asked_time_and_count_as_device_time(
    fake_gpus: FakeGpus, flags: list[str], entry: list[str]
) -> None:
    out = fake_gpus.run(*entry, "spin", str(5_000_000), "8", *flags)
    assert out["launches"] == 8
    assert out["event_ms"] >= 40.0
    assert out["wall_ns"] >= 40_000_000
    device = fake_gpus.probe("devtime", GPU_A, str(out["pid"]))
    assert device["result"] == CUDA_SUCCESS
    assert device["ns"] >= 40_000_000
    assert device["ns"] <= out["wall_ns"] + 1_000_000


def test_two_processes_never_run_kernels_at_the_same_time(fake_gpus: FakeGpus) -> None:
    kernel_ns, count = 20_000_000, 25
    procs = [
        fake_gpus.start("--ready", "spin", str(kernel_ns), str(count), *extra)
        for extra in ([], ["--graph"])
    ]
    for proc in procs:
        assert read_json_line(proc)["ready"] == proc.pid
    total_before = fake_gpus.probe("devtime", GPU_A, "0")["ns"]
    start = time.monotonic()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [read_json_line(proc) for proc in procs]
    wall_ns = (time.monotonic() - start) * 1e9
    for proc in procs:
        proc.communicate(timeout=DEADLINE_S)
    device = [fake_gpus.probe("devtime", GPU_A, str(r["pid"]))["ns"] for r in results]
    total = fake_gpus.probe("devtime", GPU_A, "0")["ns"] - total_before
    assert all(d >= kernel_ns * count for d in device)  # each got all its device time
    assert total == sum(device)
    # one kernel at a time: together they took at least the sum of their device time
    assert wall_ns >= 0.98 * sum(device)
    # and while both ran, the one that finished last waited for the other's kernels
    assert max(r["wall_ns"] for r in results) >= 0.9 * sum(device)


def test_kernels_on_different_devices_run_at_the_same_time(fake_gpus: FakeGpus) -> None:
    kernel_ns, count = 20_000_000, 20
    procs = [
        fake_gpus.start("--device", str(d), "--ready", "spin", str(kernel_ns), str(count))
        for d in (0, 1)
    ]
    for proc in procs:
        assert read_json_line(proc)["ready"] == proc.pid
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [read_json_line(proc) for proc in procs]
    for proc in procs:
        proc.communicate(timeout=DEADLINE_S)
    device = [
        fake_gpus.probe("devtime", uuid, str(r["pid"]))["ns"]
        for uuid, r in zip([GPU_A, GPU_B], results, strict=True)
    ]
    assert all(d >= kernel_ns * count for d in device)
    assert fake_gpus.probe("devtime", GPU_A, "0")["ns"] == device[0]
    assert fake_gpus.probe("devtime", GPU_B, "0")["ns"] == device[1]


def test_a_lock_holder_killed_with_sigkill_does_not_stop_the_device(fake_gpus: FakeGpus) -> None:
    hog = fake_gpus.start("spin", str(2_000_000_000), "5")  # 2 s kernels
    wait_for(lambda: fake_gpus.probe("devtime", GPU_A, "0")["ns"] > 0, "the first kernel to start")
    os.kill(hog.pid, signal.SIGKILL)
    hog.wait(timeout=DEADLINE_S)
    out = fake_gpus.run("spin", str(1_000_000), "3")
    assert out["launches"] == 3


def test_a_lock_holder_stopped_by_a_freezer_does_not_stop_the_device(fake_gpus: FakeGpus) -> None:
    """A real GPU runs a stopped (SIGSTOP, frozen cgroup) process's kernel to its end and goes
    on with the others; the fake's kernel runs in the stopped process's own thread, so the
    others pass it over, and it is charged no device time while stopped."""
    hog = fake_gpus.start("spin", str(2_000_000_000), "5")  # 2 s kernels: stopped mid-kernel
    try:
        wait_for(lambda: fake_gpus.probe("devtime", GPU_A, str(hog.pid))["ns"] > 0, "a kernel")
        os.kill(hog.pid, signal.SIGSTOP)
        wait_for(lambda: stat_state(hog.pid) in "Tt", "the holder to be stopped")
        charged = fake_gpus.probe("devtime", GPU_A, str(hog.pid))["ns"]
        out = fake_gpus.run("spin", str(1_000_000), "3")
        assert out["launches"] == 3
        # at most the slice it was in when stopped (busy time is published per 5 ms slice)
        assert fake_gpus.probe("devtime", GPU_A, str(hog.pid))["ns"] <= charged + 5_000_000
    finally:
        hog.kill()
        hog.wait(timeout=DEADLINE_S)


def stat_state(pid: int) -> str:
    """Field 3 of /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]


def test_device_time_of_an_unknown_device_or_process_is_an_error(fake_gpus: FakeGpus) -> None:
    fake_gpus.run("meminfo")  # creates the state file
    assert fake_gpus.probe("devtime", "GPU-nope", "0")["result"] == CUDA_ERROR_INVALID_DEVICE
    assert fake_gpus.probe("devtime", GPU_A, "999999999")["result"] == CUDA_ERROR_NOT_FOUND


# ---------------------------------------------------------------- cuGetProcAddress


def test_get_proc_address_gives_the_exported_versioned_functions(fake_gpus: FakeGpus) -> None:
    out = fake_gpus.run("procaddr")
    assert out["mismatches"] == []
    assert out["ok"] == out["checked"] > 30
    assert (out["unknown_result"], out["unknown_status"]) == (CUDA_ERROR_NOT_FOUND, 1)
    assert (out["old_result"], out["old_status"]) == (CUDA_ERROR_NOT_FOUND, 2)
    assert out["v1_result"] == CUDA_SUCCESS
    assert out["v1_same"] is True


# ---------------------------------------------------------------- NVML


def test_nvml_reports_memory_and_utilization_per_process(fake_gpus: FakeGpus) -> None:
    holder = fake_gpus.start("hold", str(256 * MIB), "managed")
    held = read_json_line(holder)
    spinner = fake_gpus.start("spin", str(10_000_000), "300")  # about 3 s of kernels
    try:
        procs = dict(map(tuple, fake_gpus.probe("nvml-procs", GPU_A)["procs"]))
        assert procs[held["pid"]] == 256 * MIB
        assert fake_gpus.probe("nvml-memory", GPU_A)["used"] >= 256 * MIB

        def busy() -> bool:
            util = fake_gpus.probe("nvml-util", GPU_A, "0")
            mine = [p for p in util["procs"] if p[0] == spinner.pid]
            return util["gpu"] >= 80 and bool(mine) and mine[0][1] >= 80

        wait_for(busy, "NVML to see the spinning process at 80 % or more")
    finally:
        for proc in (holder, spinner):
            proc.communicate(timeout=DEADLINE_S)
    util = fake_gpus.probe("nvml-util", GPU_A, str(int(time.time() * 1e6) + 10_000_000))
    assert util["first"] == 6
    assert util["procs"] == []


def test_pynvml_backend_works_on_the_fake(fake_gpus: FakeGpus) -> None:
    holder = fake_gpus.start("hold", str(128 * MIB))
    held = read_json_line(holder)
    script = (
        "import json\n"
        "from fgpu.agent.nvml import NvmlBackend\n"
        "b = NvmlBackend()\n"
        "print(json.dumps({'gpus': [[g.uuid, g.model, g.memory_mib] for g in b.gpus()],\n"
        "  'procs': [[p.pid, p.gpu_uuid, p.used_mib] for p in b.process_memory()],\n"
        "  'util': b.utilization()}))\n"
        "b.close()\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            env=fake_gpus.env(),
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=False,
        )
    finally:
        holder.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [g[0] for g in out["gpus"]] == [GPU_A, GPU_B]
    assert [g[2] for g in out["gpus"]] == [1024, 2048]
    assert [held["pid"], GPU_A, 128] in out["procs"]
    assert set(out["util"]) == {GPU_A, GPU_B}


# ---------------------------------------------------------------- sanitizers


def test_fake_driver_and_cudemo_are_clean_under_asan_and_ubsan(
    sanitized_dir: Path, make_fake_gpus: Callable[[str], FakeGpus]
) -> None:
    fake = make_fake_gpus(f"{GPU_A}=A100-80GB:1024")
    fake.native = sanitized_dir
    env = fake.env(
        ASAN_OPTIONS="halt_on_error=1:detect_leaks=1",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
    )
    commands = [
        *(["alloc-until-oom", api, str(100 * MIB)] for api in ALL_APIS),
        ["--dlopen", "--ptsz", "spin", "1000000", "10", "--graph"],
        ["spin", "1000000", "10", "--ex", "--stream"],
        ["events", "5000000"],
        ["threads", "8", "async", str(200 * MIB)],
        ["procaddr"],
    ]
    for args in commands:
        out = fake.run(*args, env=env)
        assert "Sanitizer" not in out["_stderr"], args
        assert "runtime error" not in out["_stderr"], args
    # Python is not built with ASan: its own allocations would read as leaks, so the probes
    # run the fake libraries with leak detection off (memory errors still stop them)
    probe_env = {
        **env,
        "LD_PRELOAD": asan_runtime(),
        "ASAN_OPTIONS": "halt_on_error=1:detect_leaks=0",
    }
    for probe in (["nvml-procs", GPU_A], ["nvml-util", GPU_A, "0"], ["devtime", GPU_A, "0"]):
        fake.probe(*probe, env=probe_env)


def asan_runtime() -> str:
    """The ASan runtime, preloaded into Python (which is not built with it) for the probes."""
    out = subprocess.run(
        ["cc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert os.path.isabs(out), f"no libasan.so found by the compiler: {out!r}"
    return out

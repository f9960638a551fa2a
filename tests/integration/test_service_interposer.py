"""``fgpu serve --fake-driver``: the interposer in the product, end to end, as the README shows.

A real server with one simulated A100-80GB whose workloads run against the fake CUDA driver
with libfgpu preloaded: a CUDA program over its memory cap gets CUDA's out-of-memory error
(and an event says so); two programs share the GPU 70/30 by device time in strict mode; a
workload that turned the interposer off is still stopped by the NVML guard when it goes over
its quota; ``fgpu nodes`` says which enforcement is active and why.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fgpu.agent.fakegpu import device_time as fake_device_time
from fgpu.agent.interposer.preload import default_segment_root
from fgpu.native import ensure_built, lib_dir
from tests.serverproc import ServerProcess, wait_for

GIB = 1 << 30
DEADLINE_S = 90.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    ensure_built()
    srv = ServerProcess(
        tmp_path, "1xA100-80GB", extra=["--fake-driver", "--compute-mode", "strict"]
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.cleanup()


def cudemo(*args: str) -> list[str]:
    return [str(lib_dir() / "bin" / "fgpu-cudemo"), *args]


def events(server: ServerProcess, wid: str) -> list[dict[str, Any]]:
    return list(server.describe(wid)["events"])


def device_time(server: ServerProcess, pids: list[int]) -> dict[int, int]:
    """The fake driver's device time per pid (ns)."""
    state = next(default_segment_root(server.state_dir).glob("fake-gpus-*.state"))
    uuid = server.json("nodes")[0]["gpus"][0]["uuid"]
    return fake_device_time(state, uuid, pids)


def test_the_fake_state_is_open_to_the_workloads_users_only_as_needed(
    server: ServerProcess,
) -> None:
    """A root service runs workloads as their submitters, who must all write the fake
    driver's state (0666, in the 0711 segment folder); a service of one user keeps 0600."""
    state = next(default_segment_root(server.state_dir).glob("fake-gpus-*.state"))
    assert stat.S_IMODE(state.stat().st_mode) == (0o666 if os.geteuid() == 0 else 0o600)
    assert stat.S_IMODE(state.parent.stat().st_mode) == 0o711


def test_nodes_say_which_enforcement_is_active_and_why(server: ServerProcess) -> None:
    gpu = server.json("nodes")[0]["gpus"][0]
    layers = {la["name"]: la for la in gpu["enforcement"]}
    assert list(layers) == ["interposer", "mps-limits", "freezer", "memory-guard"]
    assert layers["interposer"]["active"] is True
    assert "out-of-memory" in layers["interposer"]["why"]
    assert layers["mps-limits"]["active"] is False
    assert "MPS control daemon" in layers["mps-limits"]["why"]
    assert layers["memory-guard"]["active"] is True
    assert "1024 MiB" in layers["memory-guard"]["why"]
    table = server.cli("nodes").stdout
    assert "interposer" in table
    assert "memory-guard" in table


def test_a_cuda_program_over_its_cap_gets_an_ordinary_out_of_memory(
    server: ServerProcess, tmp_path: Path
) -> None:
    """-g 0.25 of an 80 GiB GPU is a 20 GiB cap: allocating 1 GiB at a time, the program gets
    exactly 20 GiB, then CUDA_ERROR_OUT_OF_MEMORY from cuMemAlloc; an event records it."""
    done = tmp_path / "release"
    line = " ".join(cudemo("alloc-until-oom", "mem", str(GIB)))
    wid = server.submit(
        "-g",
        "0.25",
        "--name",
        "capped",
        "--shell",
        command=[f"{line}; while [ ! -e {done} ]; do sleep 0.05; done"],
    )
    wait_for(
        lambda: any(e["kind"] == "memory-refused" for e in events(server, wid)),
        "the memory-refused event",
        DEADLINE_S,
    )
    refused = next(e for e in events(server, wid) if e["kind"] == "memory-refused")
    assert "the last asked 1024 MiB" in refused["message"]
    assert "its quota is 20480 MiB, the most it held 20480 MiB" in refused["message"]
    detail = server.describe(wid)
    assert any("1 allocation(s) refused" in line for line in detail["enforcement"])
    done.touch()
    server.wait_phase(wid, "succeeded", timeout_s=DEADLINE_S)
    out = json.loads(server.cli("logs", "--stdout", wid).stdout.strip().splitlines()[0])
    assert out["bytes"] == 20 * GIB
    assert out["error"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_two_programs_share_the_gpu_70_30_by_device_time(server: ServerProcess) -> None:
    big = server.submit(
        "-g", "0.7", "--name", "big", command=cudemo("spin", "1000000", "100000000")
    )
    small = server.submit(
        "-g", "0.3", "--name", "small", command=cudemo("spin", "1000000", "100000000")
    )
    for wid in (big, small):
        wait_for(
            lambda w=wid: any(
                "interposer:" in line and "launches" in line
                for line in server.describe(w)["enforcement"]
            ),
            f"{wid} launching under the interposer",
            DEADLINE_S,
        )
    wait_for(
        lambda: all(
            h.get("enforcement") == "interposer"
            for h in server.json("nodes")[0]["gpus"][0]["holders"]
        ),
        "the governor holding both at launch",
        DEADLINE_S,
    )
    pids = [server.handle(big)["pgid"], server.handle(small)["pgid"]]
    before = device_time(server, pids)
    time.sleep(8.0)  # the measuring window (its length is not what the test checks)
    after = device_time(server, pids)
    used = [after[p] - before[p] for p in pids]
    share = used[0] / sum(used)
    assert abs(share - 0.7) <= 0.02, used


def test_the_nvml_guard_stops_what_the_interposer_cannot_see(
    server: ServerProcess, tmp_path: Path
) -> None:
    """With FGPU_INTERPOSER=off the workload runs without the interposer: its 30 GiB against a
    20 GiB quota are seen by the fake NVML and the guard stops it."""
    hold = " ".join(cudemo("hold", str(30 * GIB)))
    wid = server.cli(
        "submit",
        "-g",
        "0.25",
        "--name",
        "rogue",
        "--shell",
        "--json",
        "--",
        f"sleep 100000 | {hold}",  # stdin stays open: it holds until stopped
        env_extra={"FGPU_INTERPOSER": "off"},
    ).stdout
    wid = json.loads(wid)["id"]
    detail = server.wait_phase(wid, "failed", timeout_s=DEADLINE_S)
    kinds = [e["kind"] for e in detail["events"]]
    assert "memory-exceeded" in kinds
    exceeded = next(e for e in detail["events"] if e["kind"] == "memory-exceeded")
    assert "used 30720 MiB" in exceeded["message"]
    assert "allowed 20480 MiB" in exceeded["message"]
